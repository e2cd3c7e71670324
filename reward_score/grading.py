"""Grade one program against its :class:`~.suites.TestSuite` in the sandbox, LiveCodeBench's way.

* Binary: the program passes iff every selected test passes; grading stops at the first failure.
* stdin tests: LiveCodeBench's official rule (:func:`stdout_matches`). A program that crashes after printing
  the right output fails; ``sys.exit()`` ends a stdin program normally (LiveCodeBench catches SystemExit).
* functional tests: the return value, a returned tuple made a list (top level only, as LiveCodeBench does),
  must ``==`` the expected JSON value. APPS/TACO-style suites also accept the expected value unwrapped from its
  one-element list, as their own harness does (a documented per-source deviation).
* assert tests (HumanEval, MBPP, KodCode): pass only if the check ran to completion; ``sys.exit(0)``,
  ``os._exit(0)`` or an exit hook before that is a failure.

Deliberate deviations from LiveCodeBench's in-process harness, each tested: programs run as a real
``__main__`` module with real stdin/stdout file descriptors (LCB wraps the code in a function and patches
``sys.stdin``, which breaks correct programs that use ``global`` or ``sys.stdin.buffer``), and the timeout is
enforced on wall-clock time per test with a kill of the whole process tree.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .prelude import prelude_for
from .sandbox import DeadlineExceeded, RunnerDied, SandboxConfig, SandboxError, SandboxSession, TestRun
from .suites import TestCase, TestSuite

PASS, WRONG_ANSWER, RUNTIME_ERROR, TIMEOUT = "pass", "wrong_answer", "runtime_error", "timeout"
COMPILE_ERROR, FORMAT_ERROR, SANDBOX_ERROR = "compile_error", "format_error", "sandbox_error"
# The reward itself failed on this sample (a bug of ours, or a deadline); scored 0, never dropped from training.
INTERNAL_ERROR = "internal_error"
OUTCOMES = (PASS, WRONG_ANSWER, RUNTIME_ERROR, TIMEOUT, COMPILE_ERROR, FORMAT_ERROR, SANDBOX_ERROR, INTERNAL_ERROR)

# Bounded cost per sample: a program longer than this is not compiled anywhere (a compile_error); real
# solutions are a few KiB, and compiling costs hundreds of bytes of memory per byte of source.
MAX_PROGRAM_BYTES = 256 << 10
# stdout that comes back from a stdin test: enough for any output that can still match (LiveCodeBench compares
# stripped lines; a match is at most a few times longer than the expected text), never the whole 32 MiB cap.
MIN_OUTPUT_CAP_BYTES = 1 << 20

DEFAULT_TIMEOUT_S = 6.0
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 12.0


@dataclass(frozen=True)
class GradingConfig:
    timeout_s: float = DEFAULT_TIMEOUT_S  # per test
    # Whole-program budget; None means LiveCodeBench's (timeout + 1) * tests + 5.
    deadline_s: float | None = None
    max_tests: int | None = 15  # for TACO / APPS / CodeContests / PrimeIntellect / Codeforces

    def __post_init__(self) -> None:
        if not MIN_TIMEOUT_S <= float(self.timeout_s) <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout must be within [{MIN_TIMEOUT_S:g}, {MAX_TIMEOUT_S:g}] s, got {self.timeout_s}")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive, got {self.deadline_s}")
        if self.max_tests is not None and self.max_tests < 1:
            raise ValueError(f"max_tests must be >= 1 (or None for all tests), got {self.max_tests}")

    def deadline_for(self, n_tests: int) -> float:
        if self.deadline_s is not None:
            return float(self.deadline_s)
        return (self.timeout_s + 1.0) * n_tests + 5.0


@dataclass(frozen=True)
class GradeResult:
    passed: bool
    outcome: str
    tests_run: int
    tests_total: int
    detail: str = ""


# stdout_matches bounds its work before any numeric parsing, so a hostile output costs time linear in its size:
# a line longer than this is compared as text only. A correct program prints the expected text; the numeric
# leniency ("0.50" == "0.5") is for normal lines. 1 MiB: the stdout the host brings back (output_cap) is no
# bigger unless the expected output itself is over 256 KiB.
MAX_NUMERIC_LINE_CHARS = 1 << 20
# A token longer than this is not parsed: if it is written as a number, it equals only the same text. Python
# refuses to print an int of over 4300 digits unless the program lifts that limit, so real answers fit.
MAX_NUMERIC_TOKEN_CHARS = 5_000
# A returned value nested deeper than this decodes to a value equal to nothing; the runner refuses to encode
# one deeper than 200 levels, and equal values are nested equally deep.
MAX_VALUE_DEPTH = 256

# Decimal's syntax for finite numbers, for tokens too long to parse. Unambiguous, so it cannot backtrack
# more than linearly; it leaves out Decimal's underscores (no real output has a 5000-character grouped number).
_LONG_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal | str] | None:
    """The line's tokens as numbers, or ``None`` where they cannot be compared as numbers: a token that is not
    a number, a NaN (quiet ones equal nothing, so the line could never match; signalling ones raise on
    comparison), or a line over :data:`MAX_NUMERIC_LINE_CHARS`. A token over :data:`MAX_NUMERIC_TOKEN_CHARS`
    written as a finite number is kept as text, equal only to the same text."""
    if len(line) > MAX_NUMERIC_LINE_CHARS:
        return None
    values: list[Decimal | str] = []
    for token in line.split():
        if len(token) > MAX_NUMERIC_TOKEN_CHARS:
            if _LONG_NUMBER.fullmatch(token) is None:
                return None
            values.append(token)  # a str never equals a Decimal
            continue
        try:
            value = Decimal(token)
        except (ArithmeticError, ValueError):  # InvalidOperation is an ArithmeticError
            return None
        if value.is_nan():  # also what a context without the InvalidOperation trap returns for "abc"
            return None
        values.append(value)
    return values


def stdout_matches(got: str, want: str) -> bool:
    """LiveCodeBench's stdin rule: strip, split lines, strip each; same count; each line equal as text or as a
    list of decimals (``0.50`` == ``0.5``, no tolerance).

    Total and linear-time on any strings: a line that cannot be compared as numbers (a NaN of either kind, a
    line over :data:`MAX_NUMERIC_LINE_CHARS`) matches only the same text, never raises; a token over
    :data:`MAX_NUMERIC_TOKEN_CHARS` is compared as text.

    >>> stdout_matches("1.0 2\\r\\n", "1.00 2")
    True
    >>> stdout_matches("1", "2")
    False
    >>> stdout_matches("sNaN", "-sNaN"), stdout_matches("sNaN", "sNaN")
    (False, True)
    """
    got_lines, want_lines = _stripped_lines(got), _stripped_lines(want)
    if len(got_lines) != len(want_lines):
        return False
    for a, b in zip(got_lines, want_lines, strict=True):
        if a == b:
            continue
        da, db = _decimals(a), _decimals(b)
        if da is None or db is None or da != db:
            return False
    return True


class _Opaque:
    """A returned value with no JSON counterpart (a set, an object, one nested too deeply): equal to nothing."""

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None


def decode_value(encoded: Any, _depth: int = 0) -> Any:
    """Inverse of the runner's ``encode_value``.

    Depth-bounded: whatever sits deeper than :data:`MAX_VALUE_DEPTH` levels decodes to an :class:`_Opaque`,
    so a hostile value costs at most that many stack frames here and never equals an expected value. A
    malformed encoding raises ``TypeError`` or ``ValueError``.
    """
    if _depth > MAX_VALUE_DEPTH:
        return _Opaque("nested too deeply")
    if isinstance(encoded, list):
        return [decode_value(item, _depth + 1) for item in encoded]
    if isinstance(encoded, dict):
        if "__tuple__" in encoded:
            return tuple(decode_value(item, _depth + 1) for item in encoded["__tuple__"])
        if "__dict__" in encoded:
            return _decode_dict(encoded["__dict__"], _depth)
        other = encoded.get("__other__", "")
        # Only a description: str() of an arbitrary (deep, huge) JSON value could itself raise or cost.
        return _Opaque(other if isinstance(other, str) else type(other).__name__)
    return encoded


def _decode_dict(pairs: Any, depth: int) -> Any:
    """A returned dict, decoded without hashing what the program chose: an expected value is JSON, whose dict keys are
    strings, so a dict with any other key can equal nothing and stays opaque. (Hashing its keys would let a program
    make the caller's work quadratic: ints that all collide in Python's hash, 6.8 s for one call.) String keys hash
    under Python's per-process random seed, so colliding ones cannot be chosen."""
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                                              for p in pairs):  # fmt: skip
        return _Opaque("a dict with a key that is not a string")
    return {key: decode_value(item, depth + 1) for key, item in pairs}


# The caller decodes a returned value only within a budget proportional to the expected one: a value that can
# still be equal is at most this many times bigger, in bytes and in JSON nodes, than the expected value's own
# JSON (the runner's encoding wraps tuples and dicts, ~3x), plus a floor for small answers. Without it a few
# hundred bytes of program could make the caller decode up to the sandbox's 16 MiB result cap: gigabytes and
# seconds of the scoring process's own CPU, outside every sandbox limit.
RESULT_BUDGET_FACTOR = 8
RESULT_BUDGET_MIN_BYTES = 4096
RESULT_BUDGET_MIN_NODES = 256


@dataclass(frozen=True)
class ResultBudget:
    max_bytes: int
    max_nodes: int

    @staticmethod
    def nodes(json_text: str) -> int:
        """An upper bound on the values a JSON text holds, counted in C without parsing it."""
        return json_text.count("[") + json_text.count("{") + json_text.count(",") + 1


def result_budget(test: TestCase) -> ResultBudget:
    expected = json.dumps(test.expected)
    return ResultBudget(
        max_bytes=max(RESULT_BUDGET_MIN_BYTES, RESULT_BUDGET_FACTOR * len(expected.encode("utf-8", "surrogatepass"))),
        max_nodes=max(RESULT_BUDGET_MIN_NODES, RESULT_BUDGET_FACTOR * ResultBudget.nodes(expected)),
    )


def return_value_matches(result_json: str | None, test: TestCase) -> bool:
    """Whether the runner's encoded return value equals the expected one. Total: a result that cannot be
    decoded or compared (over its :func:`result_budget`, malformed, nested deeper than the JSON parser or
    :data:`MAX_VALUE_DEPTH` allows) is simply not equal; one over budget is rejected before any decoding."""
    if result_json is None:
        return False
    budget = result_budget(test)
    if len(result_json) > budget.max_bytes or ResultBudget.nodes(result_json) > budget.max_nodes:
        return False
    try:
        got = decode_value(json.loads(result_json))
    except (ValueError, TypeError, KeyError, RecursionError):  # RecursionError: json.loads of "[[[[..."
        return False
    expected = test.expected
    try:
        if got == expected:
            return True
        # APPS/TACO store a call's return value wrapped in a one-element list; only that wrapper comes off (their
        # harness unwraps the first element of any list, so a constant passed a multi-element answer)
        return bool(test.accept_unwrapped and isinstance(expected, list) and len(expected) == 1 and got == expected[0])
    except RecursionError:  # == on nested lists recurses in C; both sides are depth-bounded, this is a backstop
        return False


def _verdict(run: TestRun, suite: TestSuite, test: TestCase) -> str:
    if run.timed_out:
        return TIMEOUT
    if not run.completed:
        # A failed assert is the check rejecting the answer; anything else is the program breaking.
        return WRONG_ANSWER if suite.mode == "assert" and run.error_type == "AssertionError" else RUNTIME_ERROR
    if suite.mode == "stdin":
        if run.stdout_truncated or not stdout_matches(run.stdout, test.expected):
            return WRONG_ANSWER
    elif suite.mode == "functional" and not return_value_matches(run.result, test):
        return WRONG_ANSWER
    return PASS


def output_cap(test: TestCase) -> int:
    """Bytes of stdout worth bringing back for ``test``: more than this cannot match the expected output."""
    expected = test.expected if isinstance(test.expected, str) else ""
    return max(MIN_OUTPUT_CAP_BYTES, 4 * len(expected.encode("utf-8", "surrogatepass")) + 4096)


def grade(code: str, suite: TestSuite, cfg: GradingConfig | None = None, sandbox: SandboxConfig | None = None
          ) -> GradeResult:  # fmt: skip
    """Run ``code`` on ``suite`` in one sandbox; stop at the first failing test.

    Whose fault is it: everything that happens once the program is in the sandbox (a compile failure of any
    kind, a crash, a runner killed by what the program did) is the program's outcome. ``sandbox_error`` is
    left only for a sandbox that failed before it was handed the program, which the program cannot cause:
    if a fresh sandbox then runs a known-good program (:func:`sandbox_works`), the program gets a second try.
    """
    cfg = cfg or GradingConfig()
    if len(code.encode("utf-8", "surrogatepass")) > MAX_PROGRAM_BYTES:
        return GradeResult(False, COMPILE_ERROR, 0, len(suite.tests), f"program over {MAX_PROGRAM_BYTES} bytes")
    result = _grade_once(code, suite, cfg, sandbox)
    if result.outcome == SANDBOX_ERROR and sandbox_works(sandbox):
        result = _grade_once(code, suite, cfg, sandbox)  # the failure was transient: the program gets its try
    return result


_KNOWN_GOOD = "print(int(input()) + 1)"


def sandbox_works(sandbox: SandboxConfig | None) -> bool:
    """Whether a fresh sandbox of this config runs a known-good program correctly: the proof behind every
    ``sandbox_error``."""
    try:
        with SandboxSession(sandbox, deadline=time.monotonic() + 30.0) as box:
            if box.load(_KNOWN_GOOD, mode="stdin") is not None:
                return False
            run = box.run_test(stdin="41\n", timeout=5.0)
            return run.completed and run.stdout.strip() == "42"
    except (SandboxError, RunnerDied, DeadlineExceeded, OSError):
        return False


def _grade_once(code: str, suite: TestSuite, cfg: GradingConfig, sandbox: SandboxConfig | None) -> GradeResult:
    total = len(suite.tests)
    deadline = time.monotonic() + cfg.deadline_for(total)
    tests_run = 0
    handed_over = False
    try:
        with SandboxSession(sandbox, deadline=deadline) as box:
            handed_over = True  # from the load request on, a broken sandbox is the program's doing
            error = box.load(code, mode=suite.mode, prelude=prelude_for(code, suite.prelude),
                             func_name=suite.func_name, timeout=cfg.timeout_s)  # fmt: skip
            if error is not None:
                return GradeResult(False, COMPILE_ERROR, 0, total, error[:500])
            for test in suite.tests:
                tests_run += 1
                run = box.run_test(stdin=test.stdin, args=test.args, timeout=cfg.timeout_s,
                                   output_cap=output_cap(test) if suite.mode == "stdin" else None,
                                   result_cap=result_budget(test).max_bytes if suite.mode == "functional" else None,
                                   test_code=suite.test_code, entry_point=suite.entry_point,
                                   prompt_code=suite.prompt_code, test_binds=suite.test_binds)  # fmt: skip
                outcome = _verdict(run, suite, test)
                if outcome != PASS:
                    return GradeResult(False, outcome, tests_run, total, run.stderr[-500:])
    except DeadlineExceeded:
        return GradeResult(False, TIMEOUT, tests_run, total, "overall deadline exceeded")
    except RunnerDied as error:
        return GradeResult(False, RUNTIME_ERROR, tests_run, total, f"program took the sandbox down: {error}")
    except SandboxError as error:
        if handed_over:
            return GradeResult(False, RUNTIME_ERROR, tests_run, total, f"program broke the sandbox: {error}"[:500])
        return GradeResult(False, SANDBOX_ERROR, tests_run, total, str(error)[:500])
    return GradeResult(True, PASS, total, total)
