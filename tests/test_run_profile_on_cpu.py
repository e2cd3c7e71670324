"""The quickstart's phase table (verl_pipe.run_profile) and the validation timer it reads (verl_pipe.step_metrics).

The records are in the schema of verl's file logger (the ``data`` of each line of ``verl_metrics.jsonl``), with the
keys verl's V1 trainer writes; the validation timer is applied to verl's own ``PPOTrainer``.
"""

from __future__ import annotations

import importlib
import json
import time

import psutil
import pytest

from verl_pipe.run_profile import VALIDATION_KEY, TimedRecord, busy_loops, describe_load, phase_table


def _step(step: int, gen: float, old: float, update: float, weights: float, total: float, **extra) -> dict:
    return {
        "timing_s/gen": gen,
        "timing_s/old_log_prob": old,
        "timing_s/adv": 0.03,
        "timing_s/update_actor": update,
        "timing_s/update_weights": weights,
        "timing_s/step": total,
        "timing_per_token_ms/gen": 5.7,  # not a phase: per-token rates stay out of the table
        "critic/score/mean": 0.2,
        **extra,
    }


def _records() -> list[TimedRecord]:
    return [
        TimedRecord(135.0, 0, {"val-core/verl_pipe/easy_code/reward/mean@1": 0.31, VALIDATION_KEY: 30.0}),
        TimedRecord(205.0, 1, _step(1, 14.0, 12.7, 40.2, 2.1, 69.1)),
        TimedRecord(
            320.0,
            2,
            _step(2, 12.0, 8.3, 30.2, 3.1, 53.6, **{"timing_s/testing": 30.4, VALIDATION_KEY: 30.2}),
        ),
    ]


def test_phase_table_splits_start_up_from_the_validation_before_training():
    table = phase_table(_records(), total_s=329.0)
    assert table.validation_before_s == 30.0
    assert table.startup_s == pytest.approx(105.0)  # seen at 135 s, of which 30 s were the validation
    assert table.validation_after_s == 30.2  # the validation's own timer, not V1's wider "testing"
    assert table.finish_s == pytest.approx(9.0)
    first = table.steps[0]
    assert first.step_s == 69.1
    assert first.phases_s["gen"] == 14.0 and first.phases_s["update_actor"] == 40.2
    assert first.phases_s["other"] == pytest.approx(69.1 - (14.0 + 12.7 + 0.03 + 40.2 + 2.1))
    assert "testing" not in table.steps[1].phases_s  # V1 times the validation outside the step
    rendered = table.render()
    assert "nothing beside it" in rendered and "update_actor" in rendered and "timing_per_token" not in rendered
    assert json.loads(table.to_json())["validation_before_s"] == 30.0


def test_without_the_validation_timer_start_up_is_unknown_rather_than_swallowing_the_validation():
    # A verl whose _validate the timer could not patch logs the step-0 record without it: start-up and the
    # validation cannot be told apart, and the table must not present their sum as start-up.
    records = _records()
    records[0] = TimedRecord(135.0, 0, {"val-core/verl_pipe/easy_code/reward/mean@1": 0.31})
    table = phase_table(records, total_s=329.0)
    assert table.startup_s is None and table.validation_before_s is None
    assert "n/a" in table.render()


def test_a_run_without_a_validation_before_training_starts_its_clock_at_its_first_step():
    records = [TimedRecord(100.0, 1, _step(1, 14.0, 12.7, 40.2, 2.1, 69.1))]
    table = phase_table(records, total_s=104.0, load=describe_load(1))
    assert table.startup_s == pytest.approx(30.9) and table.validation_before_s is None
    assert "beside 1 busy loop" in table.render()


def test_the_validation_timer_adds_its_wall_time_to_every_validation_of_verls_v1_trainer(monkeypatch):
    from verl_pipe import step_metrics

    module = importlib.import_module(step_metrics.TRAINER_MODULES[1])

    def slow_validate(self):
        time.sleep(0.05)
        return {"val-core/x/reward/mean@1": 0.5}

    monkeypatch.setattr(module.PPOTrainer, "_validate", slow_validate)
    step_metrics.patch_v1_validation_time()
    metrics = module.PPOTrainer._validate(object())
    assert metrics["val-core/x/reward/mean@1"] == 0.5
    assert 0.05 <= metrics[VALIDATION_KEY] < 5
    step_metrics.patch_v1_validation_time()  # applying twice must not time twice
    assert module.PPOTrainer._validate.__wrapped__ is slow_validate


def test_busy_loops_spin_while_the_block_runs_and_are_gone_after():
    with busy_loops(2) as procs:
        handles = [psutil.Process(p.pid) for p in procs]
        # they spin, not sleep: 0.2 s of CPU between them, however busy the box (a loaded 2-core CI box gave them
        # 0.14 s in a fixed 0.5 s); a sleeping process would never get there
        deadline = time.monotonic() + 30
        while sum(h.cpu_times().user for h in handles) <= 0.2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(h.is_running() and h.status() != psutil.STATUS_ZOMBIE for h in handles)
        assert sum(h.cpu_times().user for h in handles) > 0.2
    assert all(p.poll() is not None for p in procs)
    assert describe_load(0) == "" and describe_load(2) == "2 busy loops"


def test_the_learning_verdict_calls_intervals_apart_only_when_they_do_not_touch():
    from verl_pipe.run_metrics import Validation, learning_verdict

    before = Validation(0, 38, 120)  # 31.7% [24.0, 40.4]
    learned = learning_verdict(before, Validation(5, 61, 120))  # 50.8% [42.0, 59.6]
    assert learned.startswith("+19.2 points") and "apart: it learned" in learned and "16.4 and 17.6" in learned
    # 59/120 is 49.2% [40.39, 58.0], just short of the 40.45 where the one before ends: not apart.
    assert "overlap" in learning_verdict(before, Validation(5, 59, 120))
    assert "apart: it got worse" in learning_verdict(Validation(0, 60, 120), Validation(5, 30, 120))
