"""Typed configuration of GRPO+ and its start-up validation.

GRPO+ reuses verl's own keys wherever verl has one (``actor.clip_ratio_low/high/c``, ``actor.loss_agg_mode``,
``algorithm.norm_adv_by_std_in_grpo``). What verl lacks lives in two places:

* ``actor_rollout_ref.actor.policy_loss.*`` -- :class:`GRPOPlusPolicyLossConfig`, a subclass of verl's strict
  ``PolicyLossConfig`` selected with ``policy_loss._target_`` (verl rejects unknown keys otherwise);
* ``algorithm.grpo_plus.*`` -- :class:`GRPOPlusAdvantageConfig` (``algorithm`` is a free-form DictConfig).

Every error names the full config key and the allowed values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any, Mapping

from verl.workers.config.actor import PolicyLossConfig

logger = logging.getLogger("verl_pipe")

GRPO_PLUS = "grpo_plus"
POLICY_LOSS_KEY = "actor_rollout_ref.actor.policy_loss"
ACTOR_KEY = "actor_rollout_ref.actor"
ADVANTAGE_KEY = "algorithm.grpo_plus"
POLICY_LOSS_TARGET = "verl_pipe.algorithms.config.GRPOPlusPolicyLossConfig"

# Which truncated responses overlong filtering removes from the loss.
OVERLONG_FILTER_MODES = ("all", "wrong", "off")
VALID_LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def _check_open_unit_interval(key: str, value: float) -> None:
    if not 0.0 < float(value) < 1.0:
        raise ValueError(f"{key}={value} is out of range: it must lie strictly between 0 and 1.")


@dataclass
class GRPOPlusPolicyLossConfig(PolicyLossConfig):
    """``actor_rollout_ref.actor.policy_loss`` for GRPO+ (select it with ``policy_loss._target_``).

    Args:
        overlong_filter: remove responses that hit the length limit without EOS from the loss, numerator and
            denominator: ``all`` truncated ones (DeepCoder), only the ``wrong`` ones (reward <= 0), or ``off``.
        dual_clip: apply verl's dual clip (``actor.clip_ratio_c``) to negative-advantage tokens, as verl's
            ``vanilla`` loss always does.
        is_correction: token-level importance-sampling mask against the rollout engine's log-probs; a token whose
            ratio pi_theta / pi_rollout leaves (1 - is_eps_low, 1 + is_eps_high) contributes zero.
        is_eps_low / is_eps_high: the two sides of that interval, each strictly between 0 and 1.
    """

    loss_mode: str = GRPO_PLUS
    overlong_filter: str = "all"
    dual_clip: bool = True
    is_correction: bool = True
    is_eps_low: float = 0.2
    is_eps_high: float = 0.28

    def __post_init__(self):
        if self.overlong_filter not in OVERLONG_FILTER_MODES:
            raise ValueError(
                f"{POLICY_LOSS_KEY}.overlong_filter={self.overlong_filter!r} is not one of {OVERLONG_FILTER_MODES}."
            )
        _check_open_unit_interval(f"{POLICY_LOSS_KEY}.is_eps_low", self.is_eps_low)
        _check_open_unit_interval(f"{POLICY_LOSS_KEY}.is_eps_high", self.is_eps_high)


@dataclass(frozen=True)
class GRPOPlusLossSettings:
    """The numbers the GRPO+ loss uses, resolved from verl's actor config (plain values, easy to test)."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float | None = 3.0  # None: no dual clip
    overlong_filter: str = "all"
    is_correction: bool = True
    is_eps_low: float = 0.2
    is_eps_high: float = 0.28

    @classmethod
    def from_actor_config(cls, actor: Any) -> "GRPOPlusLossSettings":
        policy_loss = actor.get("policy_loss", None) or {}
        defaults = GRPOPlusPolicyLossConfig()

        def loss_field(name: str):
            value = policy_loss.get(name, None) if hasattr(policy_loss, "get") else None
            return getattr(defaults, name) if value is None else value

        clip = actor.get("clip_ratio", 0.2)
        low = actor.get("clip_ratio_low", None)
        high = actor.get("clip_ratio_high", None)
        return cls(
            clip_ratio_low=float(clip if low is None else low),
            clip_ratio_high=float(clip if high is None else high),
            clip_ratio_c=float(actor.get("clip_ratio_c", 3.0)) if loss_field("dual_clip") else None,
            overlong_filter=str(loss_field("overlong_filter")),
            is_correction=bool(loss_field("is_correction")),
            is_eps_low=float(loss_field("is_eps_low")),
            is_eps_high=float(loss_field("is_eps_high")),
        )


def validate_actor_for_grpo_plus(actor: Any) -> None:
    """Start-up checks of the verl actor keys GRPO+ relies on; raises ValueError naming the key.

    Also refuses to start (:class:`~verl_pipe.patching.CriticalPatchMissing`) when a patch GRPO+ needs to train
    what it says no longer matches the installed verl.
    """
    from verl_pipe.patching import require_patches

    require_patches("grpo_plus")
    mode = actor.get("loss_agg_mode", "token-mean")
    if mode not in VALID_LOSS_AGG_MODES:
        raise ValueError(f"{ACTOR_KEY}.loss_agg_mode={mode!r} is not one of {VALID_LOSS_AGG_MODES}.")
    for name in ("clip_ratio", "clip_ratio_low"):
        value = actor.get(name, None)
        if value is not None and not 0.0 <= float(value) < 1.0:
            raise ValueError(f"{ACTOR_KEY}.{name}={value} is out of range: GRPO+ needs 0 <= {name} < 1.")
    high = actor.get("clip_ratio_high", None)
    if high is not None and float(high) < 0.0:
        raise ValueError(f"{ACTOR_KEY}.clip_ratio_high={high} is negative: the upper clip is 1 + clip_ratio_high.")
    policy_loss = actor.get("policy_loss", None)
    if policy_loss is not None and not isinstance(policy_loss, GRPOPlusPolicyLossConfig):
        logger.warning(
            "verl-pipe: %s.loss_mode=grpo_plus without %s._target_=%s: GRPO+ runs with its default overlong and "
            "importance-sampling settings.",
            POLICY_LOSS_KEY,
            POLICY_LOSS_KEY,
            POLICY_LOSS_TARGET,
        )
    settings = GRPOPlusLossSettings.from_actor_config(actor)
    if settings.clip_ratio_c is not None and settings.clip_ratio_c <= 1.0:
        raise ValueError(f"{ACTOR_KEY}.clip_ratio_c={settings.clip_ratio_c} must be > 1 for the dual clip.")
    if actor.get("entropy_coeff", 0.0) or actor.get("use_kl_loss", False):
        logger.warning(
            "verl-pipe: GRPO+ is defined without entropy bonus and KL loss, but %s.entropy_coeff=%s and "
            "%s.use_kl_loss=%s; running with them as configured.",
            ACTOR_KEY,
            actor.get("entropy_coeff", 0.0),
            ACTOR_KEY,
            actor.get("use_kl_loss", False),
        )


@dataclass(frozen=True)
class GRPOPlusAdvantageConfig:
    """``algorithm.grpo_plus.*``; std normalisation uses verl's own ``algorithm.norm_adv_by_std_in_grpo``.

    Args:
        epsilon: added to the group's standard deviation before dividing (std normalisation only).
    """

    epsilon: float = 1e-6

    @classmethod
    def from_algorithm_config(cls, algorithm: Mapping | None) -> "GRPOPlusAdvantageConfig":
        section = (algorithm.get("grpo_plus", None) if algorithm is not None else None) or {}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"unknown key(s) {[f'{ADVANTAGE_KEY}.{k}' for k in unknown]}; known: {sorted(known)}.")
        config = cls(**{k: section[k] for k in section})
        if not float(config.epsilon) > 0.0:
            raise ValueError(f"{ADVANTAGE_KEY}.epsilon={config.epsilon} must be > 0.")
        return config


def norm_adv_by_std(algorithm: Mapping | None) -> bool:
    return bool(algorithm.get("norm_adv_by_std_in_grpo", True)) if algorithm is not None else True
