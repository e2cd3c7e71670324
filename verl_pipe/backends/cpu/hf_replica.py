"""The ``hf`` rollout backend's two verl-facing halves.

* :class:`HFReplica` (driver side, ``RolloutReplicaRegistry``): launches one :class:`HFRolloutServer` actor per
  replica and hands verl its handle.
* :class:`HFServerAdapter` (trainer-worker side, verl's ``(name, "async")`` adapter table): pushes the trainer's
  gathered weights to its replica's server on every weight sync, bucketed, and tags them with the policy version.

A replica is one process (no tensor parallelism on CPU). Server actors ask Ray for no CPU: they share the
cores with the trainer ranks they alternate with, and a zero request can never leave placement hanging.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncGenerator, Generator

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica
from verl_pipe.patching import fired
from verl_pipe.backends.cpu.hf_server import HFRolloutServer, server_actor_name
from verl_pipe.compat import SetupError


class HFReplica(RolloutReplica):
    # What the in-flight trainer asks of a replica: its server loads a sync at its running batch's next decode step
    # and tags each token itself (no version announced first); and it takes the trainer's idle cores while the
    # sampler pool validates (``lend_torch_threads``).
    loads_in_flight = True
    announces_versions = False
    lends_torch_threads = True

    def __init__(
        self,
        replica_rank,
        config,
        model_config,
        gpus_per_node=8,
        is_reward_model=False,
        is_teacher_model=False,
        name_suffix="",
    ):
        super().__init__(
            replica_rank, config, model_config, gpus_per_node, is_reward_model, is_teacher_model, name_suffix
        )
        if self.world_size != 1:
            raise SetupError(
                "the hf rollout runs one process per replica: set "
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1 (and data/pipeline parallel sizes to 1); "
                f"got a replica world size of {self.world_size}."
            )

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self):
        name = server_actor_name(self.replica_rank, self.is_reward_model, self.name_suffix)
        # On the node of the replica's worker, as verl places its vLLM servers: left to Ray, the server would start
        # beside whoever creates it (the trainer's node), away from its pool.
        node_id = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
        server_cls = ray.remote(HFRolloutServer)
        server = server_cls.options(
            name=name,
            num_cpus=0,
            max_concurrency=self.max_concurrency,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        self.servers = [server]
        address, _ = await server.get_server_address.remote()
        self._server_handle = server
        # verl keys its load balancer by address; there is no HTTP port, so make the key unique per replica.
        self._server_address = f"{address}:{name}"


class HFServerAdapter(BaseRollout):
    """Lives in each trainer (or checkpoint-engine) worker; owns the path from the trainer's weights to its server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs: Any):
        super().__init__(config, model_config, device_mesh)
        fired("hf_rollout_server_adapter")  # verl found us through the adapter-table entry we write
        if device_mesh is not None:  # hybrid: one replica per data-parallel rank
            self.replica_rank = device_mesh["dp"].get_local_rank()
        else:  # a checkpoint-engine worker of a standalone/colocated replica is told its rank
            self.replica_rank = replica_rank
        self.bucket_bytes = int(self.config.checkpoint_engine.update_weights_bucket_megabytes) << 20
        # The server holds its weights in the rollout dtype; casting here halves what crosses Ray for bf16.
        self.rollout_dtype = getattr(torch, str(self.config.dtype), torch.float32)
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None  # weights and KV cache never leave host memory

    async def release(self):
        return None

    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None] | AsyncGenerator,
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        **kwargs: Any,
    ):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout takes full named tensors, not {wire_format!r}")
        server = self._server_handle()
        bucket: list[tuple[str, torch.Tensor]] = []
        bucket_size = 0
        pending = []
        # Every rank must drain the generator: materialising a sharded tensor is a collective.
        async for name, tensor in _as_async_iter(weights):
            # Always a copy: on CPU the gathered tensor can alias the live parameter the optimizer overwrites.
            dtype = self.rollout_dtype if tensor.is_floating_point() else tensor.dtype
            tensor = tensor.detach().to(device="cpu", dtype=dtype, copy=True)
            bucket.append((name, tensor))
            bucket_size += tensor.numel() * tensor.element_size()
            if bucket_size >= self.bucket_bytes:
                pending.append(server.update_weights.remote(bucket))
                bucket, bucket_size = [], 0
        if bucket:
            pending.append(server.update_weights.remote(bucket))
        if pending:
            await asyncio.gather(*pending)
        await server.finish_weight_update.remote(global_steps)


async def _as_async_iter(items):
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item
