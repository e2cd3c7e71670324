"""GRPO+'s advantage estimator, registered in verl as ``algorithm.adv_estimator=grpo_plus``.

Per group of samples sharing a ``uid``: A_i = r_i - mean(r), divided by (std(r) + epsilon) when
``algorithm.norm_adv_by_std_in_grpo`` is true (DeepCoder) and left undivided when false (Dr.GRPO).
The std is the unbiased one, as in verl's ``grpo``. The sequence advantage is broadcast over the response mask.

A degenerate group -- every reward equal, which includes a group of one -- carries no learning signal: its
advantages are exactly zero (not r - mean divided by epsilon noise), and it is counted.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from verl_pipe.algorithms.config import GRPO_PLUS, GRPOPlusAdvantageConfig, norm_adv_by_std

# verl gives an advantage estimator no way to report metrics: the last step's counts wait here until the
# trainer's compute_data_metrics (wrapped in verl_pipe.algorithms.hooks) adds them to the step's metrics.
_PENDING_METRICS: dict[str, float] = {}


def group_advantages(
    scores: torch.Tensor, index: np.ndarray | list, *, norm_by_std: bool, epsilon: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sequence-level GRPO+ advantages for ``scores`` (bs,) grouped by ``index``; returns (advantages, metrics)."""
    if len(index) != scores.shape[0]:
        raise ValueError(f"grpo_plus: {len(index)} group ids for {scores.shape[0]} samples")
    groups: dict[Any, list[int]] = defaultdict(list)
    for row, group_id in enumerate(index):
        groups[group_id].append(row)

    advantages = torch.zeros_like(scores, dtype=torch.float32)
    degenerate = 0
    for rows in groups.values():
        group_scores = scores[rows].to(torch.float32)
        if len(rows) < 2 or bool(group_scores.max() == group_scores.min()):
            degenerate += 1
            continue
        centred = group_scores - group_scores.mean()
        if norm_by_std:
            centred = centred / (group_scores.std() + epsilon)
        advantages[rows] = centred
    metrics = {
        "grpo_plus/groups_total": float(len(groups)),
        "grpo_plus/groups_degenerate": float(degenerate),
        "grpo_plus/groups_degenerate_frac": degenerate / max(len(groups), 1),
    }
    return advantages, metrics


@register_adv_est(GRPO_PLUS)
def compute_grpo_plus_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    index: np.ndarray | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's registered-estimator signature; returns (advantages, returns), both (bs, response_length)."""
    if index is None:
        raise ValueError(
            "algorithm.adv_estimator=grpo_plus needs each sample's group id (the 'uid' column verl adds when "
            "actor_rollout_ref.rollout.n > 1); none was passed."
        )
    settings = GRPOPlusAdvantageConfig.from_algorithm_config(config)
    scores = token_level_rewards.sum(dim=-1)
    sequence_advantages, metrics = group_advantages(
        scores, index, norm_by_std=norm_adv_by_std(config), epsilon=settings.epsilon
    )
    advantages = sequence_advantages.unsqueeze(-1).to(token_level_rewards.dtype) * response_mask
    _PENDING_METRICS.clear()
    _PENDING_METRICS.update(metrics)
    return advantages, advantages


def drain_advantage_metrics() -> dict[str, float]:
    """The metrics of the last grpo_plus call, once (later calls return {} until the estimator runs again)."""
    metrics = dict(_PENDING_METRICS)
    _PENDING_METRICS.clear()
    return metrics
