"""``verl-pipe bench pipeline``: the arithmetic on hand-made step records, and a short real run of two schedules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from verl_pipe.bench.pipeline import (
    PROFILES,
    SCHEDULES,
    BenchConfig,
    RunResult,
    compare,
    format_report,
    minibatch_ideal,
    one_off_ideal,
    summarize_run,
)


def _records(periods, **per_step):
    stamps, t = [], 1000.0
    for period in periods:
        t += period
        stamps.append(t)
    return [{"step": i + 1, "data": {"bench/step_end_ts": s, "timing_s/step": 1.0, **per_step}} for i, s in enumerate(stamps)]


def test_step_time_is_the_loop_period_after_the_warm_up():
    records = _records([30.0, 12.0, 10.0, 10.0, 11.0], **{"timing_s/gen": 6.0, "timing_s/update_weights": 0.5,
                                                            "bench/reward_after_generation_s": 2.0})  # fmt: skip
    result = summarize_run(SCHEDULES["verl_sync_reward_after"], PROFILES["coding"], records, warmup_steps=2, log="")
    assert result.step_s_each == [10.0, 10.0, 11.0]  # periods of steps 3..5
    assert result.step_s == pytest.approx(31 / 3)
    assert result.gen_s == 6.0 and result.sync_s == 0.5 and result.reward_after_s == 2.0
    assert result.train_s == pytest.approx(31 / 3 - 8.5)
    assert result.trainer_bubble_frac == pytest.approx(8.5 / (31 / 3))
    assert result.reward_hidden_frac == 0.0  # nothing streams in the reward-after-generation baseline
    with pytest.raises(RuntimeError, match="no measured steps"):
        summarize_run(SCHEDULES["verl_sync"], PROFILES["coding"], records[:2], warmup_steps=2, log="x.log")


def test_the_sampler_lane_comes_from_the_replicas_trace_for_every_schedule(tmp_path):
    """verl's separate_async records no sampler timestamps; the modelled replicas' busy spans give it (and every
    other schedule) the same measure over the measured steps but the last, stamps[warm-up - 1] to stamps[-2] (a
    run's last update has nothing left to overlap)."""
    from verl_pipe.bench.replica_model import sampler_trace_path

    records = _records([30.0, 10.0, 10.0, 10.0, 10.0], **{"timing_s/gen": 1.0})  # window 1040 .. 1060
    log = str(tmp_path / "train.log")
    with open(sampler_trace_path(str(tmp_path)), "w") as handle:
        for start, end in ((1000.0, 1045.0), (1044.0, 1050.0), (1055.0, 1070.0)):  # overlapping pieces merge
            handle.write(json.dumps({"start": start, "end": end}) + "\n")
    result = summarize_run(SCHEDULES["verl_separate_async"], PROFILES["coding"], records, warmup_steps=2, log=log)
    assert result.sampler_idle_frac == pytest.approx(5.0 / 20.0)  # idle 1050 .. 1055 only
    no_trace = summarize_run(SCHEDULES["verl_separate_async"], PROFILES["coding"], records, warmup_steps=2,
                             log=str(tmp_path / "elsewhere" / "train.log"))  # fmt: skip
    assert no_trace.sampler_idle_frac is None  # nothing measured: not a guess


def _run(name, step, gen=0.0, sync=0.0, after=0.0, exposed=0.0, profile="coding"):
    return RunResult(name, profile, step, [step], gen, sync, after, exposed, 0.0, None, None)


def test_ratios_and_one_off_ideal_bound():
    # the coding shares: gen 1 : reward 0.5 : train 0.5 : sync 0.05, reward after generation
    after = _run("verl_sync_reward_after", 2.05, gen=1.0, sync=0.05, after=0.5)
    assert one_off_ideal(after) == pytest.approx(2.05)  # (1 + 0.5 + 0.5 + 0.05) / max(1, 0.55)
    streaming = _run("verl_sync", 1.6, gen=1.05, sync=0.05, exposed=0.05)  # 0.05 of reward left after generation
    assert one_off_ideal(streaming) == pytest.approx(1.6)
    report = compare([after, streaming, _run("one_off_pipeline", 1.025)])
    coding = report["coding"]
    assert coding["speedup"]["one_off_pipeline"]["verl_sync_reward_after"] == pytest.approx(2.0)
    assert coding["one_off_share_of_ideal"]["verl_sync"] == pytest.approx((1.6 / 1.025) / 1.6)
    text = format_report({"runs": [r.__dict__ | {"train_s": r.train_s} for r in (after, streaming)],
                          "comparison": report, "wall_s": 1.0, "out_dir": "/x"})  # fmt: skip
    assert "one_off_pipeline vs verl_sync_reward_after: 2.00x of an ideal 2.05x (98%)" in text
    # on-policy: the last of 2 minibatches (0.25) and the sync stay after generation (1 + 0.25 + 0.05)
    assert minibatch_ideal(after) == pytest.approx(2.05 / 1.3)
    separate = _run("verl_separate_async", 1.0, gen=0.6, sync=0.05)
    report = compare([after, streaming, separate, _run("minibatch_pipeline", 1.35)])
    assert report["coding"]["minibatch_share_of_ideal"]["verl_sync_reward_after"] == pytest.approx(
        (2.05 / 1.35) / (2.05 / 1.3)
    )
    runs = [r.__dict__ | {"train_s": r.train_s} for r in (after, streaming, separate)]
    text = format_report({"runs": runs, "comparison": report, "wall_s": 1.0, "out_dir": "/x"})
    floor = 1.6 / minibatch_ideal(streaming)
    assert f"on-policy floor {floor:.2f} s/step (from verl_sync's phases) vs verl_separate_async 1.00 s/step" in text


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown profile/schedule"):
        BenchConfig(profiles=("physics",)).validate()
    with pytest.raises(ValueError, match="warmup_steps"):
        BenchConfig(warmup_steps=0).validate()
    with pytest.raises(ValueError, match="--replica-batches"):
        BenchConfig(replica_batches=0).validate()


UNIT_S = 3.0  # the suite's run: one batch's modelled generation, in wall seconds


@pytest.mark.timeout(900)
def test_one_off_beats_the_reward_after_generation_baseline(tmp_path, ray_cluster):
    """Two of our schedules through the CLI on the session's Ray cluster: the table, the JSON, one-off well clear of
    the serial baseline (the full benchmark, with verl's schedules measured beside ours, is `make bench`), and
    in_flight_pipeline's in-flight loads priced by the latency model (its overriding weight sync broke there once,
    unseen by the suite: f8c4379). The baseline is not launched here (a minute of the suite): on the modelled
    cluster it takes the sum of the profile's phases, at least (its reward-after hook has a test of its own,
    ``test_reward_after_generation_is_spent_on_the_trainers_path``); `make bench` measured it 8% above that sum."""
    out = tmp_path / "bench.json"
    argv = [os.path.join(os.path.dirname(sys.executable), "verl-pipe"), "bench", "pipeline", "--profiles", "coding",
            "--schedules", "one_off_pipeline,in_flight_pipeline", "--steps", "1", "--unit-s", str(UNIT_S),
            "--out-dir", str(tmp_path / "runs"), "--out", str(out), "--ray-address", ray_cluster]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "in_flight_pipeline sampler busy" in proc.stdout
    report = json.loads(out.read_text())
    runs = {r["schedule"]: r for r in report["runs"]}
    assert set(runs) == {"one_off_pipeline", "in_flight_pipeline"}
    assert runs["one_off_pipeline"]["reward_hidden_frac"] > 0.5
    # each measured step's sync went out when the batch had generated, not when its last (modelled) reward landed
    assert runs["one_off_pipeline"]["syncs_before_last_reward"] > 0.5
    # every trained sample's update was timed on its own modelled length, also through verl's partial-rollout client
    assert all(run["modelled_tokens_defaulted"] == 0 for run in runs.values())
    # the sampler lane comes from the modelled replica for every schedule
    assert all(run["sampler_idle_frac"] is not None for run in runs.values())
    coding = PROFILES["coding"]
    serial_s = UNIT_S * (1.0 + coding.reward + coding.train + coding.sync)  # generate, score, train, sync in turn
    assert serial_s / runs["one_off_pipeline"]["step_s"] > 1.4, runs["one_off_pipeline"]["step_s_each"]
    # in flight: the step trained tokens the modelled replica decoded a version back and none further, nothing was
    # dropped, and the run was priced (its loads reached the modelled replica instead of failing the run)
    in_flight = runs["in_flight_pipeline"]
    assert 0 < in_flight["token_lag_mean"] <= in_flight["token_lag_max"] == 1
    assert in_flight["dropped_groups"] == 0
    assert serial_s / in_flight["step_s"] > 1.4
    # and, on the hf server, the first of each step's two updates reached the sampler too (staged: a fraction of a
    # version, v_{k-1} + 1/2, which every tag, the token lag and the lag bound carried through)
    assert in_flight["update_loads_sent"] >= 1


def test_the_in_flight_lines_compare_with_separate_async_and_print_the_gap_to_the_bar():
    peer = _run("verl_separate_async", 4.0)
    peer.token_lag_mean, peer.token_lag_max, peer.spanning_share, peer.sampler_idle_frac = 0.9, 1.0, 0.25, 0.05
    ours = _run("in_flight_pipeline", 3.2)
    ours.token_lag_mean, ours.token_lag_max, ours.spanning_share, ours.sampler_idle_frac = 0.8, 1.0, 0.2, 0.08
    runs = [r.__dict__ | {"train_s": r.train_s} for r in (peer, ours)]
    text = format_report({"runs": runs, "comparison": compare([peer, ours]), "wall_s": 1.0, "out_dir": "/x"})
    assert "in_flight_pipeline vs verl_separate_async: 1.25x the speed, token lag 0.80 vs 0.90" in text
    assert "in_flight_pipeline sampler busy 92.0% of the window (3.0% short of the 95% bar)" in text
    assert "minibatch updates loaded 0 in the run" in text
