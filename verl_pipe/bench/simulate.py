"""What-if model of every trainer mode on a modelled cluster: a schedule's steady state, offline, in a fraction of a second.

``make bench`` measures the real trainers on the CPU under the latency model (:mod:`.latency`); this replays each
schedule's critical path on the same arithmetic (the sampler pool of :class:`~.replica_model.PoolSim`, the reward
workers, the trainer's phases), with no noise, so it can price many seeds, splits and options: the planner
(:mod:`.plan`) chooses splits and cadences with it, and the benchmark prints it beside its measurements as the
noise-free expectation and in its sensitivity table.

What each schedule does, as the real modes do it (``M`` minibatch updates per step):

* ``sync`` (verl): admit the batch, wait until its last sample is scored, train, sync in place. The pool idles
  while the trainer works and the other way round.
* ``one_off_pipeline``: the sampler generates batch k+1 while the trainer trains batch k; once both are done, the
  sync (the sampler is idle then), and batch k+2 starts.
* ``minibatch_pipeline``: on-policy; the trainer updates on each minibatch of the first scored groups while the
  rest generate; after the last one, the sync and the next batch.
* ``in_flight_pipeline``: the sampler never drains. A group admitted while the sampler holds v_s is due at step
  s + 1 + L (L, the lag bound), and the feeder admits a group whenever the untrained ones fit the steps up to
  its deadline, and, with ``max_untrained``, while fewer groups than that are submitted and not yet taken by a
  minibatch (a place the trainer frees is refilled at once: the real feeder polls); each minibatch takes scored
  groups earliest deadline first (then the longest), and waits while the due groups it would leave do not fit the
  step's later minibatches. New weights load between decode steps without aborting anything: after every
  minibatch update with ``load_every_update``, else once a step. A load between a step's updates waits, as the
  trainer's does, until no group due at this step generates and the groups already scored can fill the step's
  later minibatches; they take groups it reached (tokens newer than the step's pi_old) last.
* ``separate_async`` (verl): ``warmup_batches`` ahead (verl's ``num_warmup_batches``, one by default; a fraction
  is a share of a batch); each step submits a batch; each minibatch takes the oldest scored groups of any batch;
  every ``sync_every`` updates the sync aborts every request in the pool, holds it for the transfer, and
  resubmits each, which pays the prefill of its prompt and of what it had decoded again. With
  ``abort_on_sync=False`` (a what-if, no mode runs it) the sync is an in-flight load instead: the gap between the
  two is all that loading without an abort can win on verl's own schedule.

A weight load under the ``today`` engine stalls every replica for ``sync_s``; under ``staged`` nothing stalls and
the new version starts ``sync_s`` later (the replicas hold fewer requests: the copy's KV room, which the
calibration puts in the latency model). Every schedule gets the same engine.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Optional

from verl_pipe.bench.latency import LatencyModel
from verl_pipe.bench.replica_model import _DONE, ModelledRequest, PoolSim, _run_under

SCHEDULES = ("sync", "separate_async", "one_off_pipeline", "minibatch_pipeline", "in_flight_pipeline")
Key = tuple[int, int]  # (deadline step, serial number of the group)


@dataclass(frozen=True)
class Scenario:
    """One schedule on one layout of the cluster (its latency model), with the schedule's knobs."""

    schedule: str
    model: LatencyModel  # the layout's: replicas, trainer GPUs (train_s_per_ktoken), sync_s, the engine
    prompts: int  # groups per step as the benchmark runs them (each request stands for request_multiplicity)
    samples: int
    minibatches: int = 2
    sync_every: int = 0  # separate_async: minibatch updates per (aborting) sync; 0: one per step
    max_lag: int = 1  # in_flight_pipeline's lag bound
    load_every_update: bool = False  # in_flight_pipeline: a load after every minibatch update, not once a step
    # in_flight_pipeline: groups submitted and not yet taken by a minibatch (its max_untrained_prompts: generating,
    # scoring or waiting for the trainer); 0: only the lag bound limits them
    max_untrained: int = 0
    warmup_batches: float = 1.0  # separate_async: batches submitted ahead of the first (num_warmup_batches)
    trainer_overhead_s: float = 0.0  # modelled trainer seconds per minibatch outside the modelled phases
    # Modelled seconds from a group's admission to its requests reaching the replicas: the driver's path (the
    # dataloader, TransferQueue, the agent loop), for every schedule alike. 0 on a cluster's scale; on the CPU
    # benchmark's clock it is real latency times 1 / time_scale (2026-12-02: a median 0.82 wall s, 3.9 cluster s,
    # per refill on math at --unit-s 12), which is what this prices. A resubmission after an abort is not delayed
    # (the benchmark takes the idle after an abort off instead).
    admission_delay_s: float = 0.0
    # separate_async: verl's sync aborts and resubmits every request; False is a what-if, the same schedule with an
    # in-flight load instead (nothing re-prefilled): the most that loading without an abort can gain on it
    abort_on_sync: bool = True

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.prompts % self.minibatches:
            raise ValueError(f"prompts={self.prompts} must split into {self.minibatches} equal minibatches")
        if (self.sync_every < 0 or self.max_lag < 0 or self.max_untrained < 0 or self.warmup_batches < 0
                or self.admission_delay_s < 0):  # fmt: skip
            raise ValueError("sync_every, max_lag, max_untrained, warmup_batches and admission_delay_s must be >= 0")


@dataclass(frozen=True)
class Estimate:
    step_s: float  # modelled seconds per step, steady state
    sampler_busy: float  # the sampler pool's GPU-time share at work (replicas averaged)
    trainer_busy: float  # the share of the step the trainer spends training
    token_lag: float  # token-weighted mean of (pi_old's version - the version that sampled the token)


class _Request(ModelledRequest):
    def __init__(self, total: int, prefix: int, group: Key, version: float):
        super().__init__(total=total, decoded=0.0, prefix=prefix, versions=[(0.0, version)])
        self.group = group


class _World:
    """The sampler pool, the reward workers and the groups' bookkeeping, in modelled seconds."""

    def __init__(self, scenario: Scenario, seed: int):
        self.s, self.model, self.seed = scenario, scenario.model, seed
        self.pool = PoolSim(self.model)
        self.reward_free_at = [0.0] * self.model.reward_workers
        self.groups: dict[Key, list[_Request]] = {}  # admitted, not yet trained
        self.generating: dict[Key, int] = {}  # samples of the group still generating
        self.scored_at: dict[Key, float] = {}  # when its last sample's reward ends (once it has generated)
        self.tokens: dict[Key, int] = {}
        self.version = 0.0
        self.serial = 0
        self.train_s = 0.0  # modelled seconds the trainer spent training
        self.arriving: list[tuple[float, list[_Request]]] = []  # admitted groups on their way to the replicas

    @property
    def now(self) -> float:
        return self.pool.now

    # --- the sampler -----------------------------------------------------------------------------------------

    def admit_group(self, deadline: int) -> Key:
        key = (deadline, self.serial)
        self.serial += 1
        self.groups[key], self.generating[key] = [], self.s.samples
        for index in range(self.s.samples):
            total = self.model.response_tokens([self.seed, key[1]], index)
            self.groups[key].append(_Request(total, self.model.prompt_tokens, key, self.version))
        self.tokens[key] = sum(request.total for request in self.groups[key])
        if self.s.admission_delay_s > 0:
            self.arriving.append((self.now + self.s.admission_delay_s, self.groups[key]))
        else:
            for request in self.groups[key]:
                self.pool.admit(request)
        return key

    def _arrive(self, requests: list[_Request]) -> None:
        """A delayed group reaches the replicas: it starts under the weights they hold now."""
        for request in requests:
            request.versions = [(0.0, self.version)]
            self.pool.admit(request)

    def admit(self, step: int) -> list[Key]:
        return [self.admit_group(step) for _ in range(self.s.prompts)]

    def _finished(self, request: _Request) -> None:
        worker = min(range(len(self.reward_free_at)), key=self.reward_free_at.__getitem__)
        done = max(self.reward_free_at[worker], self.now) + self.model.reward_s
        self.reward_free_at[worker] = done
        key = request.group
        self.generating[key] -= 1
        self.scored_at[key] = max(self.scored_at.get(key, 0.0), done)

    def advance_to(self, when: float) -> None:
        while self.arriving and self.arriving[0][0] <= when + 1e-9:  # in admission order, so in arrival order
            at, requests = self.arriving.pop(0)
            self._advance_pool_to(at)
            self._arrive(requests)
        self._advance_pool_to(when)

    def _advance_pool_to(self, when: float) -> None:
        while self.now < when - 1e-9:
            for request in self.pool.advance(min(when - self.now, self.pool.time_to_next_finish())):
                self._finished(request)

    def _next_event(self) -> None:
        """Advance to the next request that finishes, reward that ends or delayed group that arrives, whichever is
        first."""
        rewards = [t for key, t in self.scored_at.items() if t > self.now + 1e-9 and key in self.groups]
        arrivals = [at for at, _ in self.arriving[:1]]
        target = min(self.now + self.pool.time_to_next_finish(), min(rewards, default=math.inf),
                     min(arrivals, default=math.inf))  # fmt: skip
        if math.isinf(target):
            raise RuntimeError("the simulated schedule waits for a pool with nothing running")
        self.advance_to(target)

    def ready(self, key: Key) -> bool:
        return self.generating[key] == 0 and self.scored_at[key] <= self.now + 1e-9

    def wait_all(self, keys: list[Key]) -> None:
        while not all(self.ready(key) for key in keys):
            self._next_event()

    def wait_generated(self, keys: list[Key]) -> None:
        """Until every request of the groups has generated (their rewards may still run)."""
        while any(self.generating[key] for key in keys):
            self._next_event()

    # --- weights ---------------------------------------------------------------------------------------------

    def load(self, version: float) -> None:
        """New weights reach every replica without aborting anything; the trainer waits for the transfer.
        ``today``: every replica stalls for it. ``staged``: nothing stalls; the version switches at its end."""
        if not self.model.staged_loads:
            self.pool.stall(self.model.sync_s)
            self._switch(version)
            self.advance_to(self.now + self.model.sync_s)
        else:
            self.advance_to(self.now + self.model.sync_s)
            self._switch(version)

    def _switch(self, version: float) -> None:
        for request in [*self.pool.running, *self.pool.waiting]:
            _run_under(request, version)
        self.version = version

    def aborting_sync(self, version: float) -> None:
        """verl's ``update_weights``: abort every request, hold the pool for the transfer, then resubmit each with
        its prefix (prompt + what it had decoded) to prefill again. On a ``staged`` engine the requests decode on
        while the weights arrive, and the abort comes with the swap, at the transfer's end."""
        if self.model.staged_loads:
            self.advance_to(self.now + self.model.sync_s)
            cut = self.pool.take_all()
        else:
            cut = self.pool.take_all()
            self.advance_to(self.now + self.model.sync_s)
        self.version = version
        for request in cut:
            request.prefix = self.model.prompt_tokens + int(request.decoded)
            _run_under(request, version)
            self.pool.admit(request)

    # --- the trainer -------------------------------------------------------------------------------------------

    def train(self, keys: list[Key]) -> None:
        """One update on these groups (old log-probs included) while the pool runs on."""
        seconds = self.s.trainer_overhead_s + self.model.train_s(sum(self.tokens[key] for key in keys))
        self.train_s += seconds
        self.advance_to(self.now + seconds)

    def newest_version(self, key: Key) -> float:
        """The newest version that decoded a token of the group so far."""
        newest = -math.inf
        for request in self.groups[key]:
            points = request.versions + [(float(request.decoded), None)]
            newest = max([newest] + [v for (start, v), (end, _) in zip(points, points[1:]) if end > start + _DONE])
        return newest

    def token_lag(self, keys: list[Key], pi_old: float) -> tuple[float, float]:
        lag = tokens = 0.0
        for key in keys:
            for request in self.groups[key]:
                points = request.versions + [(float(request.total), None)]
                for (start, version), (end, _) in zip(points, points[1:]):
                    lag += (pi_old - version) * (end - start)
                    tokens += end - start
        return lag, tokens

    def forget(self, keys: list[Key]) -> None:
        for key in keys:
            del self.groups[key], self.generating[key], self.tokens[key]
            self.scored_at.pop(key, None)


Record = Callable[[int, list[Key], float], None]


def _sync(w: _World, steps: int, record: Record) -> None:
    for step in range(1, steps + 1):
        keys = w.admit(step)
        w.wait_all(keys)
        w.train(keys)
        w.load(float(step))  # in place, on the GPUs that trained (the layout's sync_s)
        record(step, keys, step - 1)


def _one_off(w: _World, steps: int, record: Record) -> None:
    batches = {1: w.admit(1)}
    w.wait_generated(batches[1])
    batches[2] = w.admit(2)
    for step in range(1, steps + 1):
        w.wait_all(batches[step])
        w.train(batches[step])
        w.wait_generated(batches[step + 1])
        w.load(float(step))
        batches[step + 2] = w.admit(step + 2)
        record(step, batches.pop(step), step - 1)


def _take(w: _World, count: int, candidates: Callable[[], list[Key]], order, may_take=lambda picked: True) -> list[Key]:
    """Wait until ``count`` of the candidates are ready (and ``may_take`` allows the pick); returns the first in
    ``order``."""
    while True:
        ready = sorted((key for key in candidates() if w.ready(key)), key=order)
        if len(ready) >= count and may_take(ready[:count]):
            return ready[:count]
        w._next_event()


def _minibatch(w: _World, steps: int, record: Record) -> None:
    per = w.s.prompts // w.s.minibatches
    for step in range(1, steps + 1):
        batch, taken = w.admit(step), []
        for _ in range(w.s.minibatches):
            keys = _take(w, per, lambda: [k for k in batch if k not in taken], order=lambda k: w.scored_at[k])
            w.train(keys)
            taken += keys
        w.load(float(step))
        record(step, taken, step - 1)


def _in_flight(w: _World, steps: int, record: Record) -> None:
    lag, per, batch = w.s.max_lag, w.s.prompts // w.s.minibatches, w.s.prompts
    slots = batch * (lag + 1)  # max_in_flight_prompts' default: groups generating at once
    synced = 0  # the version the sampler serves (whole steps; loads within a step do not move deadlines)
    untrained: set[Key] = set()
    # the step the feeder admits for and the groups that step took so far (the feeder runs between the hooks)
    at = {"next_step": 1, "taken_this_step": 0}

    def feed() -> None:
        """Admit what the bound allows: the steps from the next one to the new group's deadline train ``batch``
        groups each, and hold every untrained group (the groups this step took count against its own batch); no
        more than ``slots`` generate at once, and no more than ``max_untrained`` wait for the trainer."""
        deadline = synced + 1 + lag
        room = batch * max(0, deadline - at["next_step"] + 1) - len(untrained) - at["taken_this_step"]
        free_slots = slots - sum(1 for k in untrained if w.generating[k])
        if w.s.max_untrained:
            free_slots = min(free_slots, w.s.max_untrained - len(untrained))
        for _ in range(min(room, free_slots)):
            untrained.add(w.admit_group(deadline))

    feed()
    for step in range(1, steps + 1):
        taken: list[Key] = []
        unsent: Optional[float] = None  # a minibatch update's weights, held (the trainer's _load_update)

        def newer(key: Key, step=step) -> bool:  # a token from weights newer than the step's pi_old
            return w.newest_version(key) > step - 1 + _DONE

        def load_if_the_step_is_covered(later: int, step=step, taken=taken) -> None:
            """Send the held load once no group due now generates and scored groups can fill the later minibatches."""
            nonlocal unsent
            if unsent is None:
                return
            rest = [k for k in untrained if k not in taken]
            if any(k[0] <= step and not w.ready(k) for k in rest):
                return
            if sum(1 for k in rest if w.ready(k) and not newer(k)) < later:
                return
            version, unsent = unsent, None
            w.load(version)

        for minibatch in range(w.s.minibatches):
            later = per * (w.s.minibatches - 1 - minibatch)  # what the step's later minibatches still take

            def leaves_room(picked: list[Key], step=step, later=later, taken=taken) -> bool:
                due_left = [k for k in untrained if k[0] <= step and k not in picked and k not in taken]
                return len(due_left) <= later

            keys = _take(w, per, lambda: [k for k in untrained if k not in taken],
                         order=lambda k: (newer(k), k[0], -w.tokens[k]), may_take=leaves_room)  # fmt: skip
            untrained.difference_update(keys)
            at.update(next_step=step, taken_this_step=len(taken) + len(keys))  # taken before the update trains
            if minibatch == w.s.minibatches - 1:
                at.update(next_step=step + 1, taken_this_step=0)
            feed()  # the feeder sees the taken groups' places while the update runs
            load_if_the_step_is_covered(later)  # one held since the last update: its groups are taken now
            w.train(keys)
            taken += keys
            feed()
            if w.s.load_every_update and minibatch < w.s.minibatches - 1:
                unsent = step - 1 + (minibatch + 1) / w.s.minibatches
                load_if_the_step_is_covered(later)
        w.load(float(step))  # supersedes a load still held
        synced = step
        feed()
        record(step, taken, step - 1)


def _separate_async(w: _World, steps: int, record: Record) -> None:
    per = w.s.prompts // w.s.minibatches
    sync_every = w.s.sync_every or w.s.minibatches
    w.admit(1)
    for _ in range(int(w.s.warmup_batches * w.s.prompts)):  # verl's warm-up groups, whole prompts rounded down
        w.admit_group(2)
    updates = 0
    for step in range(1, steps + 1):
        taken: list[Key] = []
        for _ in range(w.s.minibatches):
            keys = _take(w, per, lambda: [k for k in w.groups if k not in taken],
                         order=lambda k: (k[0], w.scored_at[k]))  # fmt: skip
            w.train(keys)
            taken += keys
            updates += 1
            if updates % sync_every == 0:
                sync = w.aborting_sync if w.s.abort_on_sync else w.load
                sync(step - 1 + len(taken) / w.s.prompts)
        w.admit(step + 2)  # the next step's prompts join the batch already ahead
        record(step, taken, step - 1)


_RUNS = {"sync": _sync, "one_off_pipeline": _one_off, "minibatch_pipeline": _minibatch,
         "in_flight_pipeline": _in_flight, "separate_async": _separate_async}  # fmt: skip


def simulate(scenario: Scenario, seed: int = 0, steps: int = 20, warmup_steps: int = 4) -> Estimate:
    """The scenario's steady state over ``steps`` (the first ``warmup_steps`` left out), on one seed's draws."""
    world = _World(scenario, seed)
    marks: dict[int, tuple[float, float, float]] = {}  # step -> (time, pool busy, trainer busy) at its end
    lags = [0.0, 0.0]

    def record(step: int, keys: list[Key], pi_old: float) -> None:
        marks[step] = (world.now, world.pool.busy_s, world.train_s)
        if step > warmup_steps:
            lag, tokens = world.token_lag(keys, pi_old)
            lags[0], lags[1] = lags[0] + lag, lags[1] + tokens
        world.forget(keys)

    _RUNS[scenario.schedule](world, steps, record)
    (t0, busy0, train0), (t1, busy1, train1) = marks[warmup_steps], marks[steps]
    return Estimate(
        step_s=(t1 - t0) / (steps - warmup_steps),
        sampler_busy=(busy1 - busy0) / (t1 - t0),
        trainer_busy=(train1 - train0) / (t1 - t0),
        token_lag=lags[0] / lags[1] if lags[1] else 0.0,
    )


@dataclass(frozen=True)
class Summary:
    """A scenario over seeds: the noise-free expectation beside the benchmark's measurements."""

    step_s: float
    step_s_sd: float  # between seeds (the draws of response lengths)
    sampler_busy: float
    trainer_busy: float
    token_lag: float
    seeds: int


def over_seeds(scenario: Scenario, seeds: int = 30, **kwargs) -> Summary:
    runs = [simulate(scenario, seed=seed, **kwargs) for seed in range(seeds)]
    steps = [run.step_s for run in runs]
    return Summary(
        step_s=statistics.mean(steps),
        step_s_sd=statistics.stdev(steps) if len(steps) > 1 else 0.0,
        sampler_busy=statistics.mean(run.sampler_busy for run in runs),
        trainer_busy=statistics.mean(run.trainer_busy for run in runs),
        token_lag=statistics.mean(run.token_lag for run in runs),
        seeds=seeds,
    )
