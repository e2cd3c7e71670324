"""``gloo``: a checkpoint engine that moves weights between separate trainer and rollout pools without a GPU.

verl's separate-pool trainer modes (``separate_async``, ours) refuse the colocated ``naive`` engine, and its
``nccl``/``nixl`` engines need cupy and CUDA. This engine implements verl's ``CheckpointEngine`` protocol over a
*dedicated* gloo group, so the CPU backend runs the same weight-sync path a GPU cluster runs:

* ``prepare()``: trainer rank 0 (the master) opens a fresh TCP store on a free port for this sync and reports it;
* ``build_topology()``: trainer rank 0 is the broadcast root (rank 0); the other trainer ranks sit out (rank -1)
  but still walk the weight generator, because gathering a sharded tensor is collective over the trainer group;
  rollout workers are ranks 1..R;
* ``init_process_group()``: a standalone ``ProcessGroupGloo`` on that store, never the default process group the
  trainer's FSDP runs on, so a sync can neither join nor disturb training collectives;
* ``send_weights()`` / ``receive_weights()``: weights cut into byte buckets with verl's own
  ``split_weight_chunks`` / ``merge_weight_chunks``; each bucket's layout travels through the store, its bytes
  through one gloo broadcast; the root packs the next bucket while the previous one is on the wire;
* ``finalize()``: the group and the store are dropped; every sync rendezvouses on a new port, so no stale keys.

Select it with ``actor_rollout_ref.rollout.checkpoint_engine.backend=gloo``.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, AsyncGenerator, Generator, Optional

import torch
import torch.distributed as dist

from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)
from verl.workers.rollout.utils import ensure_async_iterator

logger = logging.getLogger("verl_pipe")

BACKEND_NAME = "gloo"
# The store's key for bucket i; the value is the pickled bucket layout (chunk metadata, byte length, last flag).
_BUCKET_KEY = "verl_pipe/bucket/{}"
# Tensors are viewed in place out of the received bytes, so each starts at an offset aligned for any dtype.
_ALIGN = 16


@dataclass(frozen=True)
class GlooRendezvous:
    """Where the sync's TCP store listens; reported by trainer rank 0 from ``prepare()``."""

    host: str
    port: int


def _node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address().strip("[]")
    except Exception:  # noqa: BLE001 - outside Ray (unit tests) loopback is right
        pass
    return "127.0.0.1"


@CheckpointEngineRegistry.register(BACKEND_NAME)
class GlooCheckpointEngine(CheckpointEngine):
    """Bucketed broadcast of the trainer's weights to every rollout worker over a dedicated gloo group.

    Args:
        bucket_size: bytes per broadcast (``checkpoint_engine.update_weights_bucket_megabytes``).
        is_master: True on trainer rank 0, the broadcast root (verl passes it to trainer-side engines only).
        timeout_s: how long a rank waits for its peers at rendezvous and per collective.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0, **_: Any) -> None:
        if bucket_size <= 0:
            raise ValueError(
                f"checkpoint_engine.update_weights_bucket_megabytes must be > 0 for the gloo engine, got {bucket_size}"
            )
        self.bucket_size = int(bucket_size)
        self.is_master = is_master
        self.timeout = timedelta(seconds=timeout_s)
        self.rank: Optional[int] = None
        self.world_size: Optional[int] = None
        self._store: Optional[dist.TCPStore] = None
        self._group: Optional[dist.ProcessGroup] = None
        self._rendezvous: Optional[GlooRendezvous] = None
        self.last_sync: dict[str, float] = {}

    # --- topology ---------------------------------------------------------------------------------------------

    def prepare(self) -> Optional[GlooRendezvous]:
        if not self.is_master:
            return None
        host = _node_ip()
        # The root owns this sync's store; workers connect as clients in init_process_group. Port 0: the store
        # binds whatever port the kernel gives it, with no window between picking a free port and binding it
        # (another process took one in that window once: EADDRINUSE in a clean-clone suite run).
        self._store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=self.timeout)
        self._rendezvous = GlooRendezvous(host=host, port=self._store.port)
        return self._rendezvous

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list):
        rendezvous = metadata[0]
        if not isinstance(rendezvous, GlooRendezvous):
            raise RuntimeError("gloo checkpoint engine: trainer rank 0 must be the master (is_master=True)")
        world_size = 1 + rollout_world_size
        actor_kwargs = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "rendezvous": [rendezvous] * actor_wg_world_size,
        }
        rollout_kwargs = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "rendezvous": [rendezvous] * rollout_world_size,
        }
        return actor_kwargs, rollout_kwargs

    def init_process_group(self, rank: int, world_size: int, rendezvous: GlooRendezvous) -> None:
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        if self._store is None:
            self._store = dist.TCPStore(
                rendezvous.host, rendezvous.port, is_master=False, wait_for_workers=False, timeout=self.timeout
            )
        # A group of its own on this sync's store: the default group belongs to the trainer's FSDP.
        self._group = dist.ProcessGroupGloo(self._store, rank, world_size, self.timeout)

    def finalize(self) -> None:
        self._group = None
        self._store = None
        self._rendezvous = None
        self.rank = None
        self.world_size = None

    # --- transfer ---------------------------------------------------------------------------------------------

    def _broadcast(self, buffer: torch.Tensor):
        options = dist.BroadcastOptions()
        options.rootRank = 0
        return self._group.broadcast([buffer], options)

    @torch.no_grad()
    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps=None):
        if self.rank is None:
            raise RuntimeError("gloo checkpoint engine: send_weights before init_process_group")
        if self.rank < 0:  # not the root: still produce every tensor, the gather is collective
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        started = time.perf_counter()
        sent_bytes, index = 0, 0
        in_flight = None  # the previous bucket's broadcast, overlapped with packing the next one
        bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
        layout: list[TensorMeta] = []
        offset = 0

        def flush(is_last: bool):
            nonlocal bucket, layout, offset, index, in_flight, sent_bytes
            if in_flight is not None:
                in_flight.wait()
            self._store.set(_BUCKET_KEY.format(index), pickle.dumps((layout, offset, is_last)))
            in_flight = self._broadcast(bucket[:offset]) if offset else None
            sent_bytes += offset
            index += 1
            bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
            layout, offset = [], 0

        async for meta, chunk in split_weight_chunks(_contiguous_cpu(weights), self.bucket_size):
            if offset + meta.chunk_size > self.bucket_size:
                flush(is_last=False)
            meta.offset = offset
            bucket[offset : offset + meta.chunk_size].copy_(chunk)
            layout.append(meta)
            offset = min(self.bucket_size, -(-(offset + meta.chunk_size) // _ALIGN) * _ALIGN)
        flush(is_last=True)
        if in_flight is not None:
            in_flight.wait()
        self.last_sync = {"seconds": time.perf_counter() - started, "bytes": float(sent_bytes), "buckets": index}
        logger.info("gloo checkpoint engine: sent %d bytes in %d buckets", sent_bytes, index)
        return {}

    async def receive_weights(self, global_steps=None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        if self._group is None:
            raise RuntimeError("gloo checkpoint engine: receive_weights before init_process_group")
        async for name, tensor in merge_weight_chunks(self._receive_chunks(), self.bucket_size):
            yield name, tensor

    async def _receive_chunks(self) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        index = 0
        while True:
            # The store's get blocks until the root has published the layout; keep the event loop free meanwhile.
            raw = await asyncio.to_thread(self._store.get, _BUCKET_KEY.format(index))
            layout, length, is_last = pickle.loads(raw)
            # A fresh buffer per bucket: the tensors yielded below are views into it and outlive this iteration.
            buffer = torch.empty(length, dtype=torch.uint8)
            if length:
                await asyncio.to_thread(lambda: self._broadcast(buffer).wait())
            for meta in layout:
                yield meta, buffer[meta.offset : meta.offset + meta.chunk_size]
            index += 1
            if is_last:
                return


async def _contiguous_cpu(weights) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
    # Byte views need contiguous host memory; FSDP's gathered tensors can be strided or on an accelerator.
    async for name, tensor in ensure_async_iterator(weights):
        yield name, tensor.detach().to("cpu").contiguous()
