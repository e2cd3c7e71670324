"""Which policy version sampled each token, when weights load while requests run (``in_flight_pipeline``).

Both rollout servers can load new weights without aborting anything. The ``hf`` server does it at its running
batch's next decode step and tags every token as it samples it. vLLM's engine has no such tags, but its weight sync
is already in flight: verl sends it as a utility call (``collective_rpc("update_weights_from_ipc")``) that vLLM's
engine core runs between two scheduler steps, and the running requests wait out the load and go on decoding with
their KV cache. So the worker counts, at each load, how many tokens every request had sampled so far (under the old
weights), and the server replays the loads that fell inside an answer when it comes back (:class:`InFlightLoads`).

A load that aborts nothing also cannot clear vLLM's prefix cache: verl resets it after every sync, and vLLM refuses
while running requests hold blocks (``BlockPool.reset_prefix_cache`` returns False), which under in-flight loads is
nearly always. Left alone, a request submitted after a load would reuse prompt KV computed by weights many loads
old: a shared system prompt's, or a validation prompt's from the previous validation, for the whole run. So every
new request's prefix-cache key carries the count of loads begun (vLLM's per-request ``cache_salt``,
:func:`salt_prefills_by_weights`): it shares cached blocks only with requests that entered the engine under the
same weights. Running requests keep their own KV, as the design says. What is left: a request that reached the
engine's queue before a load and is first scheduled after it can still hit a sibling's block (the same prompt,
submitted a moment earlier) from the old weights; its tokens are tagged with the new version.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Optional

# vLLM keeps a request under the caller's id plus "-" and 8 random characters (``random_uuid():.8``).
_VLLM_ID_SUFFIX = 9


def caller_request_id(engine_request_id: str) -> str:
    """The id verl gave a request, from the id vLLM's engine core and workers know it by."""
    return engine_request_id[:-_VLLM_ID_SUFFIX]


@dataclass
class WeightLoad:
    version: float  # a fraction of a step when the trainer loads after each minibatch update
    # per request (the caller's id): tokens it had sampled when the load ran; a request the engine had not
    # scheduled yet is absent, and so is one that ended before the previous load
    sampled_before: dict[str, int]


def token_versions(
    request_id: str, num_tokens: int, version_at_submission: Optional[float], loads: list[WeightLoad]
) -> list[Optional[float]]:
    """The version of each of an answer's tokens, from the loads that ran after it was submitted (in order)."""
    versions = [version_at_submission] * num_tokens
    scheduled = False
    for load in loads:
        sampled = load.sampled_before.get(request_id)
        if sampled is None:
            if scheduled:  # it ended before this load (its count was in an earlier one): nothing of it changes
                continue
            sampled = 0  # still queued when the load ran: every token it samples comes after
        scheduled = True
        versions[sampled:] = [load.version] * (num_tokens - min(sampled, num_tokens))
    return versions


def version_tags(versions: list[Optional[float]], current: Optional[float]) -> dict[str, Any]:
    """verl's version tags of an answer: ``global_steps`` the freshest version that sampled it (``current`` for an
    answer without tokens), ``min_``/``max_global_steps`` the range, and ``token_versions`` when they differ."""
    known = [v for v in versions if v is not None]  # None: sampled before the server's first versioned load
    if not known:
        return {"global_steps": current}
    low, high = min(known), max(known)
    tags: dict[str, Any] = {"global_steps": high, "min_global_steps": low, "max_global_steps": high}
    if low != high:
        tags["token_versions"] = list(versions)
    return tags


class InFlightLoads:
    """A vLLM server's record of the weight loads that ran while requests were in flight (its event loop only)."""

    def __init__(self, version: Optional[float]):
        self.version = version  # of the weights loaded now
        self.expected: Optional[float] = None  # of the weights the next load brings (the trainer says so first)
        # a few ints per running request per sync: a run keeps them all (an answer's replay starts at its mark)
        self.loads: list[WeightLoad] = []
        self.loads_begun = 0  # loads sent to the engine so far, recorded or not (the prefix-cache salt)
        self._loading = 0
        self._settled = asyncio.Event()
        self._settled.set()

    def mark(self) -> tuple[int, Optional[float]]:
        """Where a request starts: the loads after this point may fall inside it, on top of this version."""
        return len(self.loads), self.version

    @contextlib.asynccontextmanager
    async def loading(self):
        """Around a load's RPC: an answer that ends meanwhile waits for its record (vLLM resolves the RPC's result
        and the requests' outputs on different paths, so an answer sampled after the load can come back first)."""
        if self.expected is None:
            raise RuntimeError(
                "an in-flight weight load arrived with no version announced: the trainer must call expect_weights "
                "on every vLLM server before the sync (InFlightCheckpointManager does)"
            )
        self._loading += 1
        self.loads_begun += 1  # before the RPC: a request sent after it reaches the engine after the load
        self._settled.clear()
        try:
            yield
        finally:
            self._loading -= 1
            if not self._loading:
                self._settled.set()

    def record(self, sampled_before_by_engine_id: dict[str, int]) -> None:
        by_caller_id = {caller_request_id(rid): count for rid, count in sampled_before_by_engine_id.items()}
        self.loads.append(WeightLoad(self.expected, by_caller_id))
        self.version, self.expected = self.expected, None

    async def versions(
        self, request_id: str, num_tokens: int, mark: tuple[int, Optional[float]]
    ) -> list[Optional[float]]:
        await self._settled.wait()
        first_load, version = mark
        return token_versions(request_id, num_tokens, version, self.loads[first_load:])


CACHE_SALT_PREFIX = "verl-pipe-weights-"
_SALTED_MARK = "_verl_pipe_salted_by"


def salted_prompt(prompt: Any, loads_begun: int) -> Any:
    """The prompt verl hands vLLM (a ``TokensPrompt`` dict), keyed in the prefix cache on the weights it enters under;
    a salt the caller set is kept in front of ours."""
    if not isinstance(prompt, dict):
        raise TypeError(f"in-flight loads salt vLLM's prompt dict, and verl sent a {type(prompt).__name__}")
    ours = f"{CACHE_SALT_PREFIX}{loads_begun}"
    theirs = prompt.get("cache_salt")
    return {**prompt, "cache_salt": f"{theirs}|{ours}" if theirs else ours}


def salt_prefills_by_weights(engine: Any, loads: InFlightLoads) -> None:
    """Make ``engine.generate`` (vLLM's ``AsyncLLM``, its prompt first) salt every new request with the loads begun
    when it is sent. Idempotent per engine and ``loads``."""
    if getattr(engine, _SALTED_MARK, None) is loads:
        return
    generate = type(engine).generate.__get__(engine)  # the class's: a second call never wraps a wrapper

    def generate_salted(prompt, *args, **kwargs):
        return generate(salted_prompt(prompt, loads.loads_begun), *args, **kwargs)

    engine.generate = generate_salted
    setattr(engine, _SALTED_MARK, loads)
