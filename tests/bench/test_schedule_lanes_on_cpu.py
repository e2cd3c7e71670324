"""The benchmark's side-by-side picture: each panel spans a run's measured steps, in benchmark steps."""

from __future__ import annotations

import json

from verl_pipe.bench.schedule_lanes import schedule_panels


def _run(tmp_path, schedule: str, periods: list[float]) -> dict:
    run_dir = tmp_path / schedule
    run_dir.mkdir()
    stamps, t = [], 1000.0
    for period in periods:
        t += period
        stamps.append(t)
    records = [{"step": i + 1, "data": {"bench/step_end_ts": s, "timing_s/gen": 0.1}} for i, s in enumerate(stamps)]
    (run_dir / "verl_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return {"schedule": schedule, "profile": "coding", "block": 0, "log": str(run_dir / "train.log")}


def test_a_panel_is_the_measured_steps_whatever_a_benchmark_step_holds(tmp_path):
    """verl's separate_async syncing after every update runs a verl step per minibatch (two a benchmark step): its
    panel starts after the warm-up's benchmark steps and ends before the cool-down's (the control: read as single
    verl steps, the window would start inside the warm-up and end in the cool-down)."""
    every_update = _run(tmp_path, "verl_separate_async", [1.0] * 10)  # 2 warm-up + 2 measured + 1 cool-down, x2
    once = _run(tmp_path, "verl_sync", [2.0] * 5)
    plans = {"verl_separate_async": {"layout": "22 sampler + 10 trainer", "knob_values": {"sync_every": 1}},
             "verl_sync": {"layout": "32 colocated", "knob_values": {}}}  # fmt: skip
    what_if = {"verl_separate_async": {"step_s": 1.0}, "verl_sync": {"step_s": 1.0}}
    report = {"config": {"warmup_steps": 2, "steps": 2}, "runs": [every_update, once],
              "profiles": {"coding": {"cluster": "deepcoder-14b", "plans": plans, "what_if": what_if}}}
    panels = {title: (origin, intervals) for title, origin, intervals in schedule_panels(report)}
    origin, intervals = panels["coding / verl_separate_async"]
    assert origin == 1004.0  # the end of verl step 4: two benchmark steps of warm-up
    assert max(i.end for i in intervals) == 1008.0  # four verl steps later; the cool-down's two are left out
    origin, intervals = panels["coding / verl_sync"]
    assert origin == 1004.0 and max(i.end for i in intervals) == 1008.0
