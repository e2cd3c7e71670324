"""verl's vLLM replica and server, extended for verl-pipe's trainer modes, on every platform.

:class:`PipevLLMHttpServer` is verl's ``vLLMHttpServer`` (its HTTP server, its ``AsyncLLM`` engine, its weight RPC)
with what the pipelined modes need of a rollout server:

* **in-flight weight loads** (``in_flight_pipeline``): verl's weight sync already runs between two engine steps once
  the trainer skips its abort; switched on (``set_in_flight_updates``) and told each load's version first
  (``expect_weights``), the server replays the loads that fell inside an answer and tags every token with the
  version that sampled it (:mod:`.in_flight_loads`; the counts come from :mod:`.vllm_worker`);
* **prefix-cache salting** under in-flight loads, so that no request reuses prompt KV computed by older weights;
* **engine health**: vLLM's async client never notices that its engine process died, so requests already sent, and
  a weight RPC, would wait for ever; ``engine_health`` looks at the processes, and a weight RPC into a dead engine
  fails with vLLM's ``EngineDeadError``;
* **prefill accounting** (``VERL_PIPE_PREFILL_LOG``, off unless set): what each request cost in prefill.

:class:`PipevLLMReplica` is verl's ``vLLMReplica`` with that server; verl's placement is kept. The CPU backend's
subclasses (:mod:`verl_pipe.backends.cpu.vllm_replica`) change only what a CPU host needs: placement without
accelerator ids, its worker extension, the KV cache size, and the test harness's timing slot. Which replica a run
builds is :mod:`.composition`'s decision. Needs vLLM importable (verl's server module imports it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

import ray

from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica
from verl_pipe.rollout.in_flight_loads import InFlightLoads, salt_prefills_by_weights, version_tags
from verl_pipe.rollout.prefill_log import PrefillLog

logger = logging.getLogger("verl_pipe")

# How often a weight RPC into the engine checks that the engine process still lives (vLLM's async client would wait
# for its answer for ever).
ENGINE_CHECK_EVERY_S = 2.0
WORKER_EXTENSION = "verl_pipe.rollout.vllm_worker.InFlightWorkerExtension"


class PipevLLMHttpServer(vLLMHttpServer):
    """verl's vLLM server actor with verl-pipe's extension (see the module's docstring)."""

    _in_flight: Optional[InFlightLoads] = None  # set by a trainer mode that never drains the sampler
    _prefill_log: Optional[PrefillLog | bool] = None  # False once the environment said no log

    async def generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
        loads = self._in_flight
        if loads is None:
            output = await self._generate(prompt_ids, sampling_params, request_id, *args, **kwargs)
        else:
            salt_prefills_by_weights(self.engine, loads)  # here: a restarted engine is salted too
            mark = loads.mark()
            output = await self._generate(prompt_ids, sampling_params, request_id, *args, **kwargs)
            versions = await loads.versions(request_id, len(output.token_ids), mark)
            output.extra_fields = {**(output.extra_fields or {}), **version_tags(versions, self.global_steps)}
        if self._prefill_log is None:
            self._prefill_log = PrefillLog.from_env(replica=self.replica_rank) or False
        if self._prefill_log:
            self._prefill_log.record(prompt_ids, output)
        return output

    async def _generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
        """verl's generate (the CPU backend times it through the harness's slot here)."""
        return await super().generate(prompt_ids, sampling_params, request_id, *args, **kwargs)

    # ---- in-flight weight loads (trainer.v1.trainer_mode=in_flight_pipeline) ---------------------------------------

    async def set_in_flight_updates(self, enabled: bool) -> None:
        """Tag every answer's tokens with the versions that sampled them, across the loads that run while it decodes
        (:mod:`.in_flight_loads`). verl's sync already loads between engine steps without aborting anything once the
        trainer skips its abort. Refused where vLLM's workers cannot count their requests' tokens."""
        if enabled:
            counting = await self.engine.collective_rpc(method="verl_pipe_counts_requests")
            if not all(counting):
                raise RuntimeError(
                    "in_flight_pipeline: this vLLM's model runner has no per-request token counts at a weight load "
                    "(verl-pipe hooks vLLM's GPUModelRunner._on_request_state_removed, present in vllm 0.28), so the "
                    "tokens of an answer that spans a load cannot be tagged with their versions; use a vLLM that has "
                    "it, or trainer.v1.trainer_mode=one_off_pipeline"
                )
        self._in_flight = InFlightLoads(self.global_steps) if enabled else None

    async def expect_weights(self, version: float) -> None:
        """The version the next weight load brings (vLLM's weight RPC carries none); the trainer says it first."""
        if self._in_flight is not None:
            self._in_flight.expected = version  # a fraction of a step after a minibatch update

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        loads = self._in_flight
        if loads is None or method != "update_weights_from_ipc":
            return await self._while_the_engine_lives(
                super().collective_rpc(method, timeout=timeout, args=args, kwargs=kwargs)
            )
        async with loads.loading():
            results = await self._while_the_engine_lives(
                self.engine.collective_rpc(method=method, timeout=timeout, args=args, kwargs=kwargs)
            )
            loads.record(results[0]["sampled_before"])  # every rank runs the same requests

    # ---- engine health -----------------------------------------------------------------------------------------

    async def _while_the_engine_lives(self, call):
        """Await ``call`` (an RPC into the engine), but raise vLLM's ``EngineDeadError`` once the engine process is
        gone: vLLM's async client never notices, and a weight sync would wait for its answer for ever (seen in
        ``make chaos --faults engine_kill``: ``in_flight_pipeline`` hung there)."""
        task = asyncio.ensure_future(call)
        while True:
            done, _ = await asyncio.wait({task}, timeout=ENGINE_CHECK_EVERY_S)
            if done:
                return task.result()
            if await self.engine_health():
                task.cancel()
                from vllm.v1.engine.exceptions import EngineDeadError

                raise EngineDeadError()

    async def engine_health(self) -> Optional[str]:
        """None while vLLM's engine runs; what is wrong once its engine process is gone. The actor itself answers
        pings then, and vLLM's async client does not watch its engine processes (its liveness monitor starts for the
        synchronous client only), so requests already sent wait for ever: this looks at the processes themselves."""
        engine = getattr(self, "engine", None)
        if engine is None:
            return None
        core = getattr(engine, "engine_core", None)
        manager = getattr(getattr(core, "resources", None), "engine_manager", None)
        dead = [proc for proc in getattr(manager, "processes", ()) if not proc.is_alive()]
        if dead:
            codes = ", ".join(f"exit code {proc.exitcode}" for proc in dead)
            return f"its engine process (VLLM::EngineCore) is dead ({codes}): its requests will never finish"
        if engine.errored:
            return "its engine (VLLM::EngineCore) is dead: vLLM raises EngineDeadError for every request"
        return None

    def _get_worker_extension_cls(self) -> str:
        return WORKER_EXTENSION


class PipevLLMReplica(vLLMReplica):
    """verl's vLLM replica (its placement, its servers' launch) with :class:`PipevLLMHttpServer`."""

    # What the in-flight trainer asks of a replica: its servers load weights between decode steps and tag each
    # token (``set_in_flight_updates``), once told each sync's version (``expect_weights``).
    loads_in_flight = True
    announces_versions = True
    SERVER = PipevLLMHttpServer

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(self.SERVER)
