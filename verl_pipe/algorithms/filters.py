"""Sample filters for off-policy (pipelined) training, as large asynchronous RL runs use them. Plain functions
over per-sample columns.

Each returns a :class:`FilterResult`: the row indices to keep, in batch order (a row may appear more than once
when a group is padded), and metrics saying what was dropped. The pipelined trainers apply them to each batch
before any log-prob is computed (:mod:`verl_pipe.trainers.sample_filters`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np


@dataclass
class FilterResult:
    keep: np.ndarray  # int64 row indices into the input batch
    metrics: dict[str, float] = field(default_factory=dict)


def filter_stale_samples(
    policy_versions: Sequence[Sequence[int]], current_version: int, max_staleness: int
) -> FilterResult:
    """Drop a sample when its oldest generating policy is more than ``max_staleness`` versions old.

    ``policy_versions[i]`` are the versions w0 < ... < wk of the weights that generated sample i (a response
    can span a weight update); it is dropped when ``current_version - w0 > max_staleness``.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness={max_staleness} must be >= 0")
    oldest = np.array([min(versions) if len(versions) else current_version for versions in policy_versions])
    if oldest.size and (oldest > current_version).any():
        raise ValueError(
            f"a sample claims policy version {int(oldest.max())}, newer than the current version {current_version}"
        )
    staleness = current_version - oldest if oldest.size else np.zeros(0, dtype=np.int64)
    keep = np.flatnonzero(staleness <= max_staleness).astype(np.int64)
    return FilterResult(
        keep=keep,
        metrics={
            "filter/stale_dropped": float(len(oldest) - len(keep)),
            "filter/staleness_max": float(staleness.max()) if staleness.size else 0.0,
            "filter/staleness_mean": float(staleness.mean()) if staleness.size else 0.0,
        },
    )


def filter_environment_failures(
    group_ids: Sequence[Any], env_failed: Sequence[bool], pad_groups: bool = True
) -> FilterResult:
    """Exclude samples whose reward failed for environment reasons (sandbox crash, reward worker death).

    A group with half or fewer valid samples is dropped whole. A group with more than half valid keeps its
    valid samples; with ``pad_groups`` they are also repeated, in order, into the failed slots so the group keeps
    its size (for trainers that need fixed-size groups; verl's V1 trainer groups by uid and takes ragged groups,
    and its TransferQueue batches cannot hold one sample twice). A wrong answer is not an environment failure
    and is never excluded here.
    """
    if len(group_ids) != len(env_failed):
        raise ValueError(f"{len(group_ids)} group ids but {len(env_failed)} failure flags")
    groups: dict[Any, list[int]] = defaultdict(list)
    for row, group_id in enumerate(group_ids):
        groups[group_id].append(row)

    keep: list[int] = []
    partial = padded = dropped = repeated = 0
    for rows in groups.values():
        valid = [row for row in rows if not env_failed[row]]
        if len(valid) == len(rows):
            keep.extend(rows)
        elif 2 * len(valid) > len(rows):
            fill = [valid[i % len(valid)] for i in range(len(rows) - len(valid))] if pad_groups else []
            keep.extend(valid + fill)
            partial += 1
            padded += 1 if fill else 0
            repeated += len(fill)
        else:
            dropped += 1
    failed = int(np.count_nonzero(np.asarray(env_failed, dtype=bool)))
    return FilterResult(
        keep=np.asarray(sorted(keep), dtype=np.int64),
        metrics={
            "filter/env_failed_samples": float(failed),
            "filter/env_groups_partial": float(partial),
            "filter/env_groups_padded": float(padded),
            "filter/env_groups_dropped": float(dropped),
            "filter/env_samples_repeated": float(repeated),
        },
    )


def filter_uniform_reward_groups(
    group_ids: Sequence[Any], scores: Sequence[float], tolerance: float = 1e-8
) -> FilterResult:
    """Drop every group whose samples all got the same reward (within ``tolerance``).

    Group-relative advantages of such a group are all zero: it carries no learning signal, so a deferred-
    log-prob schedule skips it before any log-prob is computed. Note that under a token-mean loss
    the skipped groups' tokens also leave the loss denominator, so the surviving tokens weigh more than in a run
    that keeps them (the direction of the gradient is unchanged).
    """
    if len(group_ids) != len(scores):
        raise ValueError(f"{len(group_ids)} group ids but {len(scores)} scores")
    values = np.asarray(scores, dtype=np.float64)
    groups: dict[Any, list[int]] = defaultdict(list)
    for row, group_id in enumerate(group_ids):
        groups[group_id].append(row)
    keep: list[int] = []
    skipped_groups = skipped_samples = 0
    for rows in groups.values():
        group = values[rows]
        if group.max() - group.min() <= tolerance:
            skipped_groups += 1
            skipped_samples += len(rows)
        else:
            keep.extend(rows)
    return FilterResult(
        keep=np.asarray(sorted(keep), dtype=np.int64),
        metrics={
            "filter/uniform_groups_skipped": float(skipped_groups),
            "filter/uniform_samples_skipped": float(skipped_samples),
        },
    )
