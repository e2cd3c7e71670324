"""Dynamic sampling's budget and record (trainers/dynamic_sampling.py): which uniform groups the replay buffer may
drop and refill, and what a step's ledger line and metrics say of them. The drop-and-refill itself is verl's,
run end to end in tests/e2e/test_pipelined_trainers_e2e_on_cpu.py."""

from __future__ import annotations

import pytest

from verl_pipe.trainers.dynamic_sampling import DroppedGroup, DynamicSampling, DynamicSamplingConfig


def _sampling(max_num_gen_batches: int, batch_size: int = 4) -> DynamicSampling:
    return DynamicSampling(DynamicSamplingConfig("reward", max_num_gen_batches, batch_size))


def test_unbounded_drops_every_uniform_group():
    sampling = _sampling(0)
    assert sampling.cfg.refills_per_step is None
    assert sampling.within_budget({"a", "b", "c"}, {"a": 1, "b": 1, "c": 1}) == {"a", "b", "c"}


def test_the_budget_is_per_step_and_the_rest_is_kept():
    sampling = _sampling(2, batch_size=2)  # 2 batches of 2 groups per step: 2 refills
    tags = {"a": 1, "b": 1, "c": 1, "d": 2}
    assert sampling.within_budget({"a", "b", "c", "d"}, tags) == {"a", "b", "d"}  # c: step 1's refills are spent
    assert sampling.within_budget({"a", "b", "c"}, tags) == sampling.within_budget({"a", "b", "c"}, tags)  # pure
    sampling.record_drops([DroppedGroup(0, 1.0, 1)])
    assert sampling.within_budget({"b", "c"}, tags) == {"b"}
    sampling.record_drops([DroppedGroup(1, 0.0, 1)])
    assert sampling.within_budget({"c"}, tags) == set()  # the control of the bound: nothing more for step 1
    assert sampling.within_budget({"d"}, tags) == {"d"}  # step 2's own budget is untouched


def test_a_steps_record_names_each_dropped_group_and_counts_them():
    sampling = _sampling(2, batch_size=2)
    sampling.record_drops([DroppedGroup(4, 1.0, 1, response_tokens=30), DroppedGroup(0, 0.0, 1, response_tokens=10)])
    sampling.kept_uniform = 1
    dropped, metrics = sampling.take_step_record(1, trained_tokens=60)
    assert [(g.prompt, g.value) for g in dropped] == [(4, 1.0), (0, 0.0)]
    assert metrics["pipeline/dapo/groups_dropped"] == metrics["pipeline/dapo/refilled"] == 2
    assert metrics["pipeline/dapo/dropped_all_correct"] == metrics["pipeline/dapo/dropped_all_wrong"] == 1
    assert metrics["pipeline/dapo/uniform_kept"] == 1 and metrics["pipeline/dapo/budget_exhausted"] == 1
    # the refill's price: 40 of the 100 response tokens generated for the step were thrown away
    assert metrics["pipeline/dapo/dropped_response_tokens"] == 40
    assert metrics["pipeline/dapo/dropped_token_frac"] == pytest.approx(0.4)
    # the next step starts afresh
    dropped, metrics = sampling.take_step_record(2, trained_tokens=60)
    assert dropped == [] and metrics["pipeline/dapo/groups_dropped"] == 0
    assert metrics["pipeline/dapo/dropped_token_frac"] == 0
    assert metrics["pipeline/dapo/budget_exhausted"] == 0
    assert sampling.refilled == {}


def test_a_step_that_keeps_refilling_is_warned_about():
    sampling = _sampling(0, batch_size=2)
    warnings = sampling.record_drops([DroppedGroup(i, 1.0, 3) for i in range(8)])
    assert len(warnings) == 1 and "step 3 has dropped 8 uniform groups" in warnings[0]
    assert "algorithm.filter_groups.max_num_gen_batches" in warnings[0]
    assert sampling.record_drops([DroppedGroup(9, 1.0, 3)]) == []  # the next warning at 16
