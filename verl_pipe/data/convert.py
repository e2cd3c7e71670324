"""Turn typed problems into verl's RL rows, and write those rows (and the test store) to disk atomically.

A verl RL row is ``{data_source, prompt: [{role, content}], ability, reward_model: {style, ground_truth},
extra_info}``. Code rows carry the tests inline (JSON text in the source's own format, which
``verl_pipe.reward_score`` grades as-is) or, with a test store, a ``{"problem_id": ...}`` reference into it.
Every code row is parsed once by the grader's own suite builder here, so a row the reward function would
reject fails at conversion time, naming its input row, instead of hours into a run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .prompts import lcb_style_prompt, math_prompt
from .schema import CodeProblem, DataError, MathProblem

if TYPE_CHECKING:
    from verl_pipe.reward_score.suites import TestSuite

VERL_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def parse_suite(problem: CodeProblem) -> TestSuite:
    """The grader's view of ``problem.tests`` (every test, no cap); a :class:`DataError` names the bad row."""
    # Deferred: the reward package imports verl (seconds), and importing verl_pipe.data must stay cheap.
    from verl_pipe.reward_score.suites import build_suite

    func_name = str(problem.metadata_dict().get("func_name") or "")
    try:
        return build_suite(problem.data_source, problem.tests, {"func_name": func_name}, None)
    except (ValueError, TypeError, KeyError) as error:
        where = problem.origin or problem.problem_id
        raise DataError(f"{where}: field 'tests' cannot be graded as {problem.data_source!r}: {error}") from None


def code_extra_info(problem: CodeProblem, suite: TestSuite, split: str, index: int) -> dict[str, Any]:
    """What the reward function reads besides the ground truth; same keys and types in every row (parquet
    infers one schema per column, and a stray null makes a nullable column verl mishandles)."""
    meta = problem.metadata_dict()
    return {
        "split": split,
        "index": index,
        "problem_id": problem.problem_id,
        "testtype": suite.mode,
        # Functional LiveCodeBench tests name their function only in metadata; TACO/PrimeIntellect in the
        # tests themselves. Either way the grader resolves the same name the prompt shows.
        "func_name": suite.func_name if suite.mode == "functional" else "",
        "starter_code": problem.starter_code,
        # for `verl-pipe eval`'s per-difficulty tables and LiveCodeBench date windows ("" when unknown)
        "difficulty": str(meta.get("difficulty") or ""),
        "contest_date": str(meta.get("contest_date") or ""),
    }


def _starter(problem: CodeProblem, suite: TestSuite) -> str:
    if suite.mode == "functional" and not problem.starter_code.strip():
        # A call-based problem without a stub would get the stdin instructions; name the function instead.
        return f"def {suite.func_name}(*args):\n    "
    return problem.starter_code


def code_row(problem: CodeProblem, split: str, index: int, *, use_store: bool = False) -> dict[str, Any]:
    suite = parse_suite(problem)
    ground_truth = json.dumps({"problem_id": problem.problem_id}) if use_store else problem.tests
    return {
        "data_source": problem.data_source,
        "prompt": [{"role": "user", "content": lcb_style_prompt(problem.problem, _starter(problem, suite))}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": code_extra_info(problem, suite, split, index),
    }


def code_rows(problems: Iterable[CodeProblem], split: str, *, use_store: bool = False) -> list[dict[str, Any]]:
    return [code_row(p, split, i, use_store=use_store) for i, p in enumerate(problems)]


def math_row(problem: MathProblem, split: str, index: int) -> dict[str, Any]:
    return {
        "data_source": problem.data_source,
        "prompt": [{"role": "user", "content": math_prompt(problem.problem)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": problem.answer},
        "extra_info": {"split": split, "index": index, "problem_id": problem.problem_id},
    }


def math_rows(problems: Iterable[MathProblem], split: str) -> list[dict[str, Any]]:
    return [math_row(p, split, i) for i, p in enumerate(problems)]


def write_parquet(rows: list[dict[str, Any]], path: str, chunk_rows: int = 512) -> str:
    """Write verl rows to ``path`` (replacing it) and return the path.

    Rows go out in row groups of ``chunk_rows`` against the first chunk's schema: a column of test JSON can
    exceed the 2 GiB a single Arrow string array holds, and one schema keeps every group readable as one table.
    The file is written beside the target and renamed, so a concurrent reader never sees half a file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp_path = f"{path}.tmp-{os.getpid()}"
    # No rows gives a file with no columns, as pandas wrote for an empty embedded val split.
    schema = pa.Table.from_pylist(rows[:chunk_rows]).schema
    try:
        with pq.ParquetWriter(tmp_path, schema) as writer:
            for start in range(0, len(rows), chunk_rows):
                writer.write_table(pa.Table.from_pylist(rows[start : start + chunk_rows], schema=schema))
            if not rows:
                writer.write_table(pa.Table.from_pylist([], schema=schema))
        os.replace(tmp_path, path)
    finally:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
    return path


def write_store(path: str, problems: Iterable[CodeProblem]) -> int:
    """Build the reward's test store (problem id -> tests) at ``path``, replacing any previous file whole,
    so it holds exactly this dataset; returns the number of problems stored."""
    from verl_pipe.reward_score.problem_tests import write_test_store

    tmp_path = f"{path}.tmp-{os.getpid()}"
    if os.path.exists(tmp_path):
        os.remove(tmp_path)
    try:
        count = write_test_store(tmp_path, ((p.problem_id, p.data_source, p.tests) for p in problems))
        os.replace(tmp_path, path)
    finally:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
    return count
