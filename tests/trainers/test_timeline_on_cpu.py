"""The pipelined trainers' timeline: interval arithmetic, the chrome trace round trip, and the Gantt PNG.

Guards: an overlap measure that counts a stretch twice when intervals of one side overlap each other, and a
trace whose microsecond rounding makes back-to-back phases look overlapping (an extra Gantt row).
"""

from __future__ import annotations

import doctest
import json
import os

import pytest

from verl_pipe.plot import plot_trace
from verl_pipe.trainers import timeline
from verl_pipe.trainers.timeline import Interval, Timeline, busy_seconds, load_trace, overlap_seconds, trace_origin


def test_doctests():
    result = doctest.testmod(timeline)
    assert result.attempted >= 2 and result.failed == 0


def test_overlap_counts_each_instant_once():
    trainer = [Interval("trainer", "train", 0, 10)]
    sampler = [Interval("sampler", "a", 2, 6), Interval("sampler", "b", 4, 8)]  # overlapping each other
    assert overlap_seconds(trainer, sampler) == pytest.approx(6.0)
    assert overlap_seconds(sampler, trainer) == pytest.approx(6.0)
    assert busy_seconds(sampler, 0, 10) == pytest.approx(6.0)
    assert overlap_seconds(trainer, [Interval("sampler", "c", 10, 12)]) == 0.0


def test_trace_round_trip_and_lanes(tmp_path):
    path = str(tmp_path / "timeline.json")
    trace = Timeline(path)
    t0 = 1_700_000_000.123456  # wall-clock seconds, as the trainer records them
    trace.add("trainer", "wait for samples", t0, t0 + 0.1)
    trace.add("trainer", "train", t0 + 0.1, t0 + 0.7)  # back to back: same row
    trace.add("trainer", "sync", t0 + 0.7, t0 + 0.7)  # zero length: dropped
    trace.add("sampler", "generate B1", t0, t0 + 0.1)
    trace.add("sampler", "generate B2", t0 + 0.1, t0 + 0.5)
    trace.add("reward", "score", t0 + 0.05, t0 + 0.2)
    trace.add("reward", "score", t0 + 0.06, t0 + 0.3)  # overlaps the first: a second row
    with pytest.raises(ValueError, match="unknown timeline track"):
        trace.add("critic", "x", 0, 1)
    trace.write()
    events = json.load(open(path))["traceEvents"]
    rows = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    assert len(rows) == 4, rows  # sampler 1 row, reward 2 rows, trainer 1 row
    loaded = load_trace(path)
    assert len(loaded) == 6
    by_name = {i.name: i for i in loaded}
    assert by_name["train"].end - by_name["train"].start == pytest.approx(0.6, abs=1e-6)
    assert overlap_seconds([by_name["train"]], [i for i in loaded if i.track == "sampler"]) == pytest.approx(0.4)
    assert trace_origin(path) + by_name["train"].start == pytest.approx(t0 + 0.1)  # back to wall-clock time
    png = plot_trace(path, str(tmp_path / "timeline.png"))
    assert os.path.getsize(png) > 10_000
