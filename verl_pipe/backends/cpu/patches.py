"""The code of the few patches verl 0.9.x needs to run its real dataflow on the CPU platform, and the one that
makes the plugin's ``hf`` rollout server reachable from verl's rollout workers.

Each is declared, fingerprinted and explained in :mod:`verl_pipe.patch_registry`. The CPU ones apply only when
``VERL_PLATFORM=cpu`` and only on a supported verl version; on GPU they do not run.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket

import torch

from verl_pipe.patching import fired, is_patched
from verl_pipe.patching import mark_patched as _mark

logger = logging.getLogger(__name__)


# --- 1. Resource check counts only GPUs/NPUs --------------------------------------------------------------


def _patch_resource_check() -> None:
    import ray
    from verl.single_controller.ray import base

    original = base.ResourcePoolManager._check_resource_available
    if is_patched(original):
        return

    @_mark(original)
    def _check_resource_available(self):
        fired("resource_check_counts_cpus")
        available = ray._private.state.available_resources_per_node()
        total_cpus = sum(node.get("CPU", 0) for node in available.values())
        required = sum(n for nodes in self.resource_pool_spec.values() for n in nodes)
        if total_cpus < required:
            raise ValueError(
                f"Ray has {total_cpus:g} CPUs for {required} CPU ranks: raise ray_kwargs.ray_init.num_cpus "
                f"(Ray CPUs are logical; over-subscribing a small machine is fine) or lower trainer.n_gpus_per_node."
            )

    base.ResourcePoolManager._check_resource_available = _check_resource_available


# --- 2. Process-group backend string "cpu:gloo,cpu:gloo" -------------------------------------------------

_PORT_RETRIES = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


_GLOO_FN_MODULES = ("verl.utils.distributed", "verl.workers.engine_workers", "verl.checkpoint_engine.base")


def _patch_gloo_backend() -> None:
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if is_patched(original):
        return

    @_mark(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        fired("gloo_backend_string")
        # torch rejects a backend string that names the cpu device twice.
        backend = backend or "cpu:gloo"
        for attempt in range(_PORT_RETRIES + 1):
            try:
                return original(timeout_second=timeout_second, backend=backend)
            except torch.distributed.DistNetworkError as error:
                # verl's worker group picks MASTER_PORT free in the driver and rank 0 binds it later; on a busy host
                # (2 cores, a Ray cluster starting workers) another process takes it in between now and then. A
                # one-rank group has no peer that knows the port, so it can move; a larger one must fail.
                one_rank = os.environ.get("WORLD_SIZE", "1") == "1"
                if attempt == _PORT_RETRIES or "EADDRINUSE" not in str(error) or not one_rank:
                    raise
                taken, os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT"), str(_free_port())
                logger.warning("MASTER_PORT %s was taken before this one-rank process group bound it; moved to %s",
                               taken, os.environ["MASTER_PORT"])  # fmt: skip

    # engine_workers and checkpoint_engine import the function by name, so rebind it there too.
    for module_name in _GLOO_FN_MODULES:
        module = importlib.import_module(module_name)
        if getattr(module, "initialize_global_process_group_ray", None) is original:
            module.initialize_global_process_group_ray = initialize_global_process_group_ray


# --- 3. FSDP2 forward-only models pin CPU memory -----------------------------------------------------------


def _patch_offload_pin_memory() -> None:
    from verl.workers.engine.fsdp import transformer_impl

    policy_cls = transformer_impl.CPUOffloadPolicy
    if is_patched(policy_cls):
        return

    @_mark(policy_cls)
    class UnpinnedCPUOffloadPolicy(policy_cls):
        # Pinning needs an accelerator runtime; on a CPU-only host torch raises instead.
        def __init__(self, pin_memory: bool = True):
            fired("fsdp2_offload_without_pinning")
            super().__init__(pin_memory=False)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


# --- 4. Value-head (critic) loader hard-codes flash-attention ----------------------------------------------


def _patch_valuehead_attention() -> None:
    from verl.utils import model as model_utils

    original = model_utils.load_valuehead_model
    if is_patched(original):
        return

    @_mark(original)
    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        fired("valuehead_attention_from_config")
        from transformers import AutoModelForTokenClassification

        # Honour the attention implementation the config already carries (sdpa on CPU).
        attn = getattr(model_config, "_attn_implementation", None) or "sdpa"
        if attn == "flash_attention_2":
            attn = "sdpa"
        try:
            return AutoModelForTokenClassification.from_pretrained(
                pretrained_model_name_or_path=local_path,
                torch_dtype=torch_dtype,
                config=model_config,
                attn_implementation=attn,
                trust_remote_code=trust_remote_code,
            )
        except (ValueError, KeyError):
            return original(local_path, torch_dtype, model_config, trust_remote_code)

    model_utils.load_valuehead_model = load_valuehead_model


# --- The hf rollout server's worker-side adapter -------------------------------------------------------------


def _add_hf_server_adapter() -> None:
    """Patch ``hf_rollout_server_adapter``: verl's worker-side adapter table has no public register function."""
    from verl.workers.rollout import base as rollout_base

    rollout_base._ROLLOUT_REGISTRY[("hf", "async")] = "verl_pipe.backends.cpu.hf_replica.HFServerAdapter"
