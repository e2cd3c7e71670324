"""Install the ``interleaved`` reward manager and its step metrics into verl, lazily and version-guarded.

* The manager registers when verl imports its reward-manager registry package, which is also what verl's
  ``RewardManagerConfig`` does on the driver before it checks the configured name.
* V1 trainer: ``PPOTrainer._compute_metrics`` reads only tensors from TransferQueue; the patch (declared in
  :mod:`verl_pipe.patch_registry`) also reads each sample's ``extra_fields.reward_extra_info`` and adds
  ``reward/*`` (:mod:`verl_pipe.reward_manager.metrics`).
* Legacy trainer: the reward info arrives as top-level non-tensor fields of the batch;
  :func:`legacy_batch_reward_metrics` is a :mod:`verl_pipe.step_metrics` contributor.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

from verl_pipe import step_metrics
from verl_pipe.import_hooks import when_imported
from verl_pipe.patching import fired, is_patched, mark_patched
from verl_pipe.reward_manager.metrics import TIMING_KEYS, reward_step_metrics

logger = logging.getLogger("verl_pipe")

_V1_MODULE = "verl.trainer.ppo.v1.trainer_base"


def _register_manager(_module) -> None:
    importlib.import_module("verl_pipe.reward_manager.interleaved")


def v1_reward_infos(batch: Any) -> list[dict[str, Any]]:
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    extras = data.pop("extra_fields").tolist()
    return [dict(e.get("reward_extra_info") or {}) for e in extras if isinstance(e, dict)]


def _patch_v1_compute_metrics() -> None:
    module = importlib.import_module(_V1_MODULE)
    original = module.PPOTrainer._compute_metrics
    if is_patched(original):
        return

    @mark_patched(original)
    @functools.wraps(original)
    def _compute_metrics(self, batch, metrics, *args, **kwargs):
        result = original(self, batch, metrics, *args, **kwargs)
        fired("interleaved_reward_step_metrics@v1")
        try:
            metrics.update(reward_step_metrics(v1_reward_infos(batch)))
        except Exception as error:  # noqa: BLE001 - metrics must never stop training; say so once per step
            logger.warning("verl-pipe: reward step metrics skipped: %s: %s", type(error).__name__, error)
        return result

    module.PPOTrainer._compute_metrics = _compute_metrics


def legacy_batch_reward_metrics(batch: Any) -> dict[str, float]:
    """``reward/*`` from a legacy ``DataProto`` whose non-tensor fields carry the per-sample reward info."""
    fields = getattr(batch, "non_tensor_batch", None) or {}
    if not all(key in fields for key in TIMING_KEYS):
        return {}
    keys = [*TIMING_KEYS, *(k for k in ("outcome", "sandbox_error") if k in fields)]
    n = len(fields[TIMING_KEYS[0]])
    return reward_step_metrics([{key: fields[key][i] for key in keys} for i in range(n)])


def install() -> None:
    when_imported("verl.experimental.reward_loop.reward_manager", _register_manager)
    step_metrics.add_contributor(legacy_batch_reward_metrics)
