"""The what-if schedule model: the relations ``make bench`` measured, and the trade-offs it prices, on the same draws."""

from __future__ import annotations

import pytest

from verl_pipe.bench.schedule_model import ScheduleOptions, simulate


@pytest.fixture(scope="module")
def lag_one():
    return simulate(ScheduleOptions())


def test_the_default_schedule_sits_where_make_bench_measured_it(lag_one):
    # make bench, coding profile (2026-11-25/26 runs): 3.72-4.12 s per step, token lag 0.93, sampler busy 91-95%
    assert 3.5 < lag_one.step_s < 4.3
    assert 0.88 < lag_one.token_lag <= 1.0
    assert 0.85 < lag_one.sampler_busy < 1.0


def test_a_looser_bound_buys_speed_with_lag(lag_one):
    lag_two = simulate(ScheduleOptions(max_lag=2))
    assert lag_two.step_s < 0.85 * lag_one.step_s  # make bench: 2.91 s against 3.72
    assert 1.5 < lag_two.token_lag <= 2.0
    assert lag_two.sampler_busy > lag_one.sampler_busy


def test_an_aborting_sync_pays_its_re_prefill_at_the_same_lag(lag_one):
    aborting = simulate(ScheduleOptions(aborting_sync=True, deadline_first=False))
    assert aborting.step_s > lag_one.step_s
    assert aborting.token_lag == pytest.approx(lag_one.token_lag, abs=0.02)


def test_a_load_per_minibatch_trades_a_stall_for_fresher_tokens(lag_one):
    per_minibatch = simulate(ScheduleOptions(load_every_minibatch=True))
    assert per_minibatch.token_lag < lag_one.token_lag - 0.05
    assert per_minibatch.step_s > lag_one.step_s  # each load stalls the replica and the trainer for a sync


def test_the_model_is_deterministic(lag_one):
    assert simulate(ScheduleOptions()) == lag_one


def test_negative_control_a_free_re_prefill_makes_the_abort_cost_nothing(lag_one, monkeypatch):
    """The abort's price is the re-prefill: with cut requests resuming for free, it is the in-flight schedule."""
    import verl_pipe.bench.schedule_model as schedule_model

    def cut_for_free(run):
        for request in list(run.replica.running):
            run.replica.running.remove(request)
            request.prefix = 0
            run.replica.waiting.append(request)
        run.replica._fill()

    monkeypatch.setattr(schedule_model._Run, "cut_and_requeue", cut_for_free)
    aborting = simulate(ScheduleOptions(aborting_sync=True, deadline_first=False))
    assert not aborting.step_s > lag_one.step_s


def test_staged_loads_take_the_stall_off_the_sampler(lag_one):
    """Weights received beside decoding (a second buffer, priced as KV room) stall nothing: a shorter step, and a
    slightly staler token mix (the new version starts when the transfer ends, not when it begins)."""
    staged = simulate(ScheduleOptions(staged_loads=True))
    assert staged.step_s < lag_one.step_s
    assert lag_one.token_lag <= staged.token_lag < lag_one.token_lag + 0.05
