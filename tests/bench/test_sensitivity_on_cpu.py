"""The sensitivity table's no-abort bound: each row prices verl's separate_async with its sync an in-flight load,
tuned like the real one, and the table prints the real one's step over it."""

from __future__ import annotations

from verl_pipe.bench import cluster as clusters
from verl_pipe.bench import sensitivity
from verl_pipe.bench.plan import NO_ABORT_KNOBS, knob_grid, plan


def test_the_no_abort_what_if_is_tuned_like_verls_mode_and_differs_only_in_the_abort():
    real = knob_grid("separate_async")
    assert [(k.sync_every, k.warmup_batches) for k in NO_ABORT_KNOBS] == [(k.sync_every, k.warmup_batches) for k in real]
    assert all(k.abort_on_sync for k in real) and not any(k.abort_on_sync for k in NO_ABORT_KNOBS)
    assert NO_ABORT_KNOBS[1].describe("separate_async") == "sync once a step, no abort (what-if)"
    assert NO_ABORT_KNOBS[0].describe("separate_async") == "sync once a step, 0.75 batches ahead, no abort (what-if)"


def test_the_table_prints_the_real_step_over_the_no_abort_one():
    steps = {"sync": 200.0, "separate_async": 120.0, "one_off_pipeline": 180.0, "minibatch_pipeline": 220.0,
             "in_flight_pipeline": 118.0, sensitivity.NO_ABORT: 100.0}  # fmt: skip
    lines = sensitivity.format_sensitivity({"coding": [{"row": "as modelled", "step_s": steps}]})
    (row,) = [line for line in lines if line.strip().startswith("as modelled")]
    assert row.split()[-1] == "1.20x"  # 120 / 100
    assert row.split()[-2] == "1.02x"  # in_flight over separate_async: 120 / 118
    # a report saved before the bound existed still prints
    del steps[sensitivity.NO_ABORT]
    (old,) = [line for line in sensitivity.format_sensitivity({"coding": [{"row": "as modelled", "step_s": steps}]})
              if line.strip().startswith("as modelled")]  # fmt: skip
    assert old.split()[-1] == "-"


def test_a_row_prices_the_no_abort_bound_with_the_real_planner():
    """The row's bound is the planner's fastest no-abort setting of verl's schedule (the what-if is deterministic, so
    pricing it again gives the same step), and it is a different schedule from the real one (the abort costs)."""
    named = clusters.CLUSTERS["deepscaler-1.5b"]
    row = sensitivity._row("as modelled", named, "today", 8, 8)
    again = plan(named, clusters.engine("today"), "separate_async", 8, 8, seeds=sensitivity.SEEDS,
                 steps=sensitivity.STEPS, warmup_steps=sensitivity.WARMUP, knob_options=NO_ABORT_KNOBS)  # fmt: skip
    assert not again.knobs.abort_on_sync
    assert row["step_s"][sensitivity.NO_ABORT] == again.step_s
    assert row["step_s"][sensitivity.NO_ABORT] != row["step_s"]["separate_async"]


def test_a_row_holds_our_schedules_to_verls_lag_when_the_headline_does(monkeypatch):
    """With match_verl_lag every verl-pipe schedule of a row is planned at no more than the lag verl's separate_async
    was planned at (as the headline holds them); verl's own modes at the target. The control: without it, all at the
    target."""
    from verl_pipe.bench.plan import Plan

    asked: dict[str, float] = {}

    def fake_plan(named, engine, schedule, prompts, samples, max_token_lag=None, knob_options=None, **_):
        if knob_options is None:
            asked[schedule] = max_token_lag
        layout = clusters.split(named, 4)
        return Plan(schedule, layout, knob_options[0] if knob_options else None, 10.0, token_lag=0.8)

    monkeypatch.setattr(sensitivity, "plan", fake_plan)
    named = clusters.CLUSTERS["deepscaler-1.5b"]
    sensitivity._row("as modelled", named, "today", 8, 8, lag_target=1.0, match_verl_lag=True)
    assert asked["sync"] == asked["separate_async"] == 1.0
    assert asked["in_flight_pipeline"] == asked["one_off_pipeline"] == asked["minibatch_pipeline"] == 0.8
    asked.clear()
    sensitivity._row("as modelled", named, "today", 8, 8, lag_target=1.0)
    assert set(asked.values()) == {1.0}
