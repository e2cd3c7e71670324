"""The two verl pieces ``in_flight_pipeline`` swaps: a weight sync that aborts nothing, a client that keeps versions.

* :class:`InFlightCheckpointManager`: verl's ``CheckpointEngineManager.update_weights`` aborts every running
  request, frees the KV cache, loads, and resumes (the partial-rollout client re-prefills what was cut). Here the
  abort, KV release/restore and resume steps are no-ops; the transfer is verl's own. The hf servers, switched to
  in-flight loading (``set_in_flight_updates``), load the weights at their running batch's next decode step.
* :class:`VersionKeepingClient`: verl's ``FullyAsyncLLMServerClient`` rebuilds each answer and keeps only the
  version of its last piece. This one also keeps the lowest version of any piece and the per-token versions
  (``token_versions``), so the trainer can measure each token's lag.
"""

from __future__ import annotations

from typing import Any

import ray

from verl.checkpoint_engine import CheckpointEngineManager
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient


class InFlightCheckpointManager(CheckpointEngineManager):
    """verl's weight sync without the abort: requests keep decoding, and keep their KV cache."""

    async def abort_replicas(self):
        return None

    async def release_kv_cache_replicas(self):
        return None

    async def resume_kv_cache_replicas(self):
        return None

    async def resume_generation_replicas(self):
        return None


def enable_in_flight_updates(replicas) -> None:
    """Make each replica's server load later syncs between decode steps; only the hf server can (for now)."""
    from verl_pipe.backends.cpu.hf_replica import HFReplica

    handles = []
    for replica in replicas:
        if not isinstance(replica, HFReplica):
            raise TypeError(
                f"in_flight_pipeline loads weights between decode steps, which the {type(replica).__name__} replica "
                "cannot do yet: set actor_rollout_ref.rollout.name=hf"
            )
        handles.append(replica._server_handle.set_in_flight_updates.remote(True))
    ray.get(handles)


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
