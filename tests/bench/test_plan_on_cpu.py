"""``verl-pipe plan``: every mode's layout, knobs and expected step on a cluster, the overrides to paste, and the
errors for clusters it cannot price, each naming the flag."""

from __future__ import annotations

import pytest

from verl_pipe.bench import cluster as clusters
from verl_pipe.bench.plan import (DEFAULT_LAG_TARGET, UNTRAINED_BATCHES, WARMUP_BATCHES, Knobs, Plan, hydra_overrides,
                                  lag_target_arg, plan, simulated_batch)
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


def test_each_mode_trades_its_own_staleness_for_speed_up_to_the_lag_target():
    """separate_async's batches ahead and in_flight_pipeline's groups not yet trained are each mode's staleness:
    with no target both take their stalest, fastest setting; at the default target (one version) each its fastest
    within it (the control: the target binds, so both are slower and fresher there)."""
    for schedule in ("separate_async", "in_flight_pipeline"):
        free, held = _plan(schedule, target=None), _plan(schedule, target=DEFAULT_LAG_TARGET)
        assert held.token_lag <= DEFAULT_LAG_TARGET < free.token_lag and held.meets_lag_target, schedule
        assert free.step_s < held.step_s, schedule
    free = _plan("separate_async", target=None)
    assert free.knobs.warmup_batches == max(WARMUP_BATCHES)
    steady = _plan("in_flight_pipeline", target=DEFAULT_LAG_TARGET)
    assert steady.knobs.max_lag == 2 and 0 < steady.knobs.untrained_batches < max(UNTRAINED_BATCHES)


def test_when_the_fastest_few_miss_the_target_on_every_seed_the_next_are_priced(monkeypatch):
    """One seed's token lag is noisy: settings just inside the target on the first seed can all be outside it on the
    mean of every seed. The planner then prices the next few rather than hand back a setting over the target (the
    control: the fastest overall, over it, is what it would otherwise return)."""
    from verl_pipe.bench import plan as planner
    from verl_pipe.bench.simulate import Estimate

    # (step, lag on seed 0, lag on the other seeds) per cap: the three fastest look fine on seed 0 only
    table = {1.0: (50.0, 0.5, 0.5), 1.25: (45.0, 0.7, 0.7), 1.5: (40.0, 0.98, 1.2), 1.75: (38.0, 0.99, 1.2),
             2.0: (36.0, 0.99, 1.3)}  # fmt: skip

    def fake_simulate(scenario, seed=0, **_):
        step, first, rest = table[scenario.max_untrained / scenario.prompts]
        return Estimate(step_s=step, sampler_busy=0.9, trainer_busy=0.9, token_lag=first if seed == 0 else rest)

    monkeypatch.setattr(planner, "simulate", fake_simulate)
    options = tuple(Knobs(max_lag=2, load_every_update=True, untrained_batches=share) for share in table)
    chosen = plan(MATH, TODAY, "in_flight_pipeline", 8, 8, seeds=3, knob_options=options, max_token_lag=1.0)
    assert chosen.meets_lag_target and chosen.knobs.untrained_batches == 1.25 and chosen.token_lag <= 1.0
    free = plan(MATH, TODAY, "in_flight_pipeline", 8, 8, seeds=3, knob_options=options, max_token_lag=None)
    assert free.knobs.untrained_batches == 2.0


def test_the_lag_target_flag_takes_a_lag_or_none():
    assert lag_target_arg("0.85") == 0.85 and lag_target_arg("none") is None and lag_target_arg("0") == 0.0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ValueError, match="or 'none'"):
            lag_target_arg(bad)


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
    args = hydra_overrides("one_off_pipeline", chosen, gpus_per_node=8, prompts=32, minibatches=2)
    assert "trainer.nnodes=1" in args and "trainer.n_gpus_per_node=8" in args
    assert "actor_rollout_ref.rollout.nnodes=3" in args and "actor_rollout_ref.rollout.n_gpus_per_node=8" in args
    lagging = hydra_overrides("in_flight_pipeline", Plan("in_flight_pipeline", chosen.layout,
                                                          Knobs(load_every_update=True), 1.0), 8, 32, 2)  # fmt: skip
    assert "+trainer.v1.in_flight_pipeline.load_every_update=true" in lagging
    assert not any("max_untrained_prompts" in arg for arg in lagging)  # the bound's own
    capped = hydra_overrides("in_flight_pipeline", Plan("in_flight_pipeline", chosen.layout, Knobs(
        load_every_update=True, max_lag=2, untrained_batches=1.25), 1.0), 8, 32, 2)  # 1.25 of 32 prompts
    assert "+trainer.v1.in_flight_pipeline.max_untrained_prompts=40" in capped
    assert "+trainer.v1.in_flight_pipeline.max_lag=2" in capped
    separate = hydra_overrides("separate_async", Plan("separate_async", chosen.layout, Knobs(sync_every=1), 1.0),
                               8, 32, 2)  # fmt: skip
    assert "trainer.v1.separate_async.parameter_sync_step=1" in separate
    assert "trainer.v1.separate_async.num_warmup_batches=2" in separate  # a batch ahead, in its minibatch steps
    once = hydra_overrides("separate_async", Plan("separate_async", chosen.layout, Knobs(warmup_batches=0.75), 1.0),
                           8, 32, 2)  # fmt: skip
    assert "trainer.v1.separate_async.parameter_sync_step=2" in once
    assert "trainer.v1.separate_async.num_warmup_batches=0.75" in once


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
        (["--lag-target", "-1"], "--lag-target takes a token lag in policy versions (>= 0) or 'none', got '-1'"),
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


def test_ours_are_held_to_verls_lag_only_where_it_is_below_the_target():
    from verl_pipe.bench.plan import held_to_verl_lag

    assert held_to_verl_lag(1.0, 0.95) == 0.95
    assert held_to_verl_lag(1.0, 1.2) == 1.0  # verl staler than the target: the target holds
    assert held_to_verl_lag(None, 0.95) == 0.95 and held_to_verl_lag(1.0, None) == 1.0
    assert held_to_verl_lag(None, None) is None
