"""The lanes of the benchmark's side-by-side picture: each schedule's measured steps, sampler over trainer.

The sampler lane of every schedule comes from the modelled replicas themselves: each writes the spans in which
it had requests running (:mod:`verl_pipe.bench.sampler_trace`), so verl's ``separate_async``
gets the same lane as ours. For our pipelined modes the trainer lane comes from the run's own ``timeline.json``
(:mod:`verl_pipe.trainers.timeline`). verl's modes write no timeline, so their trainer lane is rebuilt from
verl's per-step records: each step runs from the previous step's wall-clock stamp to its own, waiting for
samples first (``timing_s/gen``), then training, and syncing at the end.
:func:`verl_pipe.plot.plot_schedules` draws them.
"""

from __future__ import annotations

import json
import os
from typing import Any

from verl_pipe.bench.sampler_trace import load_busy_spans, sampler_trace_path
from verl_pipe.trainers.timeline import Interval, load_trace, trace_origin


def _step_records(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "verl_metrics.jsonl"), encoding="utf-8") as fh:
        steps = [json.loads(line) for line in fh if line.strip()]
    return [s["data"] for s in sorted(steps, key=lambda s: s["step"]) if "bench/step_end_ts" in s["data"]]


def rebuilt_lanes(records: list[dict], warmup_steps: int, colocated: bool) -> list[Interval]:
    """Trainer (and, when colocated, sampler) intervals of the measured steps from verl's step records."""
    intervals: list[Interval] = []
    for previous, record in zip(records[warmup_steps - 1 :], records[warmup_steps:]):
        start, end = float(previous["bench/step_end_ts"]), float(record["bench/step_end_ts"])
        wait = float(record.get("timing_s/gen", 0.0))
        sync = float(record.get("pipeline/time/sync_s", record.get("timing_s/update_weights", 0.0)))
        cursor = start
        if wait > 0:
            cursor = min(end, start + wait)
            intervals.append(Interval("trainer", "wait for samples", start, cursor))
        intervals.append(Interval("trainer", "train", cursor, max(cursor, end - sync)))
        if sync > 0:
            intervals.append(Interval("trainer", "sync", max(cursor, end - sync), end))
        if colocated and wait > 0:
            intervals.append(Interval("sampler", "generate", start, start + wait))
    return intervals


def traced_lanes(run_dir: str, records: list[dict], warmup_steps: int) -> list[Interval]:
    """Our modes' own timeline, cut to the measured steps."""
    window_start = float(records[warmup_steps - 1]["bench/step_end_ts"])
    window_end = float(records[-1]["bench/step_end_ts"])
    trace = os.path.join(run_dir, "checkpoints", "timeline.json")
    origin = trace_origin(trace)
    intervals = []
    for relative in load_trace(trace):
        item = Interval(relative.track, relative.name, relative.start + origin, relative.end + origin)
        if item.track == "reward" or item.end <= window_start or item.start >= window_end:
            continue
        name = "generate" if item.track == "sampler" else ("wait for samples" if item.name.startswith("wait") else item.name)
        intervals.append(Interval(item.track, name, max(item.start, window_start), min(item.end, window_end)))
    return intervals


def sampler_lane(run_dir: str, window_start: float, window_end: float) -> list[Interval]:
    """The replicas' busy spans (``generate``) within the measured window."""
    return [
        Interval("sampler", "generate", max(start, window_start), min(end, window_end))
        for start, end in load_busy_spans(sampler_trace_path(run_dir))
        if end > window_start and start < window_end
    ]


def schedule_panels(report: dict[str, Any], block: int = 0) -> list[tuple[str, float, list[Interval]]]:
    """One ``(title, origin, intervals)`` panel per run of the report's ``block``: its measured steps, from
    ``origin`` (the warm-up and cool-down steps left out, each benchmark step as many verl steps as it ran)."""
    from verl_pipe.bench.pipeline import plan_of  # (the report's reader, which calls this)

    panels = []
    for run in report["runs"]:
        if run.get("block", 0) != block:
            continue
        run_dir = os.path.dirname(run["log"])
        _, per_verl_step = plan_of(report["profiles"][run["profile"]], run["schedule"])
        warmup = int(report["config"]["warmup_steps"]) * per_verl_step
        records = _step_records(run_dir)
        measured = report["config"].get("steps")
        if measured is not None:
            records = records[: warmup + int(measured) * per_verl_step]
        if os.path.exists(os.path.join(run_dir, "checkpoints", "timeline.json")):
            intervals = traced_lanes(run_dir, records, warmup)
        else:
            intervals = rebuilt_lanes(records, warmup, colocated=run["schedule"].startswith("verl_sync"))
        origin = float(records[warmup - 1]["bench/step_end_ts"])
        replica_lane = sampler_lane(run_dir, origin, float(records[-1]["bench/step_end_ts"]))
        if replica_lane:  # the replicas' own record replaces the lane inferred from the trainer's side
            intervals = [i for i in intervals if i.track != "sampler"] + replica_lane
        panels.append((f"{run['profile']} / {run['schedule']}", origin, intervals))
    return panels
