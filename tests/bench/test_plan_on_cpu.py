"""``verl-pipe plan``: every mode's layout, knobs and expected step on a cluster, the overrides to paste, and the
errors for clusters it cannot price, each naming the flag."""

from __future__ import annotations

import pytest

from verl_pipe.bench import cluster as clusters
from verl_pipe.bench.plan import Knobs, Plan, hydra_overrides, plan, simulated_batch
from verl_pipe.cli import main


def test_the_planner_prints_every_mode_and_the_overrides_to_run_it(capsys):
    assert main(["plan", "--cluster", "deepscaler-1.5b", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    for mode in ("sync", "separate_async", "one_off_pipeline", "minibatch_pipeline", "in_flight_pipeline"):
        assert f"\n  {mode} " in out and f"\n  {mode}: " in out  # a row in the table, a line of overrides
    assert "8 colocated" in out and "trainer.v1.trainer_mode=sync actor_rollout_ref.hybrid_engine=True" in out
    assert "+verl_pipe_trainer=in_flight_pipeline" in out and "measured 46% of HBM peak" in out


def test_a_changed_cluster_is_priced_as_given(capsys):
    assert main(["plan", "--cluster", "deepcoder-14b", "--gpus", "16", "--prompts", "16", "--max-len", "8192",
                 "--seeds", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "14b on 16 x h100 (TP-2), 16 prompts x 8 samples" in out and "cap 8192" in out


MATH = clusters.CLUSTERS["deepscaler-1.5b"]
TODAY = clusters.engine("today")


def _plan(schedule: str, target=None) -> Plan:
    return plan(MATH, TODAY, schedule, *simulated_batch(MATH), seeds=2, steps=8, warmup_steps=2, max_token_lag=target)


def test_a_lag_target_plans_the_fastest_setting_within_it():
    """verl's separate_async is fastest syncing once a step; its token lag is then about 0.95. Held to 0.85 it must
    sync after every update, and is slower for it (the control: without the target the faster, staler one wins)."""
    free, held = _plan("separate_async"), _plan("separate_async", target=0.85)
    assert free.knobs.sync_every == 0 and free.token_lag > 0.85 and free.meets_lag_target
    assert held.knobs.sync_every == 1 and held.token_lag <= 0.85 and held.meets_lag_target
    assert held.step_s > free.step_s


def test_a_schedule_that_cannot_reach_the_lag_target_gets_its_least_lagged_setting_marked(capsys):
    one_off = _plan("one_off_pipeline", target=0.5)  # exactly one version behind, whatever the split
    assert not one_off.meets_lag_target and one_off.token_lag > 0.5
    assert main(["plan", "--cluster", "deepscaler-1.5b", "--seeds", "1", "--lag-target", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "fastest setting at token lag <= 0.5" in out
    (row,) = [line for line in out.splitlines() if line.startswith("  one_off_pipeline ")]
    assert "none of its settings is within the lag target" in row


def test_the_overrides_split_pools_into_whole_nodes_when_they_can():
    named = clusters.CLUSTERS["deepcoder-14b"]
    chosen = Plan("one_off_pipeline", clusters.split(named, 24), Knobs(), 1.0)
    args = hydra_overrides("one_off_pipeline", chosen, gpus_per_node=8)
    assert "trainer.nnodes=1" in args and "trainer.n_gpus_per_node=8" in args
    assert "actor_rollout_ref.rollout.nnodes=3" in args and "actor_rollout_ref.rollout.n_gpus_per_node=8" in args
    lagging = hydra_overrides("in_flight_pipeline", Plan("in_flight_pipeline", chosen.layout,
                                                          Knobs(load_every_update=True), 1.0), gpus_per_node=8)  # fmt: skip
    assert "+trainer.v1.in_flight_pipeline.load_every_update=true" in lagging
    separate = hydra_overrides("separate_async", Plan("separate_async", chosen.layout, Knobs(sync_every=1), 1.0), 8)
    assert "trainer.v1.separate_async.parameter_sync_step=1" in separate


def test_the_simulated_batch_keeps_the_load_per_gpu():
    assert simulated_batch(clusters.CLUSTERS["deepcoder-14b"]) == (8, 8)  # 32 x 8 -> 8 x 8, each standing for 4
    assert simulated_batch(clusters.CLUSTERS["deepscaler-1.5b"]) == (8, 8)  # 128 x 8 -> 8 x 8, each for 16
    odd = clusters.with_workload(clusters.CLUSTERS["deepcoder-14b"], prompts=6, samples=16)
    assert simulated_batch(odd) == (2, 16)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu", "tpu"], "gpu='tpu' is not one of ['a100', 'h100', 'h200'] (--gpu)"),
        (["--gpus", "6", "--tp", "4"], "gpus=6 must be a multiple of tp=4 with room for two pools (>= 8) (--gpus, --tp)"),
        (["--model", "70b"], "model shape '70b' is not one of ['1.5b', '14b', '7b']"),
        (["--gpu", "a100"], "no measured roofline for 14b on a100"),
        (["--tp", "1", "--gpu-memory-utilization", "0.3"], "do not fit a TP-1 replica's"),
        (["--engine", "magic"], "engine='magic' is not one of today, staged (--engine)"),
        (["--cluster", "moon"], "cluster='moon' is not one of deepcoder-14b"),
        (["--lag-target", "-1"], "--lag-target must be >= 0 (a token lag in policy versions), got -1.0"),
    ],
)  # fmt: skip
def test_clusters_it_cannot_price_are_refused_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_old_sizing_command_points_to_the_planner(capsys):
    assert main(["bench", "size", "--gpus", "32"]) == 2
    assert "`verl-pipe bench size` is now `verl-pipe plan`" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the control: any other unknown bench command is argparse's to refuse
        main(["bench", "sizes"])
