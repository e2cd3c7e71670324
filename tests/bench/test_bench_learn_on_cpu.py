"""``verl-pipe bench learn``: its statistics and arithmetic on hand-made records in verl's own log format, the
report and picture it writes, and its config errors. (The runs themselves are verl's trainer through the
quickstart, which the end-to-end tests cover; a full bench, on vLLM rollouts, took 88.6 minutes and is
`make bench-learn`.)"""

from __future__ import annotations

import json
import os
import re

import pytest

from verl_pipe.bench.learn import (
    MODE_SCHEDULES,
    LearnBenchConfig,
    ModeRun,
    cluster_step_seconds,
    compare_runs,
    format_report,
    steps_to_target,
)
from verl_pipe.cli import build_parser
from verl_pipe.compat import SetupError
from verl_pipe.run_metrics import Validation, validations_from_verl_log, wilson_interval


def test_wilson_interval_matches_its_closed_forms():
    z2 = 1.959964**2
    low, high = wilson_interval(0, 10)  # at 0 successes the upper bound is z^2 / (n + z^2)
    assert low == 0.0 and high == pytest.approx(z2 / (10 + z2))
    assert wilson_interval(50, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)  # the textbook 50/100
    for k in range(0, 121, 7):  # symmetric under swapping successes and failures
        low, high = wilson_interval(k, 120)
        mirror_low, mirror_high = wilson_interval(120 - k, 120)
        assert low == pytest.approx(1 - mirror_high) and high == pytest.approx(1 - mirror_low)
        assert low <= k / 120 <= high
    width = [high - low for low, high in (wilson_interval(37, 120), wilson_interval(9, 30))]
    assert width[0] < width[1]  # more items, a tighter interval at about the same rate
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(5, 4)


def _verl_log(path, records):
    with open(path, "w", encoding="utf-8") as fh:
        for step, data in records:
            fh.write(json.dumps({"step": step, "data": data}) + "\n")
    return str(path)


def _val(rate):
    return {"val-aux/verl_pipe/easy_code/passed/mean@1": rate, "val-core/verl_pipe/easy_code/reward/mean@1": rate}


def test_validations_are_read_from_verls_log_as_counts(tmp_path):
    path = _verl_log(tmp_path / "m.jsonl", [
        (0, _val(37 / 120)),
        (1, {"timing_s/step": 9.0, "critic/score/mean": 0.2}),
        (2, {"timing_s/step": 9.0, "critic/score/mean": 0.3, **_val(52 / 120)}),  # verl logs it with the step
    ])  # fmt: skip
    assert validations_from_verl_log(path, 120) == [Validation(0, 37, 120), Validation(2, 52, 120)]


def test_steps_to_target_is_the_first_validation_at_or_above_it():
    points = [Validation(0, 60, 120), Validation(4, 66, 120), Validation(8, 80, 120), Validation(12, 70, 120)]
    assert steps_to_target(points, 0.55) == 4
    assert steps_to_target(points, 80 / 120) == 8  # at the target counts
    assert steps_to_target(points, 0.9) is None
    assert steps_to_target(points, 0.1) == 4  # step 0 is the untrained model: never "reached"


def test_cluster_step_seconds_are_the_mean_over_the_benchmarks_blocks():
    report = {
        "runs": [
            {"profile": "coding", "schedule": "verl_sync", "step_s": 350.0, "block": 0},
            {"profile": "coding", "schedule": "verl_sync", "step_s": 370.0, "block": 1},
            {"profile": "coding", "schedule": "verl_separate_async", "step_s": 200.0, "block": 0},
            {"profile": "math", "schedule": "verl_sync", "step_s": 1.0, "block": 0},
        ],
    }
    assert cluster_step_seconds(report) == {"sync": pytest.approx(360.0), "separate_async": pytest.approx(200.0)}


def _run(mode, passed, seconds, rollout="vllm"):
    return ModeRun(mode=mode, rollout=rollout, rewards=[0.2, 0.3, 0.35, 0.4],
                   validations=[Validation(step, p, 120) for step, p in zip((0, 2, 4), passed)],
                   samples_trained=128, wall_s=1.0, run_dir="/x", cluster_s_per_step=seconds)  # fmt: skip


def test_time_to_target_combines_learning_per_step_with_the_priced_step():
    runs = [
        _run("sync", (36, 45, 60), 360.0),  # reaches 0.40 at step 4: 0.4 h
        _run("one_off_pipeline", (36, 50, 62), 180.0),  # at step 2, each step half as long: 0.1 h -> 4x
        _run("separate_async", (36, 40, 48), 180.0),  # at step 4 with half-length steps: 2x
        _run("minibatch_pipeline", (36, 38, 40), 300.0),  # never
    ]
    table = compare_runs(runs, target=0.40)
    assert table["sync"]["steps_to_target"] == 4 and table["sync"]["hours_to_target"] == pytest.approx(0.4)
    assert table["sync"]["speedup_to_target_vs_sync"] == pytest.approx(1.0)
    assert table["one_off_pipeline"]["speedup_to_target_vs_sync"] == pytest.approx(4.0)
    assert table["separate_async"]["speedup_to_target_vs_sync"] == pytest.approx(2.0)
    assert table["minibatch_pipeline"]["hours_to_target"] is None
    assert table["minibatch_pipeline"]["speedup_to_target_vs_sync"] is None
    assert table["sync"]["rise"] == pytest.approx(24 / 120)
    assert table["sync"]["intervals_apart"] is True  # 30% [22.5, 38.7] against 50% [41.2, 58.8]
    assert table["minibatch_pipeline"]["intervals_apart"] is False


def _result(tmp_path):
    runs = [_run("sync", (36, 45, 60), 360.0), _run("in_flight_pipeline", (36, 48, 58), 190.0, rollout="hf")]
    return {
        "config": {"steps": 4, "prompts_per_step": 8, "samples_per_prompt": 4, "temperature": 0.7},
        "target": 0.4,
        "runs": [{**r.__dict__, "validations": [v.__dict__ for v in r.validations], "hours_per_step": r.hours(1)}
                 for r in runs],  # fmt: skip
        "comparison": compare_runs(runs, 0.4),
        "out_dir": str(tmp_path),
        "png": str(tmp_path / "learning.png"),
        "json": str(tmp_path / "learning.json"),
    }


def test_report_prints_intervals_hours_and_ratios(tmp_path):
    text = format_report(_result(tmp_path))
    assert "30.0 [22.5,38.7]" in text and "50.0 [41.2,58.8]" in text  # 36/120 and 60/120 with Wilson bounds
    sync_row = next(line for line in text.splitlines() if line.strip().startswith("sync "))
    assert "+20.0" in sync_row and "1.00x" in sync_row
    in_flight_row = next(line for line in text.splitlines() if "in_flight_pipeline" in line)
    # reaches 40% at step 2 (48/120) with 190 s steps against sync's step 4 with 360 s: 1440 / 380
    assert f"{1440 / 380:.2f}x" in in_flight_row and " hf " in in_flight_row
    assert "intervals before/after apart" in text


def test_the_picture_is_written(tmp_path):
    from verl_pipe.plot import plot_learning

    png = plot_learning(_result(tmp_path), str(tmp_path / "learning.png"))
    assert os.path.getsize(png) > 10_000


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"modes": ("sync", "async")}, "unknown modes ['async'] (--modes)"),
        ({"modes": ("one_off_pipeline",)}, "--modes must include sync"),
        ({"steps": 6, "val_every": 4}, "(--steps, --val-every)"),
        ({"target": 45.0}, "(--target)"),
    ],
)
def test_bad_settings_name_the_flag(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LearnBenchConfig(**kwargs).validate()


def test_cli_turns_a_bad_setting_into_a_setup_error():
    args = build_parser().parse_args(["bench", "learn", "--modes", "sync,one_off", "--steps", "4"])
    with pytest.raises(SetupError, match=re.escape("unknown modes ['one_off']")):
        args.func(args)


def test_every_trainer_mode_is_priced_by_a_pipeline_schedule():
    from verl_pipe.bench.pipeline import SCHEDULES
    from verl_pipe.quickstart import TRAINER_MODES

    assert set(MODE_SCHEDULES) == set(TRAINER_MODES)
    for mode, schedule in MODE_SCHEDULES.items():
        assert SCHEDULES[schedule].trainer_mode == mode
    assert LearnBenchConfig(rollout="vllm").engine == "vllm"  # every mode, in_flight_pipeline's loads included
    LearnBenchConfig().validate()  # the defaults are a valid bench
