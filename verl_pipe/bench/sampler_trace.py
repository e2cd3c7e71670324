"""The sampler pool's trace: what a run's modelled replicas did, on the wall clock, and what the benchmark reads
from it.

Each modelled replica (:class:`~.replica_model.ModelledReplica`) appends, one JSON object per line, to the file
named by ``SAMPLER_TRACE_ENV`` (set per run, in the job's env):

* a header ``{"replicas": n}``, once;
* spans ``{"start", "end", "replica"}`` in which a replica had requests running, and ``"kind": "stall"`` spans in
  which an in-flight weight load held every replica's running requests (nothing is generated then);
* events ``{"event", "at"}``: ``abort`` (a sync aborted every request; ``hold_s``, the wall seconds the model holds
  the pool empty for the transfer), ``loaded`` (new weights in place), ``admit`` (a new request arrived) and
  ``resume`` (an aborted request came back).

From the spans come the pool's busy share and the sampler lanes of the side-by-side picture. From the events comes
the sampler's share of the real CPU work the model does not price (:func:`admission_losses`): what the model runs
at once after a sync (the aborted requests resubmitted, the next batch admitted) takes real milliseconds on the CPU
(verl's metrics and logging between steps, its dataloader, TransferQueue and agent loop, the partial-rollout
client's round trip), which the time scale turns into cluster seconds in which replicas idle.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional, Sequence

SAMPLER_TRACE_ENV = "VERL_PIPE_SAMPLER_TRACE"


def sampler_trace_path(run_dir: str) -> str:
    """Where a benchmark run's replicas write their trace (the run sets ``SAMPLER_TRACE_ENV`` to it)."""
    return os.path.join(run_dir, "sampler_busy.jsonl")


class TraceWriter:
    """Appends a pool's spans and events to the file ``SAMPLER_TRACE_ENV`` names (nothing when it is unset)."""

    def __init__(self, replicas: int):
        self.replicas = replicas
        self._started = False

    def span(self, start: float, end: float, kind: str = "busy", replica: Optional[int] = None) -> None:
        record: dict[str, Any] = {"start": start, "end": end}
        if kind != "busy":
            record["kind"] = kind
        if replica is not None:
            record["replica"] = replica
        self._append(record)

    def event(self, name: str, **fields: float) -> None:
        self._append({"event": name, "at": time.time(), **fields})

    def _append(self, record: dict) -> None:
        path = os.environ.get(SAMPLER_TRACE_ENV)
        if not path:
            return
        with open(path, "a", encoding="utf-8") as handle:
            if not self._started:  # how many replicas the pool has, for their mean busy share
                handle.write(json.dumps({"replicas": self.replicas}) + "\n")
                self._started = True
            handle.write(json.dumps(record) + "\n")


# --- reading ------------------------------------------------------------------------------------------------------


def _records(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [r for r in map(json.loads, handle) if r]


def _replica_count(records: list[dict]) -> int:
    return int(next((r for r in records if "replicas" in r), {"replicas": 1})["replicas"])


def _merge(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _cut(busy: list[tuple[float, float]], stalls: list[tuple[float, float]]) -> list[tuple[float, float]]:
    for stall_start, stall_end in stalls:
        cut: list[tuple[float, float]] = []
        for start, end in busy:
            if end <= stall_start or start >= stall_end:
                cut.append((start, end))
                continue
            if start < stall_start:
                cut.append((start, stall_start))
            if end > stall_end:
                cut.append((stall_end, end))
        busy = cut
    return busy


def _holding_spans(records: list[dict], replica: Optional[int]) -> list[tuple[float, float]]:
    """The merged spans in which the replica (or any, for None) held requests, stalled or not."""
    return _merge([(float(r["start"]), float(r["end"])) for r in records
                   if "start" in r and r.get("kind", "busy") == "busy"
                   and (replica is None or r.get("replica", 0) == replica)])  # fmt: skip


def load_busy_spans(path: str, replica: Optional[int] = None) -> list[tuple[float, float]]:
    """The spans in which a run's modelled replicas generated: busy spans merged where they overlap (every
    replica's, or only ``replica``'s), less the in-flight weight loads that held their requests."""
    records = _records(path)
    stalls = _merge([(float(r["start"]), float(r["end"])) for r in records if r.get("kind") == "stall"])
    return _cut(_holding_spans(records, replica), stalls)


def busy_share(spans: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """The share of ``[start, end]`` covered by (merged) busy spans."""
    if end <= start:
        return 0.0
    covered = sum(max(0.0, min(e, end) - max(s, start)) for s, e in spans)
    return covered / (end - start)


def pool_busy_share(path: str, start: float, end: float) -> Optional[float]:
    """The sampler pool's busy share of ``[start, end]``: each replica's, averaged (GPU time at work over GPU time
    held), or None without a trace."""
    records = _records(path)
    if not records:
        return None
    shares = [busy_share(load_busy_spans(path, replica=index), start, end) for index in range(_replica_count(records))]
    return sum(shares) / len(shares)


def _sync_windows(events: list[dict], loads_hand_work: bool = True) -> list[tuple[float, float, float]]:
    """(start, end, idle the model has in it) per sync: from the sync (an abort, or a load no abort began) to the
    moment the model gives the pool its work back. That is the first new request admitted before the next sync
    (every schedule admits the next batch, or feeds, straight after its step's sync), else the first aborted
    request resumed (a sync between minibatch updates). The model holds the pool empty for ``hold_s`` after an
    abort, and for nothing after a load (an in-flight load's stall holds requests: it is not idle).

    ``loads_hand_work=False``: a load is no such moment, only an abort is. A feeder that admits when the trainer
    takes groups (in_flight_pipeline under ``max_untrained_prompts``) hands the pool nothing at a load, and an
    idle pool after one is the schedule's own (every untrained group generated, the trainer behind), which the
    model has too."""
    windows: list[tuple[float, float, float]] = []
    # the weights a server starts with are no sync: the first one comes after a request
    index = next((i for i, event in enumerate(events) if event["event"] in ("admit", "resume")), len(events))
    starts = ("abort", "loaded") if loads_hand_work else ("abort",)
    while index < len(events):
        event = events[index]
        if event["event"] not in starts:
            index += 1
            continue
        start, expected = float(event["at"]), float(event.get("hold_s", 0.0))
        index += 1
        if event["event"] == "abort" and index < len(events) and events[index]["event"] == "loaded":
            index += 1  # the load that ends this abort's transfer belongs to the same sync
        first_admit = first_resume = None
        scan = index
        while scan < len(events) and events[scan]["event"] not in ("abort", "loaded"):
            name, at = events[scan]["event"], float(events[scan]["at"])
            if name == "admit" and first_admit is None:
                first_admit = at
            elif name == "resume" and first_resume is None:
                first_resume = at
            scan += 1
        end = first_admit if first_admit is not None else first_resume
        if end is not None:
            windows.append((start, end, expected))
    return windows


def admission_losses(path: str, loads_hand_work: bool = True) -> list[tuple[float, float]]:
    """(when the pool got its work back, wall seconds of the pool lost) per sync: the replicas' idle time in the
    sync's window (:func:`_sync_windows`), averaged over the replicas, beyond what the model idles there. That is
    the real CPU latency between a sync and the work the model hands the pool at once; [] without events."""
    records = _records(path)
    events = sorted((r for r in records if "event" in r), key=lambda r: float(r["at"]))
    if not events:
        return []
    replicas = _replica_count(records)
    holding = [_holding_spans(records, index) for index in range(replicas)]
    losses = []
    for start, end, expected in _sync_windows(events, loads_hand_work):
        idle = sum((end - start) * (1.0 - busy_share(spans, start, end)) for spans in holding) / replicas
        losses.append((end, max(0.0, idle - expected)))
    return losses


def losses_by_period(losses: list[tuple[float, float]], stamps: Sequence[float]) -> list[float]:
    """The pool's lost wall seconds per period ``[stamps[i], stamps[i + 1]]``, each loss in the period in which
    the pool got its work back (the step whose samples it delayed)."""
    return [sum(lost for at, lost in losses if begin < at <= end) for begin, end in zip(stamps, stamps[1:])]
