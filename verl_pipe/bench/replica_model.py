"""A modelled GPU rollout replica: when each request would end, given everything else the replica runs.

Decode is memory-bound (the roofline of :mod:`verl_pipe.bench.cluster`): each decode step streams the weights once
and the KV cache of every running request, and gives each running request one token. A step therefore costs
``1 / decode_tokens_per_s + kv_step_s_per_ktoken * context / 1000`` modelled seconds, where ``context`` is the
number of tokens all running requests hold (prompt plus what they decoded so far). A replica full of long
requests decodes each of them slower; the tail of a batch, with few requests left, decodes faster than its
middle. At most ``replica_concurrency`` requests run at once; the rest wait in arrival order. Admitting a
request prefills its prefix (the prompt, plus the tokens it already had if it resumes after an abort) at
``prefill_tokens_per_s``, and the replica decodes nothing meanwhile (a prefill takes the whole GPU).

:class:`ReplicaSim` is the arithmetic, with no clock: the benchmark's calibration runs it offline. The rollout
servers drive it in real time through :class:`ModelledReplica`, the latency model's filling of their
generation-timing slot (:mod:`verl_pipe.backends.cpu.generation_timing`): the tokens are real, the time each
request takes is the modelled replica's, scaled by ``time_scale``.

A weight sync that aborts the replica's requests (verl's ``update_weights`` does, before it loads) ends them
where the model has got to: the server returns the share of the real answer that the modelled request had
decoded, marked aborted, and verl resubmits the rest under the new weights. The resumed request pays the prefill
of its whole prefix again, and the sample records both policy versions.

An in-flight load (PipelineRL-style, :meth:`ModelledReplica.weights_loaded` with ``in_flight``) aborts nothing:
the replica stalls for ``sync_s`` while the weights load between two decode steps, then every running request
decodes the rest under the new version, its KV cache kept. The answer is whole; each modelled request records
where it switched version, and ``serve`` tags each real token with the version in force at the matching modelled
token (``global_steps``, ``min_``/``max_global_steps``, and ``token_versions`` when they differ). A replica that
stages its loads (``staged_loads``: what the ``hf`` server does) does not stall: it receives the weights beside
decoding, and the running requests switch version when the modelled transfer ends, ``sync_s`` after the load
began. Versions may be fractions of a step (a load after each of a step's minibatch updates).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, Sequence, TypeVar

from verl_pipe.bench.sampler_trace import TraceWriter
from verl_pipe.trainers.token_lag import MODELLED_RUNS_KEY

if TYPE_CHECKING:
    from verl_pipe.bench.latency import LatencyModel

Answer = TypeVar("Answer")
_TRACE_FLUSH_S = 0.5  # wall seconds: the longest a busy span waits before it is written
_DONE = 1e-9  # tokens left below which a request has finished (the arithmetic is in floats)


@dataclass
class ModelledRequest:
    total: int  # modelled response tokens of the whole answer (including any decoded before an abort)
    decoded: float  # modelled tokens decoded so far
    prefix: int  # modelled tokens to prefill when admitted: prompt, plus `decoded` if it resumes
    started_at: float = math.nan  # replica time of admission
    # (decoded when it switched, policy version from then on), in order: the version in force at admission or
    # resume first, then each in-flight load while it runs (None: the replica was never told a version)
    versions: list[tuple[float, Optional[float]]] = field(default_factory=list)

    @property
    def remaining(self) -> float:
        return self.total - self.decoded


class ReplicaSim:
    """A replica's decode and prefill arithmetic over modelled time (no clock: ``advance`` moves it)."""

    def __init__(self, model: "LatencyModel"):
        self.model = model
        self.now = 0.0  # modelled seconds since the replica was made
        self.running: list[ModelledRequest] = []
        self.waiting: deque[ModelledRequest] = deque()
        self._stall_s = 0.0  # prefill and weight loads still to run before decoding resumes
        self._load_s = 0.0  # of which weight loads: time that passes, but no work
        self.busy_s = 0.0  # modelled seconds decoding or prefilling (not waiting for a load)

    # --- the roofline ---------------------------------------------------------------------------------------

    @property
    def _weights_step_s(self) -> float:
        """A decode step's fixed part: streaming the weights, or, with many requests running, their matmuls
        (compute-bound beyond a few hundred on a GPU: 2 x params FLOPs per request)."""
        compute = self.model.decode_compute_s_per_request * self._weight * len(self.running)
        return max(1.0 / self.model.decode_tokens_per_s, compute)

    @property
    def _kv_step_s_per_token(self) -> float:
        return self.model.kv_step_s_per_ktoken / 1000.0

    @property
    def _weight(self) -> int:
        """The cluster's requests each modelled request stands for (LatencyModel.request_multiplicity)."""
        return self.model.request_multiplicity

    def _context(self) -> float:
        return self._weight * sum(self.model.prompt_tokens + r.decoded for r in self.running)

    def _steps_time(self, steps: float) -> float:
        """Modelled seconds for ``steps`` decode steps of the running requests (each step adds one token each)."""
        n, k = self._weight * len(self.running), self._kv_step_s_per_token
        return steps * (self._weights_step_s + k * self._context()) + k * n * steps * (steps - 1) / 2

    def _steps_within(self, seconds: float) -> float:
        """How many decode steps (fractional) fit in ``seconds``: the positive root of ``_steps_time(m) = s``."""
        n, k = self._weight * len(self.running), self._kv_step_s_per_token
        a = k * n / 2
        b = self._weights_step_s + k * self._context() - a
        if a <= 0:
            return seconds / b
        return (-b + math.sqrt(b * b + 4 * a * seconds)) / (2 * a)

    # --- requests -------------------------------------------------------------------------------------------

    def admit(self, request: ModelledRequest) -> None:
        self.waiting.append(request)
        self._fill()

    def _has_room(self) -> bool:
        """Whether one more request fits the replica's concurrency (a replica always runs at least one)."""
        return not self.running or (len(self.running) + 1) * self._weight <= self.model.replica_concurrency

    def _fill(self) -> None:
        while self.waiting and self._has_room():
            request = self.waiting.popleft()
            request.started_at = self.now
            self._stall_s += self._weight * request.prefix / self.model.prefill_tokens_per_s
            self.running.append(request)

    @property
    def pending_stall_s(self) -> float:
        """Prefill and load time still to run before decoding resumes."""
        return self._stall_s

    def stall(self, seconds: float) -> None:
        """The replica decodes nothing for ``seconds`` (an in-flight weight load); the time passes, running or not,
        and is not busy time (nothing is generated)."""
        self._stall_s += max(0.0, seconds)
        self._load_s += max(0.0, seconds)

    def remove(self, request: ModelledRequest) -> None:
        """Take a request out (aborted, or its real generation failed); whatever it decoded stays decoded."""
        if request in self.running:
            self.running.remove(request)
            self._fill()
        elif request in self.waiting:
            self.waiting.remove(request)

    def time_to_next_finish(self) -> float:
        """Modelled seconds until the next running request ends (inf with none running)."""
        if not self.running:
            return math.inf
        return self._stall_s + self._steps_time(min(r.remaining for r in self.running))

    def advance(self, seconds: float) -> list[ModelledRequest]:
        """Move the replica ``seconds`` forward; returns the requests that finished, in finishing order."""
        finished: list[ModelledRequest] = []
        while seconds > 0:
            stall = min(self._stall_s, seconds)
            load = min(self._load_s, stall)  # a load holds the replica first, then the prefills due
            self._stall_s -= stall
            self._load_s -= load
            self.now += stall
            if self.running:  # prefill is work; a load's wait is not
                self.busy_s += stall - load
            seconds -= stall
            if seconds <= 0 or not self.running:
                break
            to_finish = min(r.remaining for r in self.running)
            step_s = self._steps_time(to_finish)
            steps = to_finish if step_s <= seconds else self._steps_within(seconds)
            spent = min(step_s, seconds)
            for request in self.running:
                request.decoded = min(request.total, request.decoded + steps)
            self.now += spent
            self.busy_s += spent
            seconds -= spent
            done = [r for r in self.running if r.remaining <= _DONE]
            if done:
                self.running = [r for r in self.running if r.remaining > _DONE]
                finished.extend(done)
                self._fill()
        self.now += max(0.0, seconds)  # idle time
        return finished


class PoolSim:
    """A sampler pool: ``model.replicas`` replicas, each new request sent to the least loaded (verl's load balancer
    picks the server with the fewest requests in flight) and a resubmitted one to its own. The same interface as
    one :class:`ReplicaSim`; a weight load reaches every replica at once."""

    def __init__(self, model: "LatencyModel", replica_factory: Callable[["LatencyModel"], ReplicaSim] = ReplicaSim):
        self.model = model
        self.replicas = [replica_factory(model) for _ in range(model.replicas)]
        self._home: dict[int, ReplicaSim] = {}  # id(request) -> its replica

    @property
    def now(self) -> float:
        return self.replicas[0].now

    @property
    def running(self) -> list[ModelledRequest]:
        return [r for replica in self.replicas for r in replica.running]

    @property
    def waiting(self) -> list[ModelledRequest]:
        return [r for replica in self.replicas for r in replica.waiting]

    @property
    def busy_s(self) -> float:
        """Busy time averaged over the replicas (the pool's GPU-time share, times its age)."""
        return sum(replica.busy_s for replica in self.replicas) / len(self.replicas)

    @property
    def pending_stall_s(self) -> float:
        return max(replica.pending_stall_s for replica in self.replicas)

    def admit(self, request: ModelledRequest) -> None:
        """To the least loaded replica; a request taken out by an abort goes back to its own (verl's load balancer
        keeps a request on its server: the partial-rollout client resubmits under the same request id)."""
        replica = self._home.get(id(request)) or min(self.replicas, key=lambda r: len(r.running) + len(r.waiting))
        self._home[id(request)] = replica
        replica.admit(request)

    def remove(self, request: ModelledRequest) -> None:
        replica = self._home.pop(id(request), None)
        if replica is not None:
            replica.remove(request)

    def stall(self, seconds: float) -> None:
        for replica in self.replicas:
            replica.stall(seconds)

    def take_all(self) -> list[ModelledRequest]:
        """Take every running and waiting request out (an aborting sync); what each decoded stays decoded, and each
        keeps its replica for its resubmission."""
        taken = []
        for replica in self.replicas:
            taken += [*replica.running, *replica.waiting]
            replica.running, replica.waiting = [], deque()
        return taken

    def time_to_next_finish(self) -> float:
        return min(replica.time_to_next_finish() for replica in self.replicas)

    def advance(self, seconds: float) -> list[ModelledRequest]:
        finished = [request for replica in self.replicas for request in replica.advance(seconds)]
        for request in finished:
            self._home.pop(id(request), None)
        return finished


def batch_generation_s(model: "LatencyModel", lengths: Sequence[int]) -> float:
    """Modelled seconds for the sampler pool to generate a batch of requests that all arrive at once."""
    sim = PoolSim(model)
    for length in lengths:
        sim.admit(ModelledRequest(total=int(length), decoded=0.0, prefix=model.prompt_tokens))
    while sim.running:
        sim.advance(sim.time_to_next_finish())
    return sim.now


class ModelledReplica:
    """One rollout server's modelled replica, driven by the wall clock (a generation-timing slot's replica).

    Each request is admitted to the :class:`ReplicaSim` when it arrives; its real answer is generated at once by
    the server, and handed back when the modelled request ends. ``abort_all`` ends every modelled request where
    it has got to: its answer is cut to the share decoded, so verl resubmits the rest (to the new weights).
    ``weights_loaded`` switches the policy version the replica runs; loaded in flight, it stalls the replica and
    the running requests go on under it, and ``serve`` reports which version decoded each of the answer's tokens.
    """

    def __init__(self, model: "LatencyModel"):
        self.model = model
        self.sim = PoolSim(model)
        self._prompt_requests: dict[tuple[int, ...], int] = {}
        # resumed prompt (prompt + the tokens an abort cut at) -> the modelled requests it may continue (a list:
        # samples of one prompt cut before their first token resume with the same ids, and are interchangeable)
        self._resumable: dict[tuple[int, ...], list[ModelledRequest]] = {}
        self._waiters: dict[int, asyncio.Future] = {}  # id(ModelledRequest) -> its end
        self._wall_origin: Optional[float] = None  # loop time of sim.now == 0
        self._wake: Optional[asyncio.Event] = None
        self._driver: Optional[asyncio.Task] = None
        self.busy_intervals: list[tuple[float, float]] = []  # wall-clock (time.time) spans with requests running
        self._busy_since: list[Optional[float]] = [None] * len(self.sim.replicas)  # per replica
        self.trace = TraceWriter(len(self.sim.replicas))  # for every schedule alike: see bench.sampler_trace
        self.version: Optional[float] = None  # the modelled policy version (None until weights_loaded names one)
        self._staged: Optional[tuple[float, float]] = None  # a staged load in transfer: (sim time it lands, version)

    # --- the clock ------------------------------------------------------------------------------------------

    def _catch_up(self) -> None:
        """Advance the modelled replica to the present, and release every request that ended meanwhile."""
        loop = asyncio.get_running_loop()
        if self._wall_origin is None:
            self._wall_origin = loop.time()
        target = (loop.time() - self._wall_origin) / self.model.time_scale
        if self._staged is not None and self._staged[0] <= target:  # a staged load landed meanwhile: switch there
            self._release(self.sim.advance(max(0.0, self._staged[0] - self.sim.now)))
            self._switch_to_staged()
        self._release(self.sim.advance(max(0.0, target - self.sim.now)))
        self._trace_busy()

    def _release(self, finished: list[ModelledRequest]) -> None:
        for request in finished:
            future = self._waiters.pop(id(request), None)
            if future is not None and not future.done():
                future.set_result(True)

    def _switch_to_staged(self) -> None:
        """The staged load's transfer has ended: the running and waiting requests go on under its version."""
        _, version = self._staged
        self._staged = None
        self._switch(version, self.sim.running)

    def _trace_busy(self) -> None:
        now = time.time()
        for index, replica in enumerate(self.sim.replicas):
            busy, since = bool(replica.running), self._busy_since[index]
            if busy and since is None:
                self._busy_since[index] = now
            elif since is not None and (not busy or now - since > _TRACE_FLUSH_S):
                # a replica that never idles must still show up: long spans are written in pieces (merged on load)
                self._record_span(since, now, replica=index)
                self._busy_since[index] = now if busy else None

    def _record_span(self, start: float, end: float, kind: str = "busy", replica: Optional[int] = None) -> None:
        """A span of the trace: ``busy`` (a replica has requests running) or ``stall`` (an in-flight weight load
        holds every replica's running requests: inside busy spans, but nothing is generated)."""
        if kind == "busy":
            self.busy_intervals.append((start, end))
        self.trace.span(start, end, kind, replica)

    async def _drive(self) -> None:
        while self._waiters:
            self._catch_up()
            wait_s = self.model.wall(self.sim.time_to_next_finish())
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=None if math.isinf(wait_s) else wait_s)
            except asyncio.TimeoutError:
                pass
        self._catch_up()

    def _nudge(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    # --- the slot -------------------------------------------------------------------------------------------

    async def serve(
        self,
        prompt_ids: Sequence[int],
        generate: Callable[[], Awaitable[Answer]],
        aborted: Callable[[Answer], bool],
        cut: Callable[[Answer, float], Answer],
    ) -> tuple[Answer, dict[str, Any]]:
        """Generate for real; hand the answer back when its modelled request ends.

        ``aborted(answer)`` says whether the server's own generation was aborted (returned at once);
        ``cut(answer, share)`` is the answer cut to ``share`` of its tokens and marked aborted.
        """
        key = tuple(int(t) for t in prompt_ids)
        self._catch_up()
        pending = self._resumable.get(key)
        request = pending.pop() if pending else None
        if pending == []:
            del self._resumable[key]
        if request is not None:  # verl resubmits an aborted request: prompt + what it had; re-prefill all of it
            request.prefix = self.model.prompt_tokens + int(request.decoded)
            _run_under(request, self.version)  # the new piece runs under the weights loaded since the abort
            self.trace.event("resume")
        else:
            self.trace.event("admit")
            index = self._prompt_requests.get(key, 0)
            self._prompt_requests[key] = index + 1
            total = self.model.response_tokens(key, index)
            request = ModelledRequest(
                total=total, decoded=0.0, prefix=self.model.prompt_tokens, versions=[(0.0, self.version)]
            )
        resumed_from = request.decoded
        ended = asyncio.get_running_loop().create_future()
        self._waiters[id(request)] = ended
        self.sim.admit(request)
        self._nudge()
        try:
            answer = await generate()
            if aborted(answer):  # the server's own generation was cut (real tokens so far): resume from there
                self._catch_up()
                self._resumable.setdefault(key + tuple(cut_token_ids(answer)), []).append(request)
                return answer, {MODELLED_RUNS_KEY: modelled_segments(request, resumed_from, request.decoded)}
            ended_normally = await ended
        finally:
            self._waiters.pop(id(request), None)
            self._catch_up()
            self.sim.remove(request)
            self._trace_busy()
        extra: dict[str, Any] = {"modelled_response_tokens": request.total}
        if not ended_normally:  # aborted by a sync: keep the share of this piece that the modelled request decoded
            piece_share = (request.decoded - resumed_from) / max(request.total - resumed_from, _DONE)
            answer = cut(answer, min(1.0, max(0.0, piece_share)))
            self._resumable.setdefault(key + tuple(cut_token_ids(answer)), []).append(request)
        tokens = len(cut_token_ids(answer))
        return answer, {**extra, **_version_tags(request, resumed_from, request.decoded, tokens)}

    def abort_all(self) -> None:
        """End every request at the point the modelled replica has decoded it to (verl's sync aborts them)."""
        if self._wall_origin is None:
            return
        # the model holds the pool empty for the transfer after an abort, unless the engine stages its loads
        self.trace.event("abort", hold_s=0.0 if self.model.staged_loads else self.model.wall(self.model.sync_s))
        self._catch_up()
        for future in list(self._waiters.values()):
            if not future.done():
                future.set_result(False)

    def weights_loaded(self, version: float, in_flight: bool) -> None:
        """The replica now serves policy ``version`` (call it on the event loop the replica serves on).

        ``in_flight``: the weights load between two decode steps and nothing is aborted: the replica stalls for
        ``sync_s`` (the transfer holds the engine), then each running request decodes the rest under ``version``.
        With ``staged_loads`` nothing stalls: the requests decode on under the old weights while the new ones arrive,
        and switch when the transfer ends (``sync_s`` from now; a load still arriving lands first).
        Otherwise an aborting sync already cut the running requests (verl aborts before it loads, and parks every
        request, new or resubmitted, behind the servers' gate until the modelled ``sync_s`` has passed: the
        trainer-side patch ``latency_model_sync_holds_the_gate``), and each resumes under ``version``.
        Either way, requests still waiting to be admitted have decoded nothing yet and start under it.
        """
        self.trace.event("loaded")
        if in_flight:
            self._catch_up()  # the load lands where the replica has got to now
        if self._staged is not None:  # a staged load still arriving lands before this one
            self._switch_to_staged()
        if in_flight and self.model.staged_loads:
            self._staged = (self.sim.now + self.model.sync_s, version)
            return
        if in_flight:
            if self.sim.running:  # the requests wait, idle: not busy time in the sampler's trace
                start = time.time() + self.model.wall(self.sim.pending_stall_s)
                self._record_span(start, start + self.model.wall(self.model.sync_s), kind="stall")
            self.sim.stall(self.model.sync_s)
        self._switch(version, self.sim.running if in_flight else [])

    def _switch(self, version: float, running: list[ModelledRequest]) -> None:
        self.version = version
        for request in [*running, *self.sim.waiting]:
            _run_under(request, version)

    def busy_fraction(self) -> float:
        return self.sim.busy_s / self.sim.now if self.sim.now > 0 else 0.0


def _run_under(request: ModelledRequest, version: Optional[float]) -> None:
    """The request decodes from here on under ``version`` (replacing the last switch if nothing was decoded since)."""
    if request.versions and request.versions[-1][0] >= request.decoded - _DONE:
        request.versions[-1] = (request.versions[-1][0], version)
    else:
        request.versions.append((request.decoded, version))


def _version_tags(request: ModelledRequest, start: float, end: float, tokens: int) -> dict[str, Any]:
    """verl's version tags of a piece of an answer: ``tokens`` real tokens spread evenly over the modelled tokens
    ``start``..``end`` the piece decoded, each tagged with the version in force at its modelled token. Empty
    unless every token's version is known (the server's own tag stands then)."""
    switches = [decoded for decoded, _ in request.versions]

    def at(position: float) -> Optional[float]:
        return request.versions[max(0, bisect_right(switches, position) - 1)][1] if request.versions else None

    if tokens:
        versions = [at(start + (i + 0.5) / tokens * (end - start)) for i in range(tokens)]
    else:
        versions = [at(end)]  # no tokens: the version it last ran under
    known = [version for version in versions if version is not None]
    if len(known) < len(versions):
        return {}
    low, high = min(known), max(known)
    tags: dict[str, Any] = {"global_steps": high, "min_global_steps": low, "max_global_steps": high}
    if low != high:
        tags["token_versions"] = known
    tags[MODELLED_RUNS_KEY] = modelled_segments(request, start, end)
    return tags


def modelled_segments(request: ModelledRequest, start: float, end: float) -> list[list]:
    """The request's modelled tokens ``start``..``end`` as ``[count, version]`` runs (empty if a version is unknown).

    The real tokens only carry the modelled ones (a resumed piece is a fresh real generation, of any length), so
    the benchmark weighs each version by the modelled tokens decoded under it, the same way for every schedule."""
    switches = [decoded for decoded, _ in request.versions[1:]] + [math.inf]
    segments = []
    for (begins, version), next_switch in zip(request.versions, switches):
        count = min(next_switch, end) - max(begins, start)
        if count > _DONE:
            if version is None:
                return []
            segments.append([count, version])
    return segments


def cut_token_ids(answer: Any) -> list[int]:
    """The token ids of an answer from either server (``GenerationResult`` or verl's ``TokenOutput``)."""
    return [int(t) for t in answer.token_ids]
