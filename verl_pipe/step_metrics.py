"""One hook that adds verl-pipe's metrics to verl's per-step data metrics, in both trainers.

verl builds a step's data metrics with ``compute_data_metrics(batch=...)`` and offers no way to add to them.
Several parts of verl-pipe need to (GRPO+'s degenerate-group counts, the interleaved reward manager's
``reward/*`` on the legacy trainer), so one version-guarded patch per trainer (declared in
:mod:`verl_pipe.patch_registry`) calls every registered contributor; a part registers a contributor with
:func:`add_contributor` instead of wrapping the function again.

A second patch times each of the V1 trainer's validations into its metrics (``timing_s/validation``), since verl
times only the one after a step: the phase table of a run (:mod:`verl_pipe.run_profile`) reads it.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable
from typing import Any

from verl_pipe.patching import fired, is_patched, mark_patched

Contributor = Callable[[Any], dict[str, float]]  # the step's batch -> extra metrics

TRAINER_MODULES = ("verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.trainer_base")
_CONTRIBUTORS: list[Contributor] = []


def add_contributor(contributor: Contributor) -> None:
    if contributor not in _CONTRIBUTORS:
        _CONTRIBUTORS.append(contributor)


def _wrap(original, patch_name: str):
    if is_patched(original):
        return original

    @mark_patched(original)
    @functools.wraps(original)
    def compute_data_metrics(*args, **kwargs):
        fired(patch_name)
        metrics = original(*args, **kwargs)
        batch = args[0] if args else kwargs.get("batch")
        for contributor in _CONTRIBUTORS:
            metrics.update(contributor(batch))
        return metrics

    return compute_data_metrics


def _patch_trainer_module(module_name: str, patch_name: str) -> None:
    # The trainers import compute_data_metrics by name, so the binding in each trainer module is replaced.
    module = importlib.import_module(module_name)
    module.compute_data_metrics = _wrap(module.compute_data_metrics, patch_name)


def patch_legacy_trainer() -> None:
    _patch_trainer_module(TRAINER_MODULES[0], "step_metrics@ray_trainer")


def patch_v1_trainer() -> None:
    _patch_trainer_module(TRAINER_MODULES[1], "step_metrics@trainer_base")


VALIDATION_TIME_KEY = "timing_s/validation"


def patch_v1_validation_time() -> None:
    """Time every V1 validation into its own metrics; verl times only the one after a step (``timing_s/testing``),
    so the one before training, which a short run spends a large share of its time in, was nowhere."""
    module = importlib.import_module(TRAINER_MODULES[1])
    original = module.PPOTrainer._validate
    if is_patched(original):
        return

    @mark_patched(original)
    @functools.wraps(original)
    def _validate(self, *args, **kwargs):
        fired("validation_time@v1")
        started = time.perf_counter()
        metrics = original(self, *args, **kwargs)
        if isinstance(metrics, dict) and metrics:  # verl asserts a non-empty dict; leave anything else to it
            metrics[VALIDATION_TIME_KEY] = time.perf_counter() - started
        return metrics

    module.PPOTrainer._validate = _validate
