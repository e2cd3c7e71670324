"""DAPO's dynamic sampling (``algorithm.filter_groups``) in ``minibatch_pipeline`` and in ``in_flight_pipeline`` at lag
bound 0, against verl's own ``sync`` mode with the same setting, the same data (in order) and the same seeds, end to
end through ``python -m verl.trainer.main_ppo`` on the CPU backend.

One prompt per step, so verl's ``sync`` buffer generates one group at a time (its in-flight cap is one batch) and
trains the first informative row of the data at each step, never drawing a surplus it would throw away: the setting
in which verl's choice is defined. Ours must train the same rows, having dropped the same uniform ones (the refill
with larger batches is tests/e2e/test_pipelined_trainers_e2e_on_cpu.py).
"""

from __future__ import annotations

import json
import os

import pytest

from verl_pipe.data.embedded import write_embedded_dataset
from verl_pipe.quickstart import QuickstartConfig, training_overrides

LENGTH_REWARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "length_reward.py")
STEPS = 3

pytestmark = pytest.mark.timeout(1200)


def _run(tmp_path, tiny_model_path, ray_cluster, verl_runner, tail_of, mode: str, *extra: str) -> tuple[dict, dict]:
    run_dir = str(tmp_path / mode)
    cfg = QuickstartConfig(
        data="embedded",
        torch_threads=1,
        model=tiny_model_path,
        mode=mode,
        algorithm="grpo_plus",
        steps=STEPS,
        prompts_per_step=1,
        samples_per_prompt=2,
        max_response_length=24,
        ray_address=ray_cluster,
        validate_at_end=False,
        out_dir=run_dir,
    )
    train_file, val_file = write_embedded_dataset(os.path.join(run_dir, "data"))
    overrides = training_overrides(cfg, tiny_model_path, train_file, val_file, run_dir) + [
        # rows 0-1 and 4-9 make uniform groups, rows 2-3 and 10-11 informative ones (length_reward.py)
        f"reward.custom_reward_function.path={LENGTH_REWARD}",
        "reward.custom_reward_function.name=filter_probe_score",
        "data.shuffle=False",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=reward",
        *extra,
    ]
    rc, steps, log = verl_runner(overrides, run_dir)
    assert rc == 0, tail_of(log)
    metrics = {s["step"]: s["data"] for s in steps if "timing_s/step" in s["data"]}
    assert sorted(metrics) == list(range(1, STEPS + 1)), tail_of(log)
    trained = {}
    for step in range(1, STEPS + 1):
        with open(os.path.join(run_dir, "rollouts", f"{step}.jsonl")) as fh:
            trained[step] = sorted({json.loads(line)["input"] for line in fh})
    return metrics, trained


@pytest.fixture(scope="module")
def verl_sync(tmp_path_factory, tiny_model_path, ray_cluster, verl_runner, tail_of) -> tuple[dict, dict]:
    run = _run(tmp_path_factory.mktemp("dapo"), tiny_model_path, ray_cluster, verl_runner, tail_of, "sync")
    evicted = {step: run[0][step].get("training/filter_groups/evicted_samples", 0) for step in run[0]}
    # verl's filter ran (rows 0-1 before row 2, none before row 3, rows 4-9 before row 10): the comparison bites
    assert evicted == {1: 2, 2: 0, 3: 6}, evicted
    assert len(set(map(tuple, run[1].values()))) == STEPS  # three different rows
    return run


@pytest.mark.parametrize(
    "mode, extra",
    [("minibatch_pipeline", ()), ("in_flight_pipeline", ("+trainer.v1.in_flight_pipeline.max_lag=0",))],
    ids=["minibatch_pipeline", "in_flight_pipeline_lag_0"],
)
def test_at_lag_zero_the_groups_trained_are_verl_syncs(
    tmp_path, tiny_model_path, ray_cluster, verl_runner, tail_of, verl_sync, mode, extra
):
    sync_metrics, sync_trained = verl_sync
    metrics, trained = _run(tmp_path, tiny_model_path, ray_cluster, verl_runner, tail_of, mode, *extra)
    for step in range(1, STEPS + 1):
        evicted = sync_metrics[step].get("training/filter_groups/evicted_samples", 0)
        assert trained[step] == sync_trained[step], f"step {step}"
        assert metrics[step].get("training/filter_groups/evicted_samples", 0) == evicted
        assert metrics[step]["pipeline/dapo/groups_dropped"] == evicted
