"""Rule-based code reward for verl, installed as ``verl_pipe.reward_score``.

Point verl's custom reward at :func:`compute_score` by package name (loading by file path breaks the
package's relative imports in Ray workers)::

    reward.custom_reward_function.path=pkg://verl_pipe.reward_score
    reward.custom_reward_function.name=compute_score
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .extract import extract_last_python_block
from .grading import DEFAULT_TIMEOUT_S, grade, parse_tests

__all__ = ["KNOWN_DATA_SOURCES", "compute_score", "extract_last_python_block"]

# Sources whose ground truth is a list of LiveCodeBench-format tests.
KNOWN_DATA_SOURCES = ("verl_pipe/easy_code", "livecodebench")


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str | Sequence[Any],
    extra_info: dict[str, Any] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    format_penalty: float = 0.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """Score one response: 1.0 if its last Python block passes every test, else 0.0.

    ``ground_truth`` is the tests JSON string (or the decoded list). Functional tests need
    ``extra_info["func_name"]``. A response without a code block scores ``format_penalty``. Every value
    in the returned dict is a scalar so verl can aggregate it as ``reward_extra_info``.

    >>> tests = '[{"input": "2 3\\\\n", "output": "5\\\\n", "testtype": "stdin"}]'
    >>> answer = "```python\\na, b = map(int, input().split())\\nprint(a + b)\\n```"
    >>> result = compute_score("verl_pipe/easy_code", answer, tests)
    >>> result["score"], result["outcome"], result["tests_run"]
    (1.0, 'pass', 1)
    """
    if data_source not in KNOWN_DATA_SOURCES:
        raise ValueError(
            f"unknown data_source {data_source!r}; verl_pipe.reward_score knows {list(KNOWN_DATA_SOURCES)}"
        )
    start = time.monotonic()
    # Parse (and validate) before looking at the response, so a broken dataset row fails loudly every time
    # instead of only when the policy happens to emit code.
    tests = parse_tests(ground_truth)
    func_name = str((extra_info or {}).get("func_name") or "")
    if tests[0]["testtype"] == "functional" and not func_name:
        raise ValueError("functional tests need extra_info['func_name'] to know which function to call")
    code = extract_last_python_block(solution_str or "")
    if code is None:
        return {
            "score": float(format_penalty),
            "passed": False,
            "tests_run": 0,
            "tests_total": len(tests),
            "outcome": "format_error",
            "format_ok": False,
            "time_s": time.monotonic() - start,
        }
    result = grade(code, tests, func_name=func_name, timeout=timeout)
    return {
        "score": 1.0 if result.passed else 0.0,
        "passed": result.passed,
        "tests_run": result.tests_run,
        "tests_total": result.tests_total,
        "outcome": result.outcome,
        "format_ok": True,
        "time_s": time.monotonic() - start,
    }
