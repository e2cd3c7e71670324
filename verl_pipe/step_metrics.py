"""One hook that adds verl-pipe's metrics to verl's per-step data metrics, in both trainers.

verl builds a step's data metrics with ``compute_data_metrics(batch=...)`` and offers no way to add to them.
Several parts of verl-pipe need to (GRPO+'s degenerate-group counts, the interleaved reward manager's
``reward/*`` on the legacy trainer), so a single version-guarded patch calls every registered contributor;
a part registers a contributor with :func:`add_contributor` instead of wrapping the function again.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from verl_pipe.import_hooks import when_imported
from verl_pipe.patching import VerlPatch, apply_patches, is_patched, mark_patched

Contributor = Callable[[Any], dict[str, float]]  # the step's batch -> extra metrics

APPLIED: list[str] = []
TRAINER_MODULES = ("verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.trainer_base")
_CONTRIBUTORS: list[Contributor] = []
_installed = False


def add_contributor(contributor: Contributor) -> None:
    if contributor not in _CONTRIBUTORS:
        _CONTRIBUTORS.append(contributor)


def _wrap(original):
    if is_patched(original):
        return original

    @mark_patched(original)
    @functools.wraps(original)
    def compute_data_metrics(*args, **kwargs):
        metrics = original(*args, **kwargs)
        batch = args[0] if args else kwargs.get("batch")
        for contributor in _CONTRIBUTORS:
            metrics.update(contributor(batch))
        return metrics

    return compute_data_metrics


def _patch(module_name: str) -> VerlPatch:
    def apply() -> None:
        # The trainers import compute_data_metrics by name, so the binding in each trainer module is replaced.
        module = importlib.import_module(module_name)
        module.compute_data_metrics = _wrap(module.compute_data_metrics)

    return VerlPatch(
        name=f"step_metrics@{module_name.rsplit('.', 1)[-1]}",
        target=f"{module_name}:compute_data_metrics",
        fingerprint="critic/score/mean",
        upstream="compute_data_metrics has no hook for metrics from plugins (estimators, reward managers)",
        apply=apply,
    )


PATCHES: dict[str, VerlPatch] = {name: _patch(name) for name in TRAINER_MODULES}


def install() -> None:
    """Patch both trainers when verl imports them; idempotent (each contributing part calls it)."""
    global _installed
    if _installed:
        return
    _installed = True
    for module_name, patch in PATCHES.items():
        when_imported(module_name, lambda _m, patch=patch: APPLIED.extend(apply_patches([patch], group="step metrics")))
