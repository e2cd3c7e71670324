"""Grade a candidate program against LiveCodeBench-format tests.

Two kinds of tests exist (``testtype``):

* ``stdin``: the program reads the test input from standard input; its standard output is compared with the
  expected output line by line after stripping, with a numeric (``decimal.Decimal``) fallback per line so
  ``1.0`` and ``1.00`` agree. One subprocess per test, stopping at the first failure.
* ``functional``: ``input`` holds one JSON argument per line and ``output`` the JSON of the return value.
  All tests of a problem run in a single subprocess through a small driver that calls
  ``Solution().<func_name>(*args)`` (or a top-level ``<func_name>``), and stops at the first failure.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from .execute import ExecResult, run_program

DEFAULT_TIMEOUT_S = 6.0
SOLUTION_FILE = "solution.py"
PAYLOAD_FILE = "payload.json"
# Passing functional results up to this many characters are re-verified by the parent (see the driver).
RECHECK_LIMIT = 64 * 1024

PASS, WRONG_ANSWER, RUNTIME_ERROR, TIMEOUT = "pass", "wrong_answer", "runtime_error", "timeout"

# `exit()`/`quit()` are installed by the `site` module, which `python -S` skips; models call them often
# enough that leaving them undefined would turn correct programs into runtime errors.
_EXIT_SHIM = "import builtins, sys\nbuiltins.exit = builtins.quit = sys.exit\n"

# runpy keeps `__main__` semantics (guards run) and `from __future__` imports valid, which pasting the
# candidate after a prelude would break.
_STDIN_LAUNCHER = _EXIT_SHIM + f"import runpy\nrunpy.run_path({SOLUTION_FILE!r}, run_name='__main__')\n"

# Names LeetCode-style solutions use without importing them.
_FUNCTIONAL_PRELUDE = """\
from typing import *
import collections, math, itertools, heapq, bisect, functools, string, re, operator, random, sys, copy
from collections import Counter, defaultdict, deque, OrderedDict
from functools import lru_cache, cache, reduce
from itertools import accumulate, combinations, permutations, product
from heapq import heappush, heappop, heapify
from bisect import bisect_left, bisect_right, insort
from math import inf, gcd, sqrt, ceil, floor
"""

# The driver reads everything it needs before the candidate runs, so a solution that changes directory or
# reads stdin cannot interfere. Candidate prints are discarded; results go to the real stdout on lines
# prefixed by a per-run random sentinel. A watchdog thread enforces the per-test timeout (no signals: the
# candidate may install its own handlers); GIL-hogging C loops are caught by the parent's overall deadline.
_FUNCTIONAL_DRIVER = (
    (
        _EXIT_SHIM
        + """\
import io, json, os, threading
with open(PAYLOAD_FILE, encoding="utf-8") as _f:
    _payload = json.load(_f)
with open(SOLUTION_FILE, encoding="utf-8") as _f:
    _source = _f.read()
# The payload holds the expected outputs; do not leave them lying around for the candidate to read.
os.remove(PAYLOAD_FILE)
_real_stdout = sys.stdout
_lock = threading.Lock()
_active = [None]

def _report(record):
    _real_stdout.write(_payload["sentinel"] + json.dumps(record) + "\\n")
    _real_stdout.flush()

def _expire(token, index):
    with _lock:
        if _active[0] is token:
            _report({"index": index, "status": "timeout"})
            os._exit(0)

def _guarded(index, fn):
    # A fresh token per call so a timer that fired just as its call returned cannot kill the next call.
    token = _active[0] = object()
    timer = threading.Timer(_payload["timeout"], _expire, args=(token, index))
    timer.daemon = True
    timer.start()
    try:
        return fn()
    finally:
        with _lock:
            _active[0] = None
        timer.cancel()

class _Sink(io.TextIOBase):
    def write(self, s):
        return len(s)

sys.stdout = _Sink()
_ns = {"__name__": "solution", "__builtins__": builtins}
try:
    exec(_payload["prelude"], _ns)
    _from_prelude = dict(_ns)
    _code = compile(_source, "solution.py", "exec")
    _guarded(0, lambda: exec(_code, _ns))
except BaseException as exc:
    _report({"index": 0, "status": "load_error", "error": repr(exc)[:500]})
    os._exit(0)

def _target():
    name = _payload["func_name"]
    cls = _ns.get("Solution")
    if isinstance(cls, type) and hasattr(cls, name):
        return getattr(cls(), name)
    # A name only the prelude provides (e.g. math.gcd) is not the candidate's answer; the candidate must
    # define or import it itself at module level.
    fn = _ns.get(name)
    if callable(fn) and (fn is not _from_prelude.get(name) or name in _code.co_names):
        return _ns[name]
    raise NameError("no Solution." + name + " or top-level " + name)

for _i, (_args, _expected) in enumerate(_payload["tests"]):
    try:
        _result = _guarded(_i, lambda: _target()(*_args))
    except BaseException as exc:
        _report({"index": _i, "status": "error", "error": repr(exc)[:500]})
        break
    try:
        _output = json.dumps(_result)
    except (TypeError, ValueError) as exc:
        _report({"index": _i, "status": "unserializable", "error": repr(exc)[:500]})
        break
    _ok = json.loads(_output) == _expected
    # Small passing outputs are sent back for the parent to re-check; large ones would overflow the capture
    # cap, so for those the verdict above stands. Wrong outputs are kept (capped) only for debugging.
    _report({"index": _i, "status": "ok" if _ok else "wrong", "output": _output[:RECHECK_LIMIT]})
    if not _ok:
        break
sys.stdout = _real_stdout
"""
    )
    .replace("PAYLOAD_FILE", repr(PAYLOAD_FILE))
    .replace("SOLUTION_FILE", repr(SOLUTION_FILE))
    .replace("RECHECK_LIMIT", str(RECHECK_LIMIT))
)


@dataclass(frozen=True)
class GradeResult:
    passed: bool
    outcome: str
    tests_run: int
    tests_total: int
    detail: str = ""


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _numeric_tokens_equal(got: str, want: str) -> bool:
    got_tokens, want_tokens = got.split(), want.split()
    if len(got_tokens) != len(want_tokens):
        return False
    try:
        return all(Decimal(a) == Decimal(b) for a, b in zip(got_tokens, want_tokens, strict=True))
    except InvalidOperation:
        return False


def stdout_matches(got: str, want: str) -> bool:
    """LiveCodeBench stdout rule: same stripped lines, or lines whose tokens are numerically equal.

    >>> stdout_matches("1.0 2\\n", "1.00 2")
    True
    >>> stdout_matches("1", "2")
    False
    """
    got_lines, want_lines = _stripped_lines(got), _stripped_lines(want)
    if len(got_lines) != len(want_lines):
        return False
    return all(a == b or _numeric_tokens_equal(a, b) for a, b in zip(got_lines, want_lines, strict=True))


def parse_tests(ground_truth: str | Sequence[Any]) -> list[dict[str, str]]:
    """Normalise the ground truth (JSON string or list of dicts) into a non-empty list of test dicts."""
    raw = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else list(ground_truth)
    if not isinstance(raw, list) or not raw:
        raise ValueError("ground_truth must be a non-empty list of LiveCodeBench tests")
    tests = []
    for test in raw:
        if not isinstance(test, dict) or "input" not in test or "output" not in test:
            raise ValueError(f"malformed test (needs 'input' and 'output'): {str(test)[:200]}")
        tests.append(
            {"input": str(test["input"]), "output": str(test["output"]), "testtype": test.get("testtype") or "stdin"}
        )
    kinds = {t["testtype"] for t in tests}
    if not kinds <= {"stdin", "functional"} or len(kinds) != 1:
        raise ValueError(f"tests must all be 'stdin' or all 'functional', got {sorted(kinds)}")
    return tests


def _failure(result: ExecResult) -> str | None:
    if result.timed_out:
        return TIMEOUT
    if result.returncode != 0:
        return RUNTIME_ERROR
    return None


def grade_stdin(code: str, tests: list[dict[str, str]], timeout: float = DEFAULT_TIMEOUT_S) -> GradeResult:
    for index, test in enumerate(tests):
        result = run_program(_STDIN_LAUNCHER, test["input"], timeout, files={SOLUTION_FILE: code})
        outcome = _failure(result)
        if outcome is None and not stdout_matches(result.stdout, test["output"]):
            outcome = WRONG_ANSWER
        if outcome is not None:
            return GradeResult(False, outcome, index + 1, len(tests), result.stderr[-500:])
    return GradeResult(True, PASS, len(tests), len(tests))


def _parse_args(text: str) -> list[Any]:
    # One JSON value per line; blank lines carry no argument (zero-argument functions have empty input).
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def _parse_records(stdout: str, sentinel: str) -> list[dict[str, Any]]:
    """Decode the driver's result lines in order, stopping at the first torn or out-of-place one.

    A line can be torn when output hits the capture cap; everything after it is untrustworthy.
    """
    records: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        if not line.startswith(sentinel):
            continue
        try:
            record = json.loads(line[len(sentinel) :])
            valid = record["index"] == len(records) and isinstance(record["status"], str)
        except (ValueError, TypeError, KeyError):
            valid = False
        if not valid:
            break
        records.append(record)
    return records


def _too_big(record: dict[str, Any]) -> bool:
    output = record.get("output")
    return isinstance(output, str) and len(output) >= RECHECK_LIMIT


def _json_equal(output: Any, expected: Any) -> bool:
    try:
        return isinstance(output, str) and json.loads(output) == expected
    except ValueError:
        return False


def grade_functional(
    code: str, tests: list[dict[str, str]], func_name: str, timeout: float = DEFAULT_TIMEOUT_S
) -> GradeResult:
    expected = [json.loads(t["output"]) for t in tests]
    sentinel = f"@@vp-result-{secrets.token_hex(8)}@@"
    payload = {
        "sentinel": sentinel,
        "func_name": func_name,
        "timeout": timeout,
        "prelude": _FUNCTIONAL_PRELUDE,
        "tests": [[_parse_args(t["input"]), want] for t, want in zip(tests, expected, strict=True)],
    }
    # The in-driver watchdog enforces the per-test limit; this overall deadline is only a backstop.
    overall = timeout * (len(tests) + 1) + 2.0
    result = run_program(
        _FUNCTIONAL_DRIVER, "", overall, files={SOLUTION_FILE: code, PAYLOAD_FILE: json.dumps(payload)}
    )
    records = _parse_records(result.stdout, sentinel)
    total = len(tests)
    for record in records:
        index, status = record["index"], record["status"]
        # Re-check passing verdicts here so the grade does not rest only on code sharing a process with the
        # candidate.
        if status == "ok" and (_json_equal(record.get("output"), expected[index]) or _too_big(record)):
            continue
        outcome = {"wrong": WRONG_ANSWER, "unserializable": WRONG_ANSWER, "timeout": TIMEOUT}.get(status, RUNTIME_ERROR)
        return GradeResult(False, outcome, index + 1, total, str(record.get("error", "")))
    if len(records) == total:
        return GradeResult(True, PASS, total, total)
    # The driver died mid-test (os._exit in the candidate, memory limit, backstop deadline...).
    outcome = _failure(result) or RUNTIME_ERROR
    return GradeResult(False, outcome, min(len(records) + 1, total), total, result.stderr[-500:])


def grade(
    code: str, tests: list[dict[str, str]], func_name: str = "", timeout: float = DEFAULT_TIMEOUT_S
) -> GradeResult:
    """Grade ``code`` on already-parsed ``tests``; functional tests require ``func_name``."""
    if tests[0]["testtype"] == "functional":
        if not func_name:
            raise ValueError("functional tests need extra_info['func_name'] to know which function to call")
        return grade_functional(code, tests, func_name, timeout)
    return grade_stdin(code, tests, timeout)
