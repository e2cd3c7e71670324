"""The what-if model of every schedule: each keeps its mode's defining property, and each option costs what it
should, on the named clusters' latency models."""

from __future__ import annotations

from dataclasses import replace

import pytest

from verl_pipe.bench import cluster as clusters
from verl_pipe.bench.plan import Knobs, plan, scenario
from verl_pipe.bench.simulate import SCHEDULES, Scenario, over_seeds, simulate

CODING = clusters.CLUSTERS["deepcoder-14b"]
TODAY, STAGED = clusters.engine("today"), clusters.engine("staged")
PROMPTS, SAMPLES = 8, 8


def _scenario(schedule: str, sampler_gpus: int = 20, engine=TODAY, **knobs) -> Scenario:
    layout = clusters.colocated(CODING) if schedule == "sync" else clusters.split(CODING, sampler_gpus)
    return scenario(CODING, engine, schedule, layout, Knobs(**knobs), PROMPTS, SAMPLES)


def test_each_schedule_keeps_its_modes_staleness():
    estimates = {name: simulate(_scenario(name), steps=12, warmup_steps=3) for name in SCHEDULES}
    assert estimates["sync"].token_lag == 0 and estimates["minibatch_pipeline"].token_lag == 0  # on-policy
    assert estimates["one_off_pipeline"].token_lag == pytest.approx(1.0)  # exactly one version behind
    assert 0 < estimates["in_flight_pipeline"].token_lag <= 1  # within its bound of 1
    assert 0 < estimates["separate_async"].token_lag < 2
    lag2 = simulate(_scenario("in_flight_pipeline", max_lag=2), steps=12, warmup_steps=3)
    assert estimates["in_flight_pipeline"].token_lag < lag2.token_lag <= 2
    for estimate in estimates.values():
        assert 0 < estimate.sampler_busy <= 1 and 0 < estimate.trainer_busy <= 1


def test_sync_takes_turns_the_separate_pools_overlap():
    """verl's sync generates, then trains, on the same GPUs: its step is the sum of its phases."""
    sync = simulate(_scenario("sync"), steps=8, warmup_steps=2)
    model = _scenario("sync").model
    train = sync.trainer_busy * sync.step_s
    assert sync.step_s > train + model.sync_s  # generation is not hidden
    one_off = simulate(_scenario("one_off_pipeline", sampler_gpus=28), steps=8, warmup_steps=2)
    assert one_off.trainer_busy > 0.5  # its trainer works while the sampler generates


def test_an_aborting_sync_pays_the_prefill_of_what_it_cut():
    """verl's separate_async re-prefills every request its sync aborts; with a free prefill the same schedule is
    faster (the control), and the staged engine, whose abort comes at the end of the transfer, holds no gate."""
    base = _scenario("separate_async", sync_every=1)
    free = replace(base, model=replace(base.model, prefill_tokens_per_s=1e15))
    assert simulate(free, steps=10, warmup_steps=3).step_s < simulate(base, steps=10, warmup_steps=3).step_s


def test_without_its_abort_verls_schedule_saves_the_re_prefill_and_nothing_else():
    """The no-abort what-if (verl's separate_async, each sync an in-flight load) is faster than the real schedule;
    the control: with a free prefill, a resubmission costs nothing and the two take the same time."""
    real = _scenario("separate_async", sync_every=1)
    no_abort = replace(real, abort_on_sync=False)
    assert simulate(no_abort, steps=10, warmup_steps=3).step_s < simulate(real, steps=10, warmup_steps=3).step_s

    def free(what_if: Scenario) -> Scenario:
        return replace(what_if, model=replace(what_if.model, prefill_tokens_per_s=1e15))

    free_real, free_no_abort = (simulate(free(s), steps=10, warmup_steps=3) for s in (real, no_abort))
    assert free_no_abort.step_s == pytest.approx(free_real.step_s, rel=0.01)


def test_a_stalling_load_costs_the_pool_the_transfer_and_a_staged_one_does_not():
    stalling = _scenario("in_flight_pipeline", load_every_update=True)
    slow = replace(stalling, model=replace(stalling.model, sync_s=30.0))
    staged = replace(slow, model=replace(slow.model, staged_loads=True))
    today, what_if = simulate(slow, steps=10, warmup_steps=3), simulate(staged, steps=10, warmup_steps=3)
    assert what_if.sampler_busy > today.sampler_busy  # its replicas never stop for a load
    assert what_if.step_s < today.step_s


def test_estimates_are_deterministic_and_seeds_differ():
    what_if = _scenario("in_flight_pipeline")
    assert simulate(what_if, seed=3, steps=8) == simulate(what_if, seed=3, steps=8)
    summary = over_seeds(what_if, seeds=4, steps=8, warmup_steps=2)
    assert summary.seeds == 4 and summary.step_s_sd > 0


def test_the_planner_picks_the_fastest_split_and_knobs_it_priced():
    chosen = plan(CODING, TODAY, "one_off_pipeline", PROMPTS, SAMPLES, seeds=1, steps=8, warmup_steps=2)
    assert chosen.layout.gpus == CODING.gpus and not chosen.layout.colocated
    for sampler, _ in CODING.splits()[::4]:  # no priced split is faster than the chosen one
        other = scenario(CODING, TODAY, "one_off_pipeline", clusters.split(CODING, sampler), Knobs(), PROMPTS, SAMPLES)
        assert simulate(other, steps=8, warmup_steps=2).step_s >= chosen.step_s * 0.999
    assert plan(CODING, TODAY, "sync", PROMPTS, SAMPLES, seeds=1, steps=6, warmup_steps=2).layout.colocated


def test_a_scenario_refuses_what_its_schedule_cannot_run():
    with pytest.raises(ValueError, match="not one of sync"):
        replace(_scenario("sync"), schedule="colocate_async")
    with pytest.raises(ValueError, match="must split into 3 equal minibatches"):
        replace(_scenario("sync"), minibatches=3)


MATH = clusters.CLUSTERS["deepscaler-1.5b"]


def _steady(untrained_batches: float) -> Scenario:
    """in_flight_pipeline on the math cluster's 4 + 4 split under a bound of 2, its untrained groups capped at a
    share of the batch (0: no cap)."""
    knobs = Knobs(load_every_update=True, max_lag=2, untrained_batches=untrained_batches)
    return scenario(MATH, TODAY, "in_flight_pipeline", clusters.split(MATH, 4), knobs, PROMPTS, SAMPLES)


def test_a_cap_on_the_untrained_groups_holds_and_is_kept_full():
    """The feeder never lets more groups wait than the cap, and refills each place the trainer frees: the groups
    generating or waiting reach the cap every minibatch. The control: without the cap the lag bound of 2 lets
    three batches run."""
    from verl_pipe.bench import simulate as model

    def untrained_at_each_take(what_if: Scenario) -> list[int]:
        seen, take = [], model._take

        def take_and_count(world, count, candidates, order, may_take=lambda picked: True):
            seen.append(len(candidates()))  # untrained, before this minibatch takes its groups
            return take(world, count, candidates, order, may_take)

        model._take = take_and_count
        try:
            simulate(what_if, steps=12, warmup_steps=3)
        finally:
            model._take = take
        return seen

    capped = _steady(1.25)
    assert capped.max_untrained == 10
    counts = untrained_at_each_take(capped)
    assert max(counts) == 10 and min(counts[2:]) == 10, counts  # full at every minibatch after the first step
    uncapped = untrained_at_each_take(_steady(0.0))
    assert max(uncapped) > 10


def test_the_cap_trades_staleness_for_speed():
    """More groups ahead decode more tokens a second and train staler tokens; the lag bound holds."""
    estimates = [simulate(_steady(share), steps=12, warmup_steps=3) for share in (1.0, 1.5, 2.0)]
    steps, lags = [e.step_s for e in estimates], [e.token_lag for e in estimates]
    assert steps == sorted(steps, reverse=True) and lags == sorted(lags), (steps, lags)
    assert 0 < lags[0] and lags[-1] <= 2


def test_verls_warm_up_batches_trade_staleness_for_speed():
    """separate_async's num_warmup_batches: nothing ahead is on-policy and slow, more ahead is faster and staler."""

    def ahead(batches: float):
        knobs = Knobs(warmup_batches=batches)
        return simulate(scenario(MATH, TODAY, "separate_async", clusters.split(MATH, 4), knobs, PROMPTS, SAMPLES),
                        steps=12, warmup_steps=3)  # fmt: skip

    none, one, more = ahead(0.0), ahead(1.0), ahead(1.5)
    assert none.token_lag == pytest.approx(0.0, abs=1e-9)
    assert none.token_lag < one.token_lag < more.token_lag
    assert none.step_s > one.step_s > more.step_s


def test_the_drivers_admission_latency_delays_every_schedules_groups_and_freshens_in_flights_tokens():
    """admission_delay_s: what the CPU benchmark's driver takes to hand a freed place to the replicas (3.9 cluster s on
    math at unit 12). Both schedules get slower; in_flight_pipeline's groups start later under newer weights, so its
    lag falls (measured 0.84 against the undelayed model's 0.88)."""

    def run(schedule: str, knobs: Knobs, delay: float):
        what_if = scenario(MATH, TODAY, schedule, clusters.split(MATH, 4), knobs, PROMPTS, SAMPLES)
        return [simulate(replace(what_if, admission_delay_s=delay), seed=seed, steps=7, warmup_steps=3)
                for seed in range(4)]  # fmt: skip

    steady = Knobs(load_every_update=True, max_lag=2, untrained_batches=1.25)
    for schedule, knobs in (("separate_async", Knobs()), ("in_flight_pipeline", steady)):
        now, late = run(schedule, knobs, 0.0), run(schedule, knobs, 3.9)
        assert all(b.step_s > a.step_s for a, b in zip(now, late)), schedule
        if schedule == "in_flight_pipeline":
            assert sum(b.token_lag for b in late) < sum(a.token_lag for a in now)
    what_if = scenario(MATH, TODAY, "in_flight_pipeline", clusters.split(MATH, 4), steady, PROMPTS, SAMPLES)
    with pytest.raises(ValueError, match="admission_delay_s"):
        replace(what_if, admission_delay_s=-1.0)


def test_no_group_a_step_trains_holds_a_token_newer_than_its_pi_old():
    """Guards: a load between a step's updates reaching groups the same step then trains (a token lag below zero),
    as the trainer's rule before 2026-12-06 allowed. Four minibatches a step, where the model shows it. The
    control: the same steps, with the model blind to which groups a load reached (it neither holds the load nor
    takes those groups last), train groups half a version newer than their pi_old."""
    from verl_pipe.bench import simulate as sim

    steady = Knobs(load_every_update=True, max_lag=2, untrained_batches=1.25)
    what_if = replace(scenario(MATH, TODAY, "in_flight_pipeline", clusters.split(MATH, 4), steady, PROMPTS, SAMPLES),
                      minibatches=4)  # fmt: skip
    newest = sim._World.newest_version

    def newest_trained(blind: bool) -> list[float]:
        """Per seed, the most any trained group's newest token was ahead of its step's pi_old."""
        ahead = []
        for seed in range(4):
            world = sim._World(what_if, seed)
            if blind:
                world.newest_version = lambda key: -1.0
            worst = [-1.0]

            def record(step, keys, pi_old, world=world, worst=worst):
                worst[0] = max([worst[0]] + [newest(world, key) - pi_old for key in keys])
                world.forget(keys)

            sim._in_flight(world, 10, record)
            ahead.append(worst[0])
        return ahead

    assert max(newest_trained(blind=False)) <= 0
    assert max(newest_trained(blind=True)) == 0.5
