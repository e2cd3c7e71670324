"""What-if model of ``in_flight_pipeline``'s schedule: price a design option in seconds, before building it.

``make bench`` measures the real trainers (20 minutes); this replays the schedule's critical path offline on the
latency model's own replica arithmetic (:class:`~verl_pipe.bench.replica_model.ReplicaSim`), so a question like
"what would a weight load per minibatch cost?" takes a second. What it keeps of the real mode:

* batches of ``prompts`` groups x ``samples`` requests, lengths drawn from the calibrated profile's distribution;
* the lag bound as the trainer enforces it: the batch trained at step k + 1 + L is admitted at step k's sync, so
  the sampler runs at most L batches ahead (L = ``max_lag``);
* the replica: requests decode together, each decode step streaming the weights and every running request's KV
  cache; at most ``concurrency`` run, the rest wait (earliest deadline first, or in arrival order);
* the reward: ``reward_s`` per sample on ``reward_workers`` workers, as samples finish;
* the trainer: per step, ``MINIBATCHES`` updates of whole finished groups (the first ones to finish first), each
  ``train_s_per_ktoken`` per thousand tokens plus ``trainer_overhead_s`` of real work the model does not cover
  (the CPU's old-log-prob pass, measured at ~0.3 s per minibatch in ``make bench``), then the sync (``sync_s``,
  during which the replica decodes nothing and new requests wait).

And the options it prices: an aborting sync (verl's ``separate_async``: every running request re-prefills its
prefix and rejoins the queue's tail), a later admission (``admit_delay_s``), an in-flight load after every
minibatch (``load_every_minibatch``: versions advance by a fraction of a step, each load stalls the replica and
the trainer for a sync), and loads received beside decoding (``staged_loads``). It is a model of one schedule's critical path, not of the trainers: ``make bench`` on
the same profile measured 3.72-4.12 s per step and a token lag of 0.92-0.93 for ``in_flight_pipeline`` where
this gives 3.92 s and 0.93, and it has no noise, so two options compare on the same draws.

``python -m verl_pipe.bench.schedule_model`` prints the options side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from verl_pipe.bench.latency import LatencyModel
from verl_pipe.bench.pipeline import MINIBATCHES, PROFILES, BenchConfig, calibrate
from verl_pipe.bench.replica_model import ModelledRequest, ReplicaSim, _run_under


@dataclass(frozen=True)
class ScheduleOptions:
    max_lag: int = 1
    aborting_sync: bool = False  # verl's separate_async: a sync cuts every running request, which re-prefills
    load_every_minibatch: bool = False  # an in-flight load after each update, not only at the step's end
    # The replica receives each load into a second weight buffer while it decodes, and swaps between two decode
    # steps: no stall, the new version starts when the transfer ends. The buffer's memory is KV room
    # (LatencyModel.with_staged_loads: a 14B model's 28 GB of the modelled replica's ~110 GB, 48 requests at once
    # instead of 64). What the hf server does on CPU; vLLM's weight RPC holds the engine for the transfer.
    staged_loads: bool = False
    admit_delay_s: float = 0.0  # wall seconds between the sync and the next batch's admission
    concurrency: Optional[int] = None  # requests the replica runs at once (None: the profile's)
    deadline_first: bool = True  # waiting requests start earliest deadline first (else in arrival order)
    trainer_overhead_s: float = 0.35  # wall seconds of unmodelled real work per minibatch update


@dataclass(frozen=True)
class ScheduleEstimate:
    step_s: float  # wall seconds per step, steady state
    sampler_busy: float  # share of the time the replica had requests running
    token_lag: float  # token-weighted mean of (the trainer's pi_old version - the version that sampled the token)


class _Request(ModelledRequest):
    def __init__(self, total: int, prefix: int, deadline: int, order: int, group: tuple[int, int], version: float):
        super().__init__(total=total, decoded=0.0, prefix=prefix, versions=[(0.0, version)])
        self.deadline, self.order, self.group = deadline, order, group


class _Replica(ReplicaSim):
    def __init__(self, model: LatencyModel, deadline_first: bool):
        super().__init__(model)
        self.deadline_first = deadline_first

    def _fill(self) -> None:
        while self.waiting and len(self.running) < self.model.replica_concurrency:
            request = min(self.waiting, key=lambda r: (r.deadline, r.order)) if self.deadline_first else self.waiting[0]
            self.waiting.remove(request)
            request.started_at = self.now
            self._stall_s += request.prefix / self.model.prefill_tokens_per_s
            self.running.append(request)


class _Run:
    """One simulated run: the replica, the reward workers, and the groups' bookkeeping, in modelled seconds."""

    def __init__(self, model: LatencyModel, cfg: BenchConfig, options: ScheduleOptions):
        self.model, self.cfg, self.options = model, cfg, options
        self.replica = _Replica(model, options.deadline_first)
        self.reward_free_at = [0.0] * model.reward_workers
        self.groups: dict[tuple[int, int], list[_Request]] = {}
        self.left: dict[tuple[int, int], int] = {}
        self.rewarded_at: dict[tuple[int, int], float] = {}
        self.version = 0.0
        self._order = 0

    def admit(self, batch: int) -> None:
        for group in range(self.cfg.prompts):
            key = (batch, group)
            self.groups[key], self.left[key], self.rewarded_at[key] = [], self.cfg.samples, 0.0
            for index in range(self.cfg.samples):
                total = self.model.response_tokens([self.cfg.seed, batch, group], index)
                request = _Request(total, self.model.prompt_tokens, batch, self._order, key, self.version)
                self._order += 1
                self.groups[key].append(request)
                self.replica.admit(request)

    def advance_to(self, when: float) -> None:
        while self.replica.now < when - 1e-9:
            step = min(when - self.replica.now, self.replica.time_to_next_finish())
            if math.isinf(step):
                self.replica.advance(when - self.replica.now)
                return
            for request in self.replica.advance(step):
                worker = min(range(len(self.reward_free_at)), key=self.reward_free_at.__getitem__)
                done = max(self.reward_free_at[worker], self.replica.now) + self.model.reward_s
                self.reward_free_at[worker] = done
                self.left[request.group] -= 1
                self.rewarded_at[request.group] = max(self.rewarded_at[request.group], done)

    def ready_at(self, key: tuple[int, int]) -> float:
        """When the group's last sample has been scored (the replica runs until it has generated)."""
        while self.left[key] > 0:
            self.advance_to(self.replica.now + self.replica.time_to_next_finish())
        return self.rewarded_at[key]

    def load(self, version: float, stall_s: float) -> None:
        """New weights reach the replica: it stalls, and every running request decodes the rest under them."""
        self.replica.stall(stall_s)
        for request in [*self.replica.running, *self.replica.waiting]:
            _run_under(request, version)  # a cut request keeps the version of what it had decoded
        self.version = version

    def cut_and_requeue(self) -> None:
        """verl's aborting sync: every running request stops, re-prefills its prefix, and rejoins the queue's tail."""
        cut = list(self.replica.running)
        for request in cut:
            self.replica.running.remove(request)
            request.prefix = self.model.prompt_tokens + int(request.decoded)
            request.order = self._order
            self._order += 1
            self.replica.waiting.append(request)
        self.replica._fill()


def _token_lag(groups: list[list[_Request]], pi_old: float) -> tuple[float, float]:
    lag = tokens = 0.0
    for requests in groups:
        for request in requests:
            points = request.versions + [(float(request.total), None)]
            for (start, version), (end, _) in zip(points, points[1:]):
                lag += (pi_old - version) * (end - start)
                tokens += end - start
    return lag, tokens


def _sync(run: _Run, clock: float, version: float) -> float:
    """The trainer sends ``version`` (``sync_s``); the replica takes it at the start, or at the end when staged."""
    if not run.options.staged_loads:
        run.load(version, run.model.sync_s)
    clock += run.model.sync_s
    run.advance_to(clock)
    if run.options.staged_loads:
        run.load(version, 0.0)
    return clock


def simulate(
    options: ScheduleOptions = ScheduleOptions(),
    profile: str = "coding",
    cfg: Optional[BenchConfig] = None,
    steps: int = 40,
    warmup_steps: int = 4,
) -> ScheduleEstimate:
    """The schedule's steady state on ``profile`` (calibrated as ``make bench`` does) under ``options``."""
    cfg = cfg or BenchConfig()
    model = calibrate(PROFILES[profile], cfg)
    if options.staged_loads:
        model = model.with_staged_loads()
    if options.concurrency is not None:
        model = replace(model, replica_concurrency=options.concurrency)
    run = _Run(model, cfg, options)
    overhead = options.trainer_overhead_s / model.time_scale
    clock = 0.0
    for batch in range(1, options.max_lag + 2):
        run.admit(batch)
    ends, lag, tokens = [], 0.0, 0.0
    for step in range(1, steps + 1):
        keys = sorted(((step, group) for group in range(cfg.prompts)), key=run.ready_at)  # the first done first
        per_minibatch = len(keys) // MINIBATCHES
        for minibatch in range(MINIBATCHES):
            taken = keys[minibatch * per_minibatch : (minibatch + 1) * per_minibatch]
            clock = max(clock, max(run.ready_at(key) for key in taken))
            if step > warmup_steps:
                step_lag, step_tokens = _token_lag([run.groups[key] for key in taken], pi_old=step - 1)
                lag, tokens = lag + step_lag, tokens + step_tokens
            trained = sum(request.total for key in taken for request in run.groups[key])
            clock += overhead + model.train_s_per_ktoken * trained / 1000.0
            run.advance_to(clock)
            if options.load_every_minibatch and minibatch < MINIBATCHES - 1:
                clock = _sync(run, clock, step - 1 + (minibatch + 1) / MINIBATCHES)
        if options.aborting_sync:
            run.cut_and_requeue()
        clock = _sync(run, clock, float(step)) + options.admit_delay_s / model.time_scale
        run.advance_to(clock)
        run.admit(step + options.max_lag + 1)
        ends.append(clock)
    periods = [b - a for a, b in zip(ends[warmup_steps - 1 :], ends[warmup_steps:])]
    return ScheduleEstimate(
        step_s=model.wall(sum(periods) / len(periods)),
        sampler_busy=run.replica.busy_s / run.replica.now,
        token_lag=lag / tokens,
    )


OPTIONS = {
    "in_flight_pipeline (lag 1)": ScheduleOptions(),
    "an aborting sync (verl separate_async)": ScheduleOptions(aborting_sync=True, deadline_first=False),
    "in_flight, a load per minibatch": ScheduleOptions(load_every_minibatch=True),
    "in_flight, admission 0.4 s later": ScheduleOptions(admit_delay_s=0.4),
    "in_flight, 32 requests at once": ScheduleOptions(concurrency=32),
    "in_flight, no unmodelled trainer work": ScheduleOptions(trainer_overhead_s=0.0),
    "in_flight, lag 2": ScheduleOptions(max_lag=2),
    "in_flight, staged loads (48 at once: the buffer's room)": ScheduleOptions(staged_loads=True),
    "  ... and a load per minibatch": ScheduleOptions(staged_loads=True, load_every_minibatch=True),
}


def main() -> None:
    print(f"{'schedule option (coding profile, make bench defaults)':55s} {'step s':>7s} {'busy':>6s} {'tok lag':>7s}")
    for name, options in OPTIONS.items():
        estimate = simulate(options)
        print(f"{name:55s} {estimate.step_s:7.2f} {estimate.sampler_busy:6.1%} {estimate.token_lag:7.2f}")


if __name__ == "__main__":
    main()
