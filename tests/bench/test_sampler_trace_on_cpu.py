"""The sampler pool's trace: the idle the pool spends waiting for real CPU work that the model does in no time."""

import json

import pytest

from verl_pipe.bench.sampler_trace import admission_losses, losses_by_period


def _trace(tmp_path, records, replicas=2):
    path = tmp_path / "sampler_busy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"replicas": replicas}, *records]))
    return str(path)


def _busy(start, end, replica):
    return {"start": start, "end": end, "replica": replica}


def test_a_late_next_batch_after_an_aborting_sync_is_lost_pool_time_beyond_the_models_hold(tmp_path):
    """Guards: verl's separate_async priced slower than the cluster it models because its next batch reaches the
    servers only after real CPU work (the control: the same sync with the batch admitted when the hold ends)."""
    before = [{"event": "admit", "at": 0.0}, _busy(0.0, 10.0, 0), _busy(0.0, 10.0, 1)]
    sync = [{"event": "abort", "at": 10.0, "hold_s": 0.5}, {"event": "loaded", "at": 10.5}]
    # replica 0 gets an aborted request back at 11.0; the next batch arrives at 12.0 and fills both
    late = [{"event": "resume", "at": 11.0}, _busy(11.0, 20.0, 0), {"event": "admit", "at": 12.0}, _busy(12.0, 20.0, 1)]
    losses = admission_losses(_trace(tmp_path, before + sync + late))
    # idle in [10, 12]: replica 0 for 1 s, replica 1 for 2 s; a mean of 1.5 s, less the model's 0.5 s hold
    assert losses == [(12.0, pytest.approx(1.0))]
    on_time = [{"event": "resume", "at": 10.5}, {"event": "admit", "at": 10.5}, _busy(10.5, 20.0, 0),
               _busy(10.5, 20.0, 1)]  # fmt: skip
    assert admission_losses(_trace(tmp_path, before + sync + on_time)) == [(10.5, pytest.approx(0.0))]


def test_an_in_flight_load_that_holds_its_requests_loses_nothing(tmp_path):
    """The stall of a load between decode steps is the model's own (priced in the run's modelled time): the pool
    held its requests, so none of it counts as idle."""
    records = [{"event": "admit", "at": 0.0}, _busy(0.0, 20.0, 0), _busy(0.0, 20.0, 1), {"event": "loaded", "at": 8.0},
               {"start": 8.0, "end": 9.0, "kind": "stall"}, {"event": "admit", "at": 9.5}]  # fmt: skip
    assert admission_losses(_trace(tmp_path, records)) == [(9.5, 0.0)]


def test_a_sync_between_minibatch_updates_ends_when_its_requests_come_back(tmp_path):
    """With a sync after every minibatch update no batch follows the first sync of a step: its window ends at the
    first resumed request, not at the next step's batch (the pool's idle before that is the schedule's own)."""
    records = [{"event": "admit", "at": 0.0}, _busy(0.0, 5.0, 0), _busy(0.0, 5.0, 1),
               {"event": "abort", "at": 5.0, "hold_s": 0.2}, {"event": "loaded", "at": 5.2},
               {"event": "resume", "at": 5.6}, _busy(5.6, 9.0, 0),
               {"event": "abort", "at": 9.0, "hold_s": 0.2}, {"event": "loaded", "at": 9.2},
               {"event": "admit", "at": 9.4}, _busy(9.4, 15.0, 0), _busy(9.4, 15.0, 1)]  # fmt: skip
    losses = admission_losses(_trace(tmp_path, records))
    # the first window is [5, 5.6] (both idle: 0.6 - 0.2), not [5, 9.4]; the second [9, 9.4] (0.4 - 0.2)
    assert losses == [(5.6, pytest.approx(0.4)), (9.4, pytest.approx(0.2))]
    assert losses_by_period(losses, [0.0, 6.0, 12.0]) == pytest.approx([0.4, 0.2])


def test_the_servers_first_weights_are_no_sync_and_a_trace_without_events_loses_nothing(tmp_path):
    records = [{"event": "loaded", "at": 0.0}, {"event": "admit", "at": 30.0}, _busy(30.0, 40.0, 0),
               _busy(30.0, 40.0, 1)]  # fmt: skip
    assert admission_losses(_trace(tmp_path, records)) == []
    assert admission_losses(_trace(tmp_path, [_busy(0.0, 4.0, 0)])) == []
    assert admission_losses(str(tmp_path / "missing.jsonl")) == []


def test_a_feeder_that_admits_at_the_trainers_takes_loses_nothing_at_a_load(tmp_path):
    """in_flight_pipeline under max_untrained_prompts admits when a minibatch takes groups, not at a load: a pool that
    idles after a load because every untrained group has generated is the schedule's own idle, which the model has
    too. Counted as CPU latency it would be taken off that schedule's step (the control: read as if loads handed
    the pool its work, the same trace loses 3 s)."""
    records = [{"event": "admit", "at": 0.0}, _busy(0.0, 6.0, 0), _busy(0.0, 6.0, 1), {"event": "loaded", "at": 5.0},
               {"start": 5.0, "end": 5.2, "kind": "stall"},
               {"event": "admit", "at": 9.0}, _busy(9.0, 15.0, 0), _busy(9.0, 15.0, 1)]  # fmt: skip
    assert admission_losses(_trace(tmp_path, records), loads_hand_work=False) == []
    assert admission_losses(_trace(tmp_path, records)) == [(9.0, pytest.approx(3.0))]
