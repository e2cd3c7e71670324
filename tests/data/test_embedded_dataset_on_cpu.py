"""The embedded easy-code dataset: schema, parquet export, and that its tests really grade (sandboxed runs)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from verl_pipe.data.embedded import DATA_SOURCE, load_embedded_problems, to_verl_rows, write_embedded_dataset
from verl_pipe.reward_score import compute_score

PROBLEMS = load_embedded_problems()
VERL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def func_name(problem: dict) -> str:
    return json.loads(problem["metadata"]).get("func_name", "")


def score_all(solutions: list[str]) -> list[dict]:
    """Grade solution i against problem i; two workers keep the suite quick without oversubscribing CI."""

    def one(pair: tuple[dict, str]) -> dict:
        problem, code = pair
        return compute_score(DATA_SOURCE, fenced(code), problem["tests"], {"func_name": func_name(problem)})

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, zip(PROBLEMS, solutions, strict=True)))


def test_problem_counts_and_mix():
    """Guards against the data file being truncated or losing one of the two test styles."""
    kinds = [json.loads(p["tests"])[0]["testtype"] for p in PROBLEMS]
    assert len(PROBLEMS) >= 44
    assert kinds.count("stdin") >= 20 and kinds.count("functional") >= 15


def test_schema_matches_deepcoder():
    """Guards against schema drift (decoded lists instead of JSON strings) that DeepCoder-style loaders reject."""
    ids = set()
    for problem in PROBLEMS:
        for key in ("problem", "tests", "starter_code", "metadata", "reference_solution"):
            assert isinstance(problem[key], str), key
        tests, metadata = json.loads(problem["tests"]), json.loads(problem["metadata"])
        assert len(tests) >= 5
        kinds = {t["testtype"] for t in tests}
        assert len(kinds) == 1 and kinds <= {"stdin", "functional"}
        assert all(isinstance(t["input"], str) and isinstance(t["output"], str) for t in tests)
        assert metadata["difficulty"] == "easy" and re.fullmatch(r"vp-easy-\d{3}", metadata["problem_id"])
        ids.add(metadata["problem_id"])
        if kinds == {"functional"}:
            # The stub must declare the very function the grader will call.
            assert f"def {metadata['func_name']}(self" in problem["starter_code"]
            for test in tests:
                json.loads(test["output"])
                [json.loads(line) for line in test["input"].split("\n")]
        else:
            assert problem["starter_code"] == "" and "func_name" not in metadata
    assert len(ids) == len(PROBLEMS)


def test_reference_solutions_pass_every_problem():
    """Guards against unsatisfiable tests: a problem no program can pass only ever gives reward 0."""
    results = score_all([p["reference_solution"] for p in PROBLEMS])
    failures = [
        (json.loads(p["metadata"])["problem_id"], r)
        for p, r in zip(PROBLEMS, results, strict=True)
        if r["score"] != 1.0
    ]
    assert failures == []


def test_wrong_solutions_fail_every_problem():
    """Guards against trivially passable tests, where a constant answer would be rewarded."""
    constant = score_all(["print(0)"] * len(PROBLEMS))
    assert [r["score"] for r in constant] == [0.0] * len(PROBLEMS)
    # A stub with the right name but a wrong value must fail too, so functional tests check return values.
    stubs = [
        f"class Solution:\n    def {func_name(p) or 'unused'}(self, *args):\n        return None" for p in PROBLEMS
    ]
    stub_results = score_all(stubs)
    assert all(r["score"] == 0.0 for r in stub_results)
    functional = [r for p, r in zip(PROBLEMS, stub_results, strict=True) if func_name(p)]
    assert functional and all(r["outcome"] == "wrong_answer" for r in functional)


def test_write_embedded_dataset_parquet(tmp_path):
    """Guards against parquet files verl cannot consume: missing columns, mixed types, leaky or one-sided splits."""
    train_path, val_path = write_embedded_dataset(str(tmp_path))
    train, val = pd.read_parquet(train_path), pd.read_parquet(val_path)
    for frame, split in ((train, "train"), (val, "val")):
        assert list(frame.columns) == VERL_COLUMNS
        assert set(frame["data_source"]) == {DATA_SOURCE} and set(frame["ability"]) == {"code"}
        assert [e["index"] for e in frame["extra_info"]] == list(range(len(frame)))
        assert {e["split"] for e in frame["extra_info"]} == {split}
        for prompt, extra in zip(frame["prompt"], frame["extra_info"], strict=True):
            assert len(prompt) == 1 and prompt[0]["role"] == "user"
            assert "```python" in prompt[0]["content"]
            assert isinstance(extra["func_name"], str) and isinstance(extra["starter_code"], str)
            if extra["testtype"] == "functional":
                assert extra["func_name"] and extra["starter_code"].strip() in prompt[0]["content"]
            else:
                assert extra["func_name"] == "" and "standard input" in prompt[0]["content"]
    assert {e["testtype"] for e in val["extra_info"]} == {"stdin", "functional"}
    train_ids = [e["problem_id"] for e in train["extra_info"]]
    val_ids = [e["problem_id"] for e in val["extra_info"]]
    assert len(set(train_ids + val_ids)) == len(train_ids) + len(val_ids) == len(PROBLEMS)

    # Deterministic and idempotent: rewriting the same directory yields the same split.
    write_embedded_dataset(str(tmp_path))
    assert [e["problem_id"] for e in pd.read_parquet(val_path)["extra_info"]] == val_ids


def test_verl_rows_grade_through_their_own_fields():
    """Guards against rows whose ground_truth/extra_info disagree (e.g. func_name lost) with the reward function."""
    rows = to_verl_rows(PROBLEMS, split="val")
    for problem, row in list(zip(PROBLEMS, rows, strict=True))[::7]:
        result = compute_score(
            row["data_source"],
            fenced(problem["reference_solution"]),
            row["reward_model"]["ground_truth"],
            row["extra_info"],
        )
        assert result["score"] == 1.0, row["extra_info"]["problem_id"]


@pytest.mark.parametrize("fraction", [0.1, 0.5])
def test_split_keeps_both_kinds_in_val(tmp_path, fraction):
    """Guards against small val fractions leaving validation with only one grader path exercised."""
    _, val_path = write_embedded_dataset(str(tmp_path), val_fraction=fraction, seed=3)
    assert {e["testtype"] for e in pd.read_parquet(val_path)["extra_info"]} == {"stdin", "functional"}
