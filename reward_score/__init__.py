"""Rule-based rewards for code and math, installed as ``verl_pipe.reward_score``.

Point verl's custom reward at :func:`compute_score` by package name (loading by file path breaks the
package's relative imports in Ray workers)::

    reward.custom_reward_function.path=pkg://verl_pipe.reward_score
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.format_penalty=-0.1   # optional, see REWARD_KWARGS
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from .extract import extract_last_python_block
from .grading import (
    DEFAULT_TIMEOUT_S,
    FORMAT_ERROR,
    INTERNAL_ERROR,
    OUTCOMES,
    SANDBOX_ERROR,
    GradingConfig,
    grade,
)
from .math_grading import MATH_DATA_SOURCES, is_math_source, score_math
from .sandbox import SandboxConfig, SandboxUnavailable
from .suites import CODE_SOURCES, build_suite
from .problem_tests import resolve_ground_truth

__all__ = ["KNOWN_DATA_SOURCES", "OUTCOMES", "REWARD_KWARGS", "compute_score", "extract_last_python_block"]

KNOWN_DATA_SOURCES = (*CODE_SOURCES, *MATH_DATA_SOURCES, "aime*", "amc*")
# Keyword arguments compute_score accepts (verl passes reward_kwargs through functools.partial).
REWARD_KWARGS = ("timeout", "format_penalty", "max_tests", "deadline_s", "memory_mb", "allow_unisolated", "test_store")
# Passed by verl's reward managers when a reward-model router exists; irrelevant to rule-based scoring.
_VERL_PASSTHROUGH = ("reward_router_address", "reward_model_tokenizer")
RESULT_KEYS = ("score", "passed", "tests_run", "tests_total", "outcome", "format_ok", "sandbox_error", "time_s")

# What a caller reports for a sample whose scoring failed outright (the interleaved manager's guard).
INTERNAL_ERROR_RESULT = {"score": 0.0, "passed": False, "tests_run": 0, "tests_total": 0, "outcome": INTERNAL_ERROR,
                         "format_ok": False, "sandbox_error": False, "time_s": 0.0}  # fmt: skip

logger = logging.getLogger(__name__)
_reported_failures: set[str] = set()
_reported_lock = threading.Lock()


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    format_penalty: float = 0.0,
    max_tests: int | None = 15,
    deadline_s: float | None = None,
    memory_mb: int = 2048,
    allow_unisolated: bool | None = None,
    test_store: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Score one response: 1.0 if it is right, 0.0 if not, ``format_penalty`` when it has no answer to grade.

    Code sources grade the last fenced Python block in the sandbox; math sources grade the last ``\\boxed{}``
    after ``</think>``. ``ground_truth`` may be inline or a ``{"problem_id": ...}`` reference into the test
    store. Every value in the returned dict is a scalar so verl can aggregate it as ``reward_extra_info``:
    ``outcome`` is one of :data:`OUTCOMES`, ``sandbox_error`` flags samples whose score says nothing about the
    program (GRPO+'s environment-failure filter drops them).

    Total in the response: whatever ``solution_str`` holds, the dict comes back within the sample's budget
    (the sandbox deadline, or the math stage's bound). A failure of the reward itself on one response is
    ``internal_error`` (score 0, logged once per kind with its traceback), never an exception. What does raise,
    on every response alike: unknown keyword arguments or data sources, a malformed ground truth, and a
    machine without a working sandbox — problems of the run's set-up, named with their fix.

    >>> tests = '[{"input": "2 3\\\\n", "output": "5\\\\n", "testtype": "stdin"}]'
    >>> answer = "```python\\na, b = map(int, input().split())\\nprint(a + b)\\n```"
    >>> result = compute_score("livecodebench", answer, tests)
    >>> result["score"], result["outcome"], result["tests_run"]
    (1.0, 'pass', 1)
    """
    unknown = sorted(set(kwargs) - set(_VERL_PASSTHROUGH))
    if unknown:
        raise ValueError(
            f"unknown reward_kwargs {unknown}; verl_pipe.reward_score.compute_score accepts {list(REWARD_KWARGS)}"
        )
    start = time.monotonic()
    if not isinstance(solution_str, str):
        solution_str = solution_str.decode("utf-8", "replace") if isinstance(solution_str, bytes) else ""
    if is_math_source(data_source):
        truths = resolve_ground_truth(ground_truth, test_store)
        try:
            result = score_math(solution_str, truths, format_penalty=format_penalty)
        except ValueError as error:
            if "ground truth" in str(error):
                raise  # the dataset row, not the response
            return _internal_error(error, 1, start)
        except Exception as error:  # noqa: BLE001 - one response must never fail the reward step
            return _internal_error(error, 1, start)
        return _result(result["score"], result["outcome"], result["tests_run"], 1, start)
    if str(data_source).lower() not in CODE_SOURCES:
        raise ValueError(
            f"unknown data_source {data_source!r}; verl_pipe.reward_score knows {list(KNOWN_DATA_SOURCES)}"
        )
    grading = GradingConfig(timeout_s=float(timeout), deadline_s=deadline_s, max_tests=max_tests)
    # Parse (and validate) before looking at the response, so a broken dataset row fails loudly every time
    # instead of only when the policy happens to emit code.
    suite = build_suite(data_source, resolve_ground_truth(ground_truth, test_store), extra_info, grading.max_tests)
    sandbox = SandboxConfig.from_env(
        memory_mb=int(memory_mb), **({} if allow_unisolated is None else {"allow_unisolated": bool(allow_unisolated)})
    )
    try:
        code = extract_last_python_block(solution_str)
        if code is None:
            return _result(float(format_penalty), FORMAT_ERROR, 0, len(suite.tests), start)
        # A machine without a working sandbox raises SandboxUnavailable here: a problem to fix, never a silent 0.
        graded = grade(code, suite, grading, sandbox)
    except SandboxUnavailable:
        raise
    except Exception as error:  # noqa: BLE001 - one response must never fail the reward step
        return _internal_error(error, len(suite.tests), start)
    return _result(1.0 if graded.passed else 0.0, graded.outcome, graded.tests_run, graded.tests_total, start)


def _internal_error(error: BaseException, tests_total: int, start: float) -> dict[str, Any]:
    """Score 0 with outcome ``internal_error``; the first failure of each kind is logged with its traceback."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = f"{frame.tb_frame.f_code.co_filename}:{frame.tb_lineno}" if frame is not None else "?"
    kind = f"{type(error).__name__} at {where}"
    with _reported_lock:
        first = kind not in _reported_failures
        _reported_failures.add(kind)
    if first:
        logger.error("verl-pipe reward: internal error (%s) on one response, scored 0 as %s; further errors of "
                     "this kind are not logged", kind, INTERNAL_ERROR, exc_info=error)  # fmt: skip
    return _result(0.0, INTERNAL_ERROR, 0, tests_total, start)


def _result(score: float, outcome: str, tests_run: int, tests_total: int, start: float) -> dict[str, Any]:
    return {
        "score": float(score),
        "passed": outcome == "pass",
        "tests_run": int(tests_run),
        "tests_total": int(tests_total),
        "outcome": outcome,
        "format_ok": outcome != FORMAT_ERROR,
        "sandbox_error": outcome == SANDBOX_ERROR,
        "time_s": time.monotonic() - start,
    }
