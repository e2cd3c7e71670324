"""The two verl pieces ``in_flight_pipeline`` swaps: a weight sync that aborts nothing, a client that keeps versions.

* :class:`InFlightCheckpointManager`: verl's ``CheckpointEngineManager.update_weights`` aborts every running
  request, frees the KV cache, loads, and resumes (the partial-rollout client re-prefills what was cut). Here the
  abort, KV release/restore and resume steps are no-ops; the transfer is verl's own. The servers, switched to
  in-flight loading (``set_in_flight_updates``), load the weights between two decode steps: the hf server at its
  running batch's next one, vLLM's engine between two scheduler steps (verl's weight RPC is a utility call there).
* :class:`VersionKeepingClient`: verl's ``FullyAsyncLLMServerClient`` rebuilds each answer and keeps only the
  version of its last piece. This one also keeps the lowest version of any piece and the per-token versions
  (``token_versions``), so the trainer can measure each token's lag.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from verl.checkpoint_engine import CheckpointEngineManager
from verl.utils.ray_utils import auto_await
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient


class InFlightCheckpointManager(CheckpointEngineManager):
    """verl's weight sync without the abort: requests keep decoding, and keep their KV cache."""

    # Servers to tell each sync's version before it starts (vLLM's: its weight RPC carries none).
    version_listeners: tuple = ()

    @auto_await
    async def update_weights(self, global_steps: int = None):
        if self.version_listeners and global_steps is not None:
            await asyncio.gather(*[server.expect_weights.remote(global_steps) for server in self.version_listeners])
        return await super().update_weights(global_steps)

    async def abort_replicas(self):
        return None

    async def release_kv_cache_replicas(self):
        return None

    async def resume_kv_cache_replicas(self):
        return None

    async def resume_generation_replicas(self):
        return None


def enable_in_flight_updates(replicas) -> list:
    """Switch each replica's servers to in-flight loads; returns those that must be told each sync's version first.

    A replica says what it can do (:mod:`verl_pipe.rollout.composition` refuses the others before any worker starts):
    ``loads_in_flight``, its servers load a sync between two decode steps and tag every token (the hf server at its
    running batch's next step; verl's vLLM server with verl-pipe's extension between two engine steps, counting
    which tokens came before each load), and ``announces_versions``, they must be told each load's version first."""
    handles, listeners = [], []
    for replica in replicas:
        if not getattr(replica, "loads_in_flight", False):
            raise TypeError(
                f"in_flight_pipeline loads weights while requests run, which the {type(replica).__name__} replica "
                "cannot report per token: set actor_rollout_ref.rollout.name=vllm (or hf on the CPU backend)"
            )
        servers = list(replica.servers)
        if getattr(replica, "announces_versions", False):
            listeners.extend(servers)
        handles.extend(server.set_in_flight_updates.remote(True) for server in servers)
    if handles:
        ray.get(handles)
    return listeners


class _PieceRecorder(LLMServerClient):
    """Sits under verl's partial-rollout client in the MRO: sees every piece's extra fields before they are merged."""

    async def generate(self, request_id, **kwargs: Any):
        output = await super().generate(request_id, **kwargs)
        pieces = self.__dict__.setdefault("_pieces", {})
        fields = output.extra_fields or {}
        version = fields.get("global_steps")
        versions = fields.get("token_versions") or [version] * len(output.token_ids)
        low = fields.get("min_global_steps", version)
        pieces.setdefault(request_id, []).append((low, list(versions)))
        return output


class VersionKeepingClient(FullyAsyncLLMServerClient, _PieceRecorder):
    """verl's partial-rollout client, reporting the lowest version of any piece and every token's version."""

    async def generate(self, request_id, **kwargs: Any):
        try:
            output = await super().generate(request_id, **kwargs)
        finally:
            pieces = self.__dict__.setdefault("_pieces", {}).pop(request_id, [])
        lows = [low for low, _ in pieces if low is not None]
        versions = [v for _, piece in pieces for v in piece if v is not None]
        if lows:
            output.extra_fields["min_global_steps"] = min(lows + versions)
        if len(set(versions)) > 1:
            output.extra_fields["token_versions"] = versions
        return output
