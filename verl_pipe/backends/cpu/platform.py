"""The ``cpu`` platform for verl's platform registry (``VERL_PLATFORM=cpu``).

verl 0.9.1 ships CUDA, NPU and ROCm platforms and silently falls back to ``nvidia`` when it finds no
accelerator. This platform lets verl's whole dataflow (workers, FSDP2 engines, rollout servers) run on CPU:
device ``cpu``, collectives over ``gloo``, and one Ray ``CPU`` per rank instead of one ``GPU``.
It is never auto-detected: a GPU cluster must not end up on it by accident.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import types
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase

from verl_pipe.compat import SetupError
from verl_pipe.patching import fired, is_patched, mark_patched

logger = logging.getLogger("verl_pipe")

PLATFORM_NAME = "cpu"


def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the CUDA-style calls verl makes on whatever ``get_torch_device()`` returns.

    verl calls ``empty_cache``, ``mem_get_info``, memory statistics and RNG-state helpers on the device module
    unconditionally; on CPU they are no-ops or report host memory, so the calling code needs no branches.
    """
    shim = types.ModuleType("verl_pipe_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(shim, name, getattr(torch.cpu, name))

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    def zero(*_args: Any, **_kwargs: Any) -> int:
        return 0

    def noop(*_args: Any, **_kwargs: Any) -> None:
        return None

    shim.is_available = lambda: True
    shim.device_count = lambda: 1
    shim.current_device = lambda: "cpu"
    shim.set_device = noop
    shim.synchronize = noop
    shim.empty_cache = noop
    shim.reset_peak_memory_stats = noop
    shim.mem_get_info = mem_get_info
    shim.memory_allocated = zero
    shim.max_memory_allocated = zero
    shim.memory_reserved = zero
    shim.max_memory_reserved = zero
    shim.memory_stats = lambda *a, **k: {}
    shim.manual_seed = torch.manual_seed
    shim.manual_seed_all = torch.manual_seed
    shim.get_rng_state = torch.get_rng_state
    shim.set_rng_state = torch.set_rng_state
    shim.get_device_name = lambda *a, **k: "cpu"
    shim.get_device_capability = lambda *a, **k: (None, None)
    shim.Stream = getattr(torch.cpu, "Stream", None)
    shim.stream = getattr(torch.cpu, "stream", contextlib.nullcontext)
    shim.current_stream = getattr(torch.cpu, "current_stream", lambda *a, **k: None)
    return shim


class PlatformCPU(PlatformBase):
    """verl platform that runs every rank on the host CPU with gloo collectives."""

    _device_module: Optional[types.ModuleType] = None

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        if PlatformCPU._device_module is None:
            PlatformCPU._device_module = _cpu_device_module()
        return PlatformCPU._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Only an explicit VERL_PLATFORM=cpu selects this platform; auto-detection must never pick it.
        return False

    def current_device(self) -> str:  # type: ignore[override]
        # verl passes this straight to `.to(...)` and `torch.device(...)`; an int would mean cuda:0.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray never sets this for CPU actors; verl only reads it, so a name nobody sets is the honest answer.
        return "VERL_PIPE_CPU_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # Ray rejects resources={"CPU": x}; CPU must be requested through num_cpus.
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def rollout_env_vars(self) -> dict[str, str]:
        # vLLM's CPU worker binds its OpenMP threads by default ("auto"), keeping one core of the node for its
        # scheduler: on 2 cores it decodes on one, pinned, beside a trainer that alternates with it anyway.
        # "nobind" leaves the threads to the OS and their count to OMP_NUM_THREADS (the job's share of the
        # cores): the demo's greedy validation, alone, 23.0 s bound to one core, 18.5 s on two unbound (14.9 s
        # bound to both, which a busy process beside it makes 28.0 s). A user's own setting wins.
        return {"VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")}

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def selected() -> bool:
    """True when the user asked verl for the CPU platform."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def register_platform() -> None:
    from verl.plugin.platform.platform_manager import PlatformRegistry

    PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)


_NO_ACCELERATOR_HINT = (
    "no GPU or NPU found and VERL_PLATFORM is not set: set VERL_PLATFORM=cpu to run verl on the CPU backend of "
    "verl-pipe (with trainer.device=cpu), or run on a machine with an accelerator."
)


def _guard_silent_nvidia_fallback() -> None:
    """Patch ``no_silent_nvidia_fallback``: verl's silent fallback to CUDA on a GPU-less machine becomes a clear
    message naming VERL_PLATFORM."""
    from verl.plugin.platform import platform_manager

    original = platform_manager._detect_platform_name
    if is_patched(original):
        return

    @mark_patched(original)
    def _detect_platform_name() -> str:
        name = original()
        if name != "nvidia" or os.environ.get("VERL_PLATFORM"):
            return name
        if torch.cuda.is_available() or platform_manager.PlatformRegistry.get("nvidia")().is_platform_available(True):
            return name
        fired("no_silent_nvidia_fallback")
        main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if main_spec is not None and main_spec.name.startswith("verl."):
            raise SetupError(_NO_ACCELERATOR_HINT)  # a verl trainer would die later inside NCCL; stop here
        logger.warning("verl-pipe: %s", _NO_ACCELERATOR_HINT)
        return name

    platform_manager._detect_platform_name = _detect_platform_name
