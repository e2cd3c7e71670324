"""The vLLM worker extension for weight syncs on CPU (loaded by name inside vLLM's worker process).

verl's ``vLLMColocateWorkerExtension.update_weights_from_ipc`` streams the trainer's weights into
``model.load_weights`` and then runs ``process_weights_after_loading`` once. That assumes the loaded layers still
hold the parameters vLLM created. vLLM's CPU backend does not keep them: after the first load it repacks every
linear layer's weight for oneDNN / its own GEMM kernels and replaces ``layer.weight`` with an empty parameter
(``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``), so a second load fails with
``'Parameter' object has no attribute 'weight_loader'``.

vLLM's own answer to reloading processed layers is its layerwise reload (what ``reload_weights`` and its IPC
weight-transfer engine use): restore each layer's loading-time parameters, load, re-run that layer's processing
(here: repack), then put the result back in place. This extension wraps verl's receive loop in exactly that.
Layers that keep their weight next to a packed copy (embedding, and the LM head, which a tied model never
loads) get their packed copy rebuilt afterwards. Received tensors are copied out of the shared-memory bucket first, since the layerwise loader holds a layer's
weights until all of them arrived and the bucket is reused for the next batch of tensors.

Full unquantized weights only: LoRA adapters and quantized models keep verl's path (not checked on CPU).
"""

from __future__ import annotations

import json
import logging
import os
import time

import torch

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

logger = logging.getLogger("verl_pipe")


class CPUvLLMWorkerExtension(vLLMColocateWorkerExtension):
    def monkey_patch_model(self, *args, **kwargs):
        result = super().monkey_patch_model(*args, **kwargs)  # verl calls it once, when the engine has started
        _count_ended_requests(self.model_runner)
        _pace_engine_steps(self.model_runner)
        return result

    def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
        """Load the weights the trainer streams; returns each request's tokens sampled before the load.

        vLLM's engine core runs this between two scheduler steps (a utility call), with every running request
        waiting and keeping its KV cache: the counts say which of their tokens the old weights sampled
        (:mod:`verl_pipe.backends.cpu.in_flight_loads`)."""
        from verl.utils.vllm.vllm_quant_utils import is_quantized_model

        mid_answer = sum(1 for state in self.model_runner.requests.values() if state.output_token_ids)
        sampled_before = _sampled_so_far(self.model_runner)
        if peft_config or self._is_qat_model or self._is_modelopt_qat or is_quantized_model(
            self.model_runner.vllm_config
        ):
            super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)
            return {"sampled_before": sampled_before}
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

        if self.device is None:
            self.device = torch.device("cpu")
        models = list(self._iter_all_models_with_config())
        for model, _ in models:
            initialize_layerwise_reload(model)

        def on_bucket_received(weights: list[tuple[str, torch.Tensor]], is_last: bool) -> None:
            owned = [(name, tensor.clone()) for name, tensor in weights]
            del weights
            self._update_weights(owned, peft_config=None, base_sync_done=base_sync_done)

        receiver = BucketedWeightReceiver(zmq_handle=self._get_zmq_handle(), device=self.device, use_shm=use_shm)
        receiver.receive_weights(on_bucket_received=on_bucket_received)
        for model, model_config in models:
            finalize_layerwise_reload(model, model_config)
            _repack_kept_weights(model)
        _record_sync_probe(self.model_runner.model, mid_answer)
        return {"sampled_before": sampled_before}


def _count_ended_requests(runner) -> None:
    """Keep the token count of every request the model runner drops (it ended), until the next load reports it.

    A request that ends in the last step before a load is still in the runner's table; one that ended earlier is
    not, and its answer may still be on its way to the server when the load's counts arrive there."""
    runner.verl_pipe_ended = {}
    dropped = runner._on_request_state_removed

    def on_request_state_removed(req_id, req_state, *args, **kwargs):
        if req_state is not None:
            runner.verl_pipe_ended[req_id] = len(req_state.output_token_ids)
        return dropped(req_id, req_state, *args, **kwargs)

    runner._on_request_state_removed = on_request_state_removed


def _sampled_so_far(runner) -> dict[str, int]:
    """Per engine request id: the output tokens sampled so far, by the requests running and those ended since the
    last load (then forgotten: each load reports what happened since the one before)."""
    ended = getattr(runner, "verl_pipe_ended", {})
    counts = {req_id: len(state.output_token_ids) for req_id, state in runner.requests.items()}
    counts.update({req_id: n for req_id, n in ended.items() if req_id not in counts})
    ended.clear()
    return counts


# Tests only: a file to which every weight sync appends a checksum of the engine's host-resident weights.
SYNC_PROBE_ENV = "VERL_PIPE_VLLM_SYNC_PROBE"


def _record_sync_probe(model: torch.nn.Module, mid_answer: int) -> None:
    """``mid_answer``: the running requests that had sampled some of their answer when this load began."""
    path = os.environ.get(SYNC_PROBE_ENV)
    if not path:
        return
    # Linear weights live packed inside their GEMM closures on CPU; the embedding (and a tied LM head) and the
    # norms keep theirs, which is enough to tell one set of weights from another.
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters() if p.numel())
    record = {
        "replica": os.environ.get("VERL_REPLICA_RANK", "0"),
        "checksum": checksum,
        "time": time.time(),
        "mid_answer": mid_answer,
    }
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


# Tests only: seconds each engine step waits before it runs. The runs that need a sync to land while answers decode
# set it, so that generating a batch outlasts a training step on any CPU (on a fast one the batch was done first).
STEP_DELAY_ENV = "VERL_PIPE_VLLM_STEP_DELAY_S"


def _pace_engine_steps(runner) -> None:
    delay = float(os.environ.get(STEP_DELAY_ENV) or 0)
    if delay <= 0:
        return
    execute = runner.execute_model

    def paced_execute_model(*args, **kwargs):
        time.sleep(delay)
        return execute(*args, **kwargs)

    runner.execute_model = paced_execute_model
    logger.warning("%s=%s: every vLLM engine step waits that long first (a test setting)", STEP_DELAY_ENV, delay)


def _repack_kept_weights(model: torch.nn.Module) -> int:
    """Rebuild the CPU GEMM of every layer that keeps its weight (embedding, LM head) from that weight.

    Those layers pack a copy of their weight for the logits GEMM (``cpu_linear``). A tied LM head loads nothing of
    its own, so the layerwise reload puts its old tensors back and its packed copy would stay the old weights
    (the engine would sample from the initial, e.g. dummy, LM head); the embedding's packed copy was built from a
    temporary tensor. Both are rebuilt here from the updated parameter.
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    rebuilt = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.numel():
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            rebuilt += 1
    return rebuilt
