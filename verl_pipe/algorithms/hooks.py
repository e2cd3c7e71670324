"""Where GRPO+ meets verl: registrations and the version-guarded patches verl's call sites need.

verl's extension points cover the estimator and the loss; four things GRPO+ needs they do not reach:

1. ``ActorConfig.__post_init__``: bad GRPO+ actor settings must stop the run at start-up, naming the key
   (verl validates the actor config on the driver in ``validate_config``).
2. ``ppo_loss`` (the actor's loss function, bound by the engine workers): it hands the policy loss only
   old log-probs, advantages and masks. The hook passes the micro-batch's rollout log-probs on to the
   grpo_plus loss for its importance-sampling mask.
3. ``TrainingWorker.train_mini_batch`` (with ``ActorRolloutRefWorker.update_actor`` handing it the settings):
   overlong filtering must mask the batch before verl counts the global token denominator; the hook masks
   the actor's local copy of the batch and reports the counts.
4. ``compute_data_metrics`` in both trainers: an advantage estimator has no way to emit metrics; the grpo_plus
   group counts go into the step's metrics through :mod:`verl_pipe.step_metrics`.

Each hook is a no-op unless grpo_plus is selected. They are declared in :mod:`verl_pipe.patch_registry` and
applied lazily, when verl imports the module concerned (:mod:`verl_pipe.import_hooks`), so processes that never
train pay nothing. Hooks 2 and 3 are correctness-critical: with grpo_plus selected, a verl whose code no longer
matches them stops the run when the actor config is validated (and, as a backstop, at the first update).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

import torch

from verl_pipe.import_hooks import when_imported
from verl_pipe.patching import fired, is_patched, mark_patched
from verl_pipe.step_metrics import add_contributor





def _is_grpo_plus(policy_loss) -> bool:
    return policy_loss is not None and policy_loss.get("loss_mode", "vanilla") == "grpo_plus"


# --- 1. start-up validation ---------------------------------------------------------------------------------


def _patch_actor_config_validation() -> None:
    from verl.workers.config import actor as actor_module

    original = actor_module.ActorConfig.__post_init__
    if is_patched(original):
        return

    @mark_patched(original)
    @functools.wraps(original)
    def __post_init__(self):
        if _is_grpo_plus(self.policy_loss):
            fired("grpo_plus_actor_validation")
            from verl_pipe.algorithms.config import validate_actor_for_grpo_plus

            validate_actor_for_grpo_plus(self)
        original(self)

    actor_module.ActorConfig.__post_init__ = __post_init__


# --- 2. rollout log-probs for the loss ----------------------------------------------------------------------


def _patch_ppo_loss() -> None:
    from verl.workers import engine_workers
    from verl.workers.utils import losses

    original = losses.ppo_loss
    if is_patched(original):
        return

    @mark_patched(original)
    @functools.wraps(original)
    def ppo_loss(config, model_output, data, dp_group=None):
        if not _is_grpo_plus(config.policy_loss) or "rollout_log_probs" not in data.keys():
            return original(config, model_output, data, dp_group=dp_group)
        from verl_pipe.algorithms.policy_loss import rollout_log_probs_for_loss

        fired("grpo_plus_rollout_log_probs_to_loss")

        # padded exactly as verl pads old_log_probs inside ppo_loss, so the two align token for token
        rollout_log_probs = data.select("rollout_log_probs", "response_mask").to_padded_tensor()["rollout_log_probs"]
        with rollout_log_probs_for_loss(rollout_log_probs):
            return original(config, model_output, data, dp_group=dp_group)

    losses.ppo_loss = ppo_loss
    # the engine workers bind the name at import and partial() it in init_model, which runs after this
    if engine_workers.ppo_loss is original:
        engine_workers.ppo_loss = ppo_loss


# --- 3. overlong filtering before verl counts tokens --------------------------------------------------------

# The actor worker's update_actor receives TransferQueue metadata, not the batch; the batch is materialised
# inside verl's dispatch wrapper. So update_actor only hands the settings to its TrainingWorker, and the
# TrainingWorker's train_mini_batch -- called directly with the real TensorDict -- masks it.
_OVERLONG_ATTR = "_verl_pipe_overlong_filter"


@dataclass(frozen=True)
class _OverlongFilterSettings:
    mode: str
    max_response_length: int
    eos_ids: frozenset


def _overlong_settings(worker) -> _OverlongFilterSettings | None:
    from verl_pipe.algorithms.config import GRPOPlusLossSettings
    from verl_pipe.algorithms.overlong import eos_token_ids

    actor_config = worker.config.actor
    if not _is_grpo_plus(actor_config.get("policy_loss", None)):
        return None
    mode = GRPOPlusLossSettings.from_actor_config(actor_config).overlong_filter
    if mode == "off":
        return None
    return _OverlongFilterSettings(
        mode=mode,
        max_response_length=int(worker.config.rollout.response_length),
        eos_ids=frozenset(eos_token_ids(getattr(worker.actor, "model_config", None))),
    )


def _apply_overlong_filter(training_worker, settings: _OverlongFilterSettings, data):
    """Mask the filtered samples of this rank's batch; returns the counts summed over data-parallel ranks."""
    from verl_pipe.algorithms.overlong import OverlongStats, apply_overlong_filter

    stats = apply_overlong_filter(data, settings.max_response_length, set(settings.eos_ids), settings.mode)
    counts = torch.tensor([stats.samples, stats.truncated, stats.masked, stats.masked_tokens], dtype=torch.float64)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(counts, group=training_worker.engine.get_data_parallel_group())
    samples, truncated, masked, masked_tokens = (int(v) for v in counts.tolist())
    return OverlongStats(samples=samples, truncated=truncated, masked=masked, masked_tokens=masked_tokens,
                         length_limit=stats.length_limit)


def _patch_update_actor() -> None:
    from verl.workers import engine_workers

    original = engine_workers.ActorRolloutRefWorker.update_actor
    if is_patched(original):
        return

    # functools.wraps copies verl's dispatch registration (a function attribute) onto the wrapper
    @mark_patched(original)
    @functools.wraps(original)
    def update_actor(self, data):
        if _is_grpo_plus(self.config.actor.get("policy_loss", None)):
            fired("grpo_plus_overlong_settings_to_training_worker")
        if not hasattr(self.actor, _OVERLONG_ATTR):
            setattr(self.actor, _OVERLONG_ATTR, _overlong_settings(self))
        return original(self, data)

    engine_workers.ActorRolloutRefWorker.update_actor = update_actor


def _patch_train_mini_batch() -> None:
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers import engine_workers

    original = engine_workers.TrainingWorker.train_mini_batch
    if is_patched(original):
        return

    @mark_patched(original)
    @functools.wraps(original)
    def train_mini_batch(self, data):
        settings = getattr(self, _OVERLONG_ATTR, None)
        if settings is None or not isinstance(data, TensorDict):
            return original(self, data)
        fired("grpo_plus_overlong_mask_before_token_count")
        stats = _apply_overlong_filter(self, settings, data)
        output = original(self, data)
        if output is not None:
            metrics = tu.get(output, "metrics")
            for key, value in stats.as_metrics().items():
                metrics[key] = [value]
        return output

    engine_workers.TrainingWorker.train_mini_batch = train_mini_batch


# --- 4. advantage metrics into the step's metrics -----------------------------------------------------------


def _grpo_plus_step_metrics(_batch) -> dict[str, float]:
    from verl_pipe.algorithms.advantage import drain_advantage_metrics

    return drain_advantage_metrics()


def _register_algorithms(_module) -> None:
    importlib.import_module("verl_pipe.algorithms.advantage")
    importlib.import_module("verl_pipe.algorithms.policy_loss")


def install() -> None:
    """Register GRPO+ (its patches are installed with the others, from :mod:`verl_pipe.patch_registry`)."""
    when_imported("verl.trainer.ppo.core_algos", _register_algorithms)
    add_contributor(_grpo_plus_step_metrics)
