"""Step metrics from the per-sample reward info the ``interleaved`` manager returns.

``reward/hidden_frac`` is the share of reward time that ran while generation was still going: a sample's
scoring interval [start, end] counts as hidden up to the moment the batch's last trajectory finished
generating (the latest enqueue time, since a trajectory is enqueued for scoring the moment it finishes).
1.0 means no reward time is left on the step's critical path; a reward computed after generation scores 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

TIMING_KEYS = ("reward_enqueue_ts", "reward_start_ts", "reward_end_ts", "reward_time_s", "reward_queue_s")


def hidden_fraction(enqueue_ts: Sequence[float], start_ts: Sequence[float], end_ts: Sequence[float]) -> float:
    """Share of total scoring time that overlapped generation (see the module docstring).

    >>> hidden_fraction([0.0, 5.0], [1.0, 5.0], [2.0, 7.0])  # first hidden, second entirely after generation
    0.3333333333333333
    """
    generation_end = max(enqueue_ts)
    total = sum(end - start for start, end in zip(start_ts, end_ts, strict=True))
    if total <= 0:
        return 1.0
    hidden = sum(max(0.0, min(end, generation_end) - start) for start, end in zip(start_ts, end_ts, strict=True))
    return hidden / total


def reward_step_metrics(infos: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Aggregate per-sample reward infos; samples without the interleaved timing fields are ignored."""
    timed = [info for info in infos if all(key in info and info[key] is not None for key in TIMING_KEYS)]
    if not timed:
        return {}
    n = len(timed)
    times = [float(info["reward_time_s"]) for info in timed]
    waits = [float(info["reward_queue_s"]) for info in timed]
    metrics = {
        "reward/time_s/mean": sum(times) / n,
        "reward/time_s/max": max(times),
        "reward/queue_s/mean": sum(waits) / n,
        "reward/queue_s/max": max(waits),
        "reward/hidden_frac": hidden_fraction(
            [float(i["reward_enqueue_ts"]) for i in timed],
            [float(i["reward_start_ts"]) for i in timed],
            [float(i["reward_end_ts"]) for i in timed],
        ),
        # How long after the last trajectory finished the last reward was ready: the exposed reward time.
        "reward/exposed_s": max(
            0.0, max(float(i["reward_end_ts"]) for i in timed) - max(float(i["reward_enqueue_ts"]) for i in timed)
        ),  # fmt: skip
    }
    outcomes = Counter(str(info["outcome"]) for info in timed if "outcome" in info)
    for outcome, count in sorted(outcomes.items()):
        metrics[f"reward/outcome/{outcome}"] = count / n
    if any("sandbox_error" in info for info in timed):
        metrics["reward/sandbox_error_frac"] = sum(bool(info.get("sandbox_error")) for info in timed) / n
    return metrics
