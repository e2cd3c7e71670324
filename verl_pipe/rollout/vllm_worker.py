"""verl's vLLM worker extension with what in-flight weight loads need, on every platform (loaded by name inside
vLLM's worker processes; :class:`~verl_pipe.rollout.vllm_server.PipevLLMHttpServer` names it).

vLLM's engine core runs verl's weight RPC (``collective_rpc("update_weights_from_ipc")``) between two scheduler
steps, with every running request waiting and keeping its KV cache. So a load that aborts nothing lands between two
tokens of each running answer; what the server needs to tag every token with the version that sampled it is, at each
load, how many tokens every request had sampled so far (:mod:`verl_pipe.rollout.in_flight_loads`). This extension
counts them in the model runner (the requests it runs, and those that ended since the last load) and returns them
from the weight RPC. The load itself is verl's; the CPU backend's subclass
(:class:`verl_pipe.backends.cpu.vllm_worker.CPUvLLMWorkerExtension`) replaces only the load.
"""

from __future__ import annotations

import json
import logging
import os
import time

import torch

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

logger = logging.getLogger("verl_pipe")

# What the model runner must have for the counts (vLLM's GPUModelRunner, which its CPU runner subclasses: vllm 0.28).
RUNNER_HOOK = "_on_request_state_removed"


class InFlightWorkerExtension(vLLMColocateWorkerExtension):
    def monkey_patch_model(self, *args, **kwargs):
        result = super().monkey_patch_model(*args, **kwargs)  # verl calls it once, when the engine has started
        self.verl_pipe_counting = count_ended_requests(self.model_runner)
        return result

    def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
        """Load the weights the trainer streams (verl's load, or the subclass's); returns each request's tokens
        sampled before the load."""
        mid_answer = sum(1 for state in getattr(self.model_runner, "requests", {}).values() if state.output_token_ids)
        sampled_before = sampled_so_far(self.model_runner)
        self._load_weights(peft_config, base_sync_done, use_shm)
        record_sync_probe(self.model_runner.model, mid_answer)
        return {"sampled_before": sampled_before}

    def _load_weights(self, peft_config, base_sync_done, use_shm) -> None:
        super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)

    def verl_pipe_counts_requests(self) -> bool:
        """Whether this worker counts its requests' tokens at each load (the server asks before in-flight loads)."""
        return bool(getattr(self, "verl_pipe_counting", False))


def count_ended_requests(runner) -> bool:
    """Keep the token count of every request the model runner drops (it ended), until the next load reports it;
    whether the runner has the hook (a vLLM without it reports running requests only, and in-flight loads refuse).

    A request that ends in the last step before a load is still in the runner's table; one that ended earlier is
    not, and its answer may still be on its way to the server when the load's counts arrive there."""
    dropped = getattr(runner, RUNNER_HOOK, None)
    if dropped is None or not hasattr(runner, "requests"):
        logger.warning("verl-pipe: vLLM's model runner %s has no %s or requests table: in-flight weight loads cannot "
                       "tag tokens on this vLLM (in_flight_pipeline will refuse)", type(runner).__name__, RUNNER_HOOK)
        return False
    runner.verl_pipe_ended = {}

    def on_request_state_removed(req_id, req_state, *args, **kwargs):
        if req_state is not None:
            runner.verl_pipe_ended[req_id] = len(req_state.output_token_ids)
        return dropped(req_id, req_state, *args, **kwargs)

    setattr(runner, RUNNER_HOOK, on_request_state_removed)
    return True


def sampled_so_far(runner) -> dict[str, int]:
    """Per engine request id: the output tokens sampled so far, by the requests running and those ended since the
    last load (then forgotten: each load reports what happened since the one before)."""
    ended = getattr(runner, "verl_pipe_ended", {})
    counts = {req_id: len(state.output_token_ids) for req_id, state in getattr(runner, "requests", {}).items()}
    counts.update({req_id: n for req_id, n in ended.items() if req_id not in counts})
    ended.clear()
    return counts


# Tests and `make gpu-check` only: a file to which every weight load appends a checksum of the engine's weights.
SYNC_PROBE_ENV = "VERL_PIPE_VLLM_SYNC_PROBE"


def record_sync_probe(model: torch.nn.Module, mid_answer: int) -> None:
    """``mid_answer``: the running requests that had sampled some of their answer when this load began."""
    path = os.environ.get(SYNC_PROBE_ENV)
    if not path:
        return
    # On CPU the linear weights live packed inside their GEMM closures; the embedding (and a tied LM head) and the
    # norms keep theirs, which is enough to tell one set of weights from another. On a GPU every parameter counts.
    with torch.no_grad():
        checksum = sum(float(p.detach().double().sum()) for p in model.parameters() if p.numel())
    record = {
        "replica": os.environ.get("VERL_REPLICA_RANK", "0"),
        "checksum": checksum,
        "time": time.time(),
        "mid_answer": mid_answer,
    }
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
