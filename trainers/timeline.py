"""Per-run timeline of the pipelined trainers: who was busy when, as a chrome trace, and arithmetic on intervals.

Three tracks, all in wall-clock time:

* ``trainer``: waiting for samples, training (old log-probs, advantages, update, checkpoint), weight sync;
* ``sampler``: each batch from its submission to the end of its last sample's generation;
* ``reward``: each sample's scoring interval (from the ``interleaved`` reward manager's timestamps).

The trace is chrome://tracing / Perfetto JSON (``ph: "X"`` complete events, microseconds). Overlapping intervals
of one track go on separate rows (``tid``), so a Gantt chart of the trace shows the overlap directly (``verl-pipe
plot timeline.json`` draws one: :func:`verl_pipe.plot.plot_trace`). No plotting library is imported here: the
trainers write the trace in every step. What the trainer records, and when, is :mod:`.timeline_recorder`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterable

TRACKS = ("sampler", "reward", "trainer")
# Back-to-back intervals share an instant; the trace's microsecond rounding must not make them look overlapping.
_SAME_INSTANT_S = 2e-6


@dataclass(frozen=True)
class Interval:
    track: str
    name: str
    start: float
    end: float


def busy_seconds(intervals: Iterable[Interval], start: float, end: float) -> float:
    """Length of the union of ``intervals`` clipped to [start, end].

    >>> busy_seconds([Interval("s", "a", 0, 2), Interval("s", "b", 1, 3), Interval("s", "c", 5, 9)], 0, 6)
    4.0
    """
    clipped = sorted((max(i.start, start), min(i.end, end)) for i in intervals if i.end > start and i.start < end)
    total, cursor = 0.0, start
    for lo, hi in clipped:
        lo = max(lo, cursor)
        if hi > lo:
            total += hi - lo
            cursor = hi
    return float(total)


def overlap_seconds(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """Time during which some interval of ``a`` and some interval of ``b`` ran together.

    >>> overlap_seconds([Interval("t", "x", 0, 4)], [Interval("s", "y", 3, 6), Interval("s", "z", 1, 2)])
    2.0
    """
    b = list(b)
    return float(sum(busy_seconds(b, i.start, i.end) for i in _disjoint(a)))


def _disjoint(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for i in sorted(intervals, key=lambda i: i.start):
        if merged and i.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.track, last.name, last.start, max(last.end, i.end))
        else:
            merged.append(i)
    return merged


def lanes(intervals: list[Interval]) -> list[int]:
    """Row of each interval within its track: the first row free at its start (greedy interval colouring)."""
    lane_ends: list[float] = []
    rows = []
    for interval in intervals:
        for lane, lane_end in enumerate(lane_ends):
            if lane_end <= interval.start + _SAME_INSTANT_S:
                lane_ends[lane] = interval.end
                rows.append(lane)
                break
        else:
            lane_ends.append(interval.end)
            rows.append(len(lane_ends) - 1)
    return rows


class Timeline:
    """Collects intervals during a run and rewrites the trace file after every step."""

    def __init__(self, path: str):
        self.path = path
        self.intervals: list[Interval] = []

    def add(self, track: str, name: str, start: float, end: float) -> None:
        if track not in TRACKS:
            raise ValueError(f"unknown timeline track {track!r}; tracks: {TRACKS}")
        if end > start:  # zero-length phases (a sync that found nothing to do) carry no information
            self.intervals.append(Interval(track, name, float(start), float(end)))

    def track(self, name: str) -> list[Interval]:
        return [i for i in self.intervals if i.track == name]

    def write(self) -> str:
        origin = min((i.start for i in self.intervals), default=0.0)
        events = []
        for pid, track in enumerate(TRACKS):
            items = sorted(self.track(track), key=lambda i: (i.start, i.end))
            events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": track}})
            for interval, lane in zip(items, lanes(items)):
                events.append(
                    {
                        "ph": "X",
                        "name": interval.name,
                        "cat": track,
                        "pid": pid,
                        "tid": lane,
                        "ts": round((interval.start - origin) * 1e6, 1),
                        "dur": round((interval.end - interval.start) * 1e6, 1),
                    }
                )
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            # otherData is chrome-trace metadata: the wall clock of ts=0, to line traces up with other records
            json.dump({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"origin_unix_s": origin}}, fh)
        os.replace(tmp, self.path)
        return self.path


def load_trace(path: str) -> list[Interval]:
    """Intervals of a trace written by :class:`Timeline` (times in seconds from the first event)."""
    with open(path, encoding="utf-8") as fh:
        events = json.load(fh)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    return [
        Interval(names[e["pid"]], e["name"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)
        for e in events
        if e.get("ph") == "X"
    ]


def trace_origin(path: str) -> float:
    """Wall-clock time (Unix seconds) of the trace's first event, which :func:`load_trace` reports as 0."""
    with open(path, encoding="utf-8") as fh:
        return float(json.load(fh).get("otherData", {}).get("origin_unix_s", 0.0))
