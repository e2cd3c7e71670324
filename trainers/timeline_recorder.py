"""Who was busy when in a pipelined run, recorded as it happens, and the step metrics measured from it.

* The trainer's phases (waiting for samples, training, syncing, validating) go on the ``trainer`` track, and
  the seconds of its syncs become ``pipeline/time/*`` and ``pipeline/trainer_bubble_frac``.
* Each batch runs on the ``sampler`` track from its submission to its last sample's generation, and each
  sample's scoring on the ``reward`` track; both come from the ``interleaved`` reward manager's timestamps
  (without them only the trainer's track is drawn). The sampler's busy time gives
  ``pipeline/sampler_idle_frac``.

The trace format itself (a chrome trace, interval arithmetic) is :mod:`.timeline`.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Optional

from verl_pipe.reward_manager.hooks import v1_reward_infos
from verl_pipe.trainers.timeline import Interval, Timeline, busy_seconds


class TimelineRecorder:
    def __init__(self, timeline: Optional[Timeline]):
        self.timeline = timeline  # None: the trace is off, the metrics are still measured
        self.phase_s: dict[str, float] = {}  # this step's seconds per phase (sync, sync_inside_gen)
        self._open_phase: tuple[str, float] | None = None  # the trainer's current interval
        self._submitted_at: dict[int, float] = {}  # batch tag (the step that trains it) -> submission time
        self._window_start = time.time()

    # --- the trainer's track -------------------------------------------------------------------------------------

    @property
    def current_phase(self) -> Optional[str]:
        return self._open_phase[0] if self._open_phase else None

    def enter(self, name: Optional[str]) -> None:
        """Close the trainer's current interval and open ``name`` (None: the trainer is between phases)."""
        now = time.time()
        if self._open_phase is not None and self.timeline is not None:
            self.timeline.add("trainer", self._open_phase[0], self._open_phase[1], now)
        self._open_phase = (name, now) if name else None

    def add_seconds(self, phase: str, seconds: float) -> None:
        self.phase_s[phase] = self.phase_s.get(phase, 0.0) + seconds

    def time_metrics(self, timing_raw: dict) -> dict[str, float]:
        """Where the step's time went: waiting for samples (less syncs inside verl's "gen" timer), syncs, training."""
        step_s = float(timing_raw.get("step", 0.0)) or 1e-9
        wait_s = max(0.0, float(timing_raw.get("gen", 0.0)) - self.phase_s.get("sync_inside_gen", 0.0))
        sync_s = self.phase_s.get("sync", 0.0)
        return {
            "pipeline/time/gen_wait_s": wait_s,
            "pipeline/time/sync_s": sync_s,
            "pipeline/time/train_s": max(0.0, step_s - wait_s - sync_s),
            "pipeline/trainer_bubble_frac": min(1.0, (wait_s + sync_s) / step_s),
        }

    # --- the sampler's and reward workers' tracks ----------------------------------------------------------------

    def batch_submitted(self, step: int) -> None:
        self._submitted_at.setdefault(step, time.time())

    def record_step(self, batch, sample_tags, metrics, replay_buffer) -> None:
        """Sampler and reward intervals of the step's samples (``batch``: keys and partition), the sampler's idle
        share of this step, and the trace rewritten; then the next step's phase seconds start from zero."""
        now = time.time()
        infos = [info for info in v1_reward_infos(batch) if "reward_enqueue_ts" in info]
        tags = sorted({int(tag["global_steps"]) for tag in sample_tags})
        sampler: list[Interval] = []
        if infos:
            # A sample's generation ended when the reward manager enqueued it.
            generated_until = max(float(info["reward_enqueue_ts"]) for info in infos)
            for tag in tags:
                if tag in self._submitted_at:
                    sampler.append(Interval("sampler", f"generate B{tag}", self._submitted_at.pop(tag), generated_until))
            for info in infos:
                if self.timeline is not None:
                    self.timeline.add("reward", "score", float(info["reward_start_ts"]), float(info["reward_end_ts"]))
        if self.timeline is not None:
            for interval in sampler:
                self.timeline.add(interval.track, interval.name, interval.start, interval.end)
            self.timeline.write()
        if infos:
            # Batches submitted and not yet trained (one-off's prefetch) by their real end too, or now if running.
            replay_buffer._sync_metadata_from_transfer_queue()
            in_flight = [
                Interval("sampler", "", start, _generation_end(replay_buffer, tag, now))
                for tag, start in self._submitted_at.items()
            ]
            known = (self.timeline.track("sampler") if self.timeline is not None else sampler) + in_flight
            window = max(now - self._window_start, 1e-9)
            metrics["pipeline/sampler_idle_frac"] = 1.0 - busy_seconds(known, self._window_start, now) / window
        self._window_start = now
        self.phase_s = {}


def _generation_end(replay_buffer, tag: int, now: float) -> float:
    """When the untrained batch ``tag`` finished generating (its last reward enqueue), or ``now`` if it has not.

    Reads the replay buffer's metadata snapshot; the caller re-reads TransferQueue once for all batches.
    """
    uids = {uid for uid, step in replay_buffer.prompt_global_steps["train"].items() if step == tag}
    if not uids or uids & (replay_buffer.pending_keys["train"] | replay_buffer.running_keys["train"]):
        return now
    keys = [key for key in replay_buffer.partitions["train"] if key.split("_")[0] in uids]
    infos = v1_reward_infos(SimpleNamespace(keys=keys, partition_id="train")) if keys else []
    ends = [float(info["reward_enqueue_ts"]) for info in infos if "reward_enqueue_ts" in info]
    return max(ends) if ends else now
