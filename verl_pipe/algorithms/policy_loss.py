"""GRPO+'s policy loss, registered in verl as ``actor_rollout_ref.actor.policy_loss.loss_mode=grpo_plus``.

Per response token t, with ratio rho_t = pi_theta / pi_old and advantage A_t:

    l_t = max(-A_t * rho_t, -A_t * clip(rho_t, 1 - eps_low, 1 + eps_high))      asymmetric clip (clip-high)
    l_t = min(l_t, -A_t * c)  when A_t < 0                                       dual clip (optional)
    l_t = 0  when r_t = pi_theta / pi_rollout is outside (1 - is_eps_low, 1 + is_eps_high)   token-level IS mask

and the loss is verl's ``agg_loss`` of l over the response mask with verl's global-batch normalisation
(``token-mean`` by default). The mean is taken over the *clipped* surrogate -- the quantity rllm#81 forgot --
so a token past the clip on the side its advantage pushes towards gets exactly zero gradient.

Overlong filtering is not done here: it is a mask on the batch (``verl_pipe.algorithms.overlong``), applied
before verl counts the batch's tokens for the ``token-mean`` denominator. The rollout log-probs reach this
function through :func:`rollout_log_probs_for_loss`, set by the actor-loss hook, because verl's loss call
does not pass them.

Metrics are per micro-batch and verl averages them over micro-batches, as it does its own ``pg_clipfrac``;
a micro-batch with no unmasked token reports 0 for fractions and KLs and 1 for ratio means.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any, Iterator

import torch
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss

from verl_pipe.algorithms.config import GRPO_PLUS, GRPOPlusLossSettings
from verl_pipe.patching import refuse_if_skipped

logger = logging.getLogger("verl_pipe")

_LOG_RATIO_BOUND = 20.0  # as verl: exp(+-20) keeps ratios finite in float32
_ROLLOUT_LOG_PROBS: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "verl_pipe_rollout_log_probs", default=None
)
_warned_no_rollout_log_probs = False


@contextlib.contextmanager
def rollout_log_probs_for_loss(rollout_log_probs: torch.Tensor | None) -> Iterator[None]:
    """Make the micro-batch's rollout log-probs (bs, response_length) visible to the grpo_plus loss."""
    token = _ROLLOUT_LOG_PROBS.set(rollout_log_probs)
    try:
        yield
    finally:
        _ROLLOUT_LOG_PROBS.reset(token)


def _masked_fraction(condition: torch.Tensor, mask: torch.Tensor) -> float:
    count = mask.sum()
    return float((condition & mask).sum() / count) if count > 0 else 0.0


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, empty: float = 0.0) -> float:
    count = mask.sum()
    return float(torch.where(mask, values, torch.zeros_like(values)).sum() / count) if count > 0 else empty


def _k3_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's non-negative KL estimator exp(x) - 1 - x, with x = log(q / p) for samples of p."""
    return torch.expm1(log_ratio) - log_ratio


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, loss_agg_mode: str, global_batch_info: dict | None = None
) -> torch.Tensor:
    """verl's ``agg_loss``, except that a batch with nothing to average gives a zero loss instead of NaN."""
    info = dict(global_batch_info or {})
    loss_mat = torch.where(mask, loss_mat, torch.zeros_like(loss_mat))
    if loss_agg_mode == "token-mean":
        denominator = info.get("batch_num_tokens")
        denominator = mask.sum() if denominator is None else denominator
    elif loss_agg_mode.startswith("seq-mean"):
        denominator = info.get("global_batch_size")
        denominator = (mask.sum(dim=-1) > 0).sum() if denominator is None else denominator
    else:
        denominator = 1
    if float(denominator) == 0.0:
        return loss_mat.sum() * 0.0  # keeps the graph, so backward still runs on every rank
    return agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=loss_agg_mode, **info)


def grpo_plus_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    settings: GRPOPlusLossSettings,
    loss_agg_mode: str = "token-mean",
    global_batch_info: dict | None = None,
    rollout_log_prob: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO+ loss of one micro-batch; all tensors (bs, response_length). Returns (loss, metrics)."""
    mask = response_mask.bool()
    log_ratio = torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    low, high = 1.0 - settings.clip_ratio_low, 1.0 + settings.clip_ratio_high

    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, low, high)
    token_loss = torch.maximum(unclipped, clipped)
    negative = advantages < 0
    dual_clipped = torch.zeros_like(mask)
    if settings.clip_ratio_c is not None:
        dual_bound = -advantages * settings.clip_ratio_c
        dual_clipped = negative & (token_loss > dual_bound)
        token_loss = torch.where(negative, torch.minimum(token_loss, dual_bound), token_loss)

    metrics: dict[str, float] = {}
    if rollout_log_prob is not None and settings.is_correction:
        rollout_log_ratio = torch.clamp(
            log_prob.detach() - rollout_log_prob, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND
        )
        rollout_ratio = torch.exp(rollout_log_ratio)
        in_range = (rollout_ratio > 1.0 - settings.is_eps_low) & (rollout_ratio < 1.0 + settings.is_eps_high)
        token_loss = torch.where(in_range, token_loss, torch.zeros_like(token_loss))
        old_vs_rollout = torch.clamp(old_log_prob - rollout_log_prob, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
        metrics.update(
            {
                "actor/grpo_plus/is_masked_frac": _masked_fraction(~in_range, mask),
                "actor/grpo_plus/is_ratio_mean": _masked_mean(rollout_ratio, mask, empty=1.0),
                "actor/grpo_plus/approx_kl_rollout_old": _masked_mean(_k3_kl(old_vs_rollout), mask),
            }
        )
    if rollout_is_weights is not None:  # verl's own rollout-correction weights, applied as verl's vanilla does
        token_loss = token_loss * rollout_is_weights

    loss = aggregate_loss(token_loss, mask, loss_agg_mode, global_batch_info)

    detached_ratio = ratio.detach()
    metrics.update(
        {
            "actor/grpo_plus/clipfrac_high": _masked_fraction((advantages > 0) & (detached_ratio > high), mask),
            "actor/grpo_plus/clipfrac_low": _masked_fraction(negative & (detached_ratio < low), mask),
            "actor/grpo_plus/dual_clipfrac": _masked_fraction(dual_clipped, mask),
            "actor/grpo_plus/ratio_mean": _masked_mean(detached_ratio, mask, empty=1.0),
            "actor/grpo_plus/approx_kl_old_new": _masked_mean(_k3_kl(log_ratio.detach()), mask),
            # verl's vanilla metric names, so existing dashboards keep working
            "actor/pg_clipfrac": _masked_fraction(clipped.detach() > unclipped.detach(), mask),
            "actor/ppo_kl": _masked_mean(-log_ratio.detach(), mask),
            "actor/pg_clipfrac_lower": _masked_fraction(dual_clipped, mask),
        }
    )
    return loss, metrics


@register_policy_loss(GRPO_PLUS)
def compute_policy_loss_grpo_plus(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's policy-loss signature (called inside the actor worker by ``verl.workers.utils.losses.ppo_loss``)."""
    global _warned_no_rollout_log_probs
    if config is None:
        raise ValueError("the grpo_plus policy loss needs verl's actor config (config=...)")
    refuse_if_skipped("grpo_plus")  # before any update: never train GRPO+ without the patches it relies on
    settings = GRPOPlusLossSettings.from_actor_config(config)
    rollout_log_prob = _ROLLOUT_LOG_PROBS.get()
    if rollout_log_prob is not None and rollout_log_prob.shape != log_prob.shape:
        raise ValueError(
            f"grpo_plus: rollout log-probs of shape {tuple(rollout_log_prob.shape)} do not align with the actor's "
            f"log-probs {tuple(log_prob.shape)}"
        )
    if settings.is_correction and rollout_log_prob is None and not _warned_no_rollout_log_probs:
        _warned_no_rollout_log_probs = True
        logger.warning(
            "verl-pipe: grpo_plus has no rollout log-probs in this batch, so the token-level IS correction is off "
            "(plain GRPO+). Set actor_rollout_ref.rollout.calculate_log_probs=true to turn it on, or "
            "actor_rollout_ref.actor.policy_loss.is_correction=false to silence this."
        )
    return grpo_plus_policy_loss(
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        advantages=advantages,
        response_mask=response_mask,
        settings=settings,
        loss_agg_mode=loss_agg_mode,
        global_batch_info=getattr(config, "global_batch_info", None),
        rollout_log_prob=rollout_log_prob,
        rollout_is_weights=rollout_is_weights,
    )
