"""The vLLM worker extension for weight syncs on CPU (loaded by name inside vLLM's worker process): the
platform-neutral one (:mod:`verl_pipe.rollout.vllm_worker`, the counts in-flight loads need), with its load replaced.

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
loads) get their packed copy rebuilt afterwards. Received tensors are copied out of the shared-memory bucket first,
since the layerwise loader holds a layer's weights until all of them arrived and the bucket is reused for the next
batch of tensors.

Full unquantized weights only: LoRA adapters and quantized models keep verl's path (not checked on CPU).
"""

from __future__ import annotations

import logging
import os
import time

import torch

from verl_pipe.rollout.vllm_worker import InFlightWorkerExtension

logger = logging.getLogger("verl_pipe")


class CPUvLLMWorkerExtension(InFlightWorkerExtension):
    """The platform-neutral extension (counts for in-flight loads), with a load that survives vLLM's CPU repacking."""

    def monkey_patch_model(self, *args, **kwargs):
        result = super().monkey_patch_model(*args, **kwargs)
        _pace_engine_steps(self.model_runner)
        return result

    def _load_weights(self, peft_config, base_sync_done, use_shm) -> None:
        from verl.utils.vllm.vllm_quant_utils import is_quantized_model

        if peft_config or self._is_qat_model or self._is_modelopt_qat or is_quantized_model(
            self.model_runner.vllm_config
        ):
            super()._load_weights(peft_config, base_sync_done, use_shm)
            return
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
