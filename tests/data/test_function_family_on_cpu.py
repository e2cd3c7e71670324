"""The generated function family: enough distinct items, reproducible, and graded by the real reward.

Every reference solution is checked against every test of its item (our own code, run in-process); one item per
family goes through verl's row format and the real sandbox reward. The control: a family's solution written for
other constants must fail (the tests pin the constants, so a policy cannot pass by the template alone).
"""

from __future__ import annotations

import json

import pytest

from verl_pipe.data.embedded import to_verl_rows
from verl_pipe.data.function_family import FAMILIES, generate_function_problems, split_function_problems
from verl_pipe.data.verify import fence
from verl_pipe.reward_score import compute_score

TRAIN, VAL = 200, 120


@pytest.fixture(scope="module")
def split():
    return split_function_problems(TRAIN, VAL)


def _meta(item: dict) -> dict:
    return json.loads(item["metadata"])


def _passes_in_process(solution: str, item: dict) -> bool:
    namespace: dict = {}
    exec(solution, namespace)  # our own reference code, never a model's
    function = getattr(namespace["Solution"](), _meta(item)["func_name"])
    for test in json.loads(item["tests"]):
        arguments = [json.loads(line) for line in test["input"].split("\n")]
        if function(*arguments) != json.loads(test["output"]):
            return False
    return True


def _graded(solution: str, item: dict) -> dict:
    row = to_verl_rows([item], "val")[0]
    return compute_score(row["data_source"], fence(solution), row["reward_model"]["ground_truth"], row["extra_info"])


def test_a_split_has_distinct_items_of_every_family_and_is_reproducible(split):
    train, val = split
    assert (len(train), len(val)) == (TRAIN, VAL)
    ids = [_meta(item)["problem_id"] for item in train + val]
    assert len(set(ids)) == len(ids)
    keys = lambda items: {(m["family"], json.dumps(m["constants"], sort_keys=True)) for m in map(_meta, items)}  # noqa: E731
    assert not keys(train) & keys(val), "a validation item repeats a training item"
    assert {_meta(item)["family"] for item in val} == {family.name for family in FAMILIES}
    assert split_function_problems(TRAIN, VAL) == split
    assert split_function_problems(TRAIN, VAL, seed=1) != split


def test_every_reference_solution_passes_its_own_tests(split):
    train, val = split
    failing = [_meta(item)["problem_id"] for item in train + val if not _passes_in_process(item["reference_solution"], item)]
    assert not failing


def test_one_item_per_family_grades_1_through_the_sandbox_reward(split):
    _, val = split
    for family in FAMILIES:
        item = next(item for item in val if _meta(item)["family"] == family.name)
        result = _graded(item["reference_solution"], item)
        assert result["outcome"] == "pass" and result["score"] == 1.0, (family.name, result)


def test_a_solution_for_other_constants_fails(split):
    train, val = split
    caught = 0
    for family in FAMILIES:
        items = [item for item in val if _meta(item)["family"] == family.name]
        donor = next(item for item in train if _meta(item)["family"] == family.name)
        item = items[0]
        wrong = donor["reference_solution"]
        assert _meta(donor)["constants"] != _meta(item)["constants"]
        in_process = _passes_in_process(wrong, item)
        assert (_graded(wrong, item)["score"] == 1.0) == in_process, family.name  # the sandbox agrees
        caught += not in_process
    assert caught >= len(FAMILIES) - 1, f"the tests let other constants pass in {len(FAMILIES) - caught} families"


def test_asking_for_more_items_than_the_families_hold_names_the_limit():
    with pytest.raises(ValueError, match="distinct items"):
        generate_function_problems(100_000)
    with pytest.raises(ValueError, match="count must be >= 1"):
        generate_function_problems(0)


def test_interleaved_training_items_give_every_batch_one_of_each_family(tmp_path):
    import pandas as pd

    from verl_pipe.data.function_family import interleave_families, write_function_dataset

    def ids(items):
        return [json.loads(item["metadata"])["problem_id"] for item in items]

    train, _ = split_function_problems(200, 120)
    ordered = interleave_families(train)
    assert sorted(ids(ordered)) == sorted(ids(train))  # the same items, reordered
    families = [json.loads(item["metadata"])["family"] for item in ordered]
    rounds = min(families.count(f.name) for f in FAMILIES)
    assert rounds >= 5  # at least the demo's 5 steps of 8 prompts
    for start in range(0, rounds * len(FAMILIES), len(FAMILIES)):
        assert sorted(families[start : start + len(FAMILIES)]) == sorted(f.name for f in FAMILIES), start
    # a run that reads in order (data.shuffle=False) gets that order; a shuffled one keeps the split's order
    in_turn = pd.read_parquet(write_function_dataset(str(tmp_path / "a"), interleave=True)[0])
    as_split = pd.read_parquet(write_function_dataset(str(tmp_path / "b"))[0])
    assert [e["problem_id"] for e in in_turn["extra_info"]] == ids(ordered)
    assert [e["problem_id"] for e in as_split["extra_info"]] == ids(train) != ids(ordered)
