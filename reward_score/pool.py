"""Score many samples at once on a pool sized to the machine.

Each sandbox is one process tree that spends its time in the kernel and in the sandboxed interpreter, so a
thread per concurrent sandbox is enough on the host side (the GIL is released while we wait on pipes).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import compute_score


def default_concurrency() -> int:
    """Concurrent sandboxes: one per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def score_many(
    samples: Iterable[Mapping[str, Any]], *, max_workers: int | None = None, **reward_kwargs: Any
) -> list[dict[str, Any]]:
    """``compute_score`` for each ``{data_source, solution_str, ground_truth, extra_info?}``, in input order."""
    samples = list(samples)
    with ThreadPoolExecutor(max_workers=max_workers or default_concurrency(), thread_name_prefix="vp-reward") as pool:
        futures = [
            pool.submit(
                compute_score,
                sample["data_source"],
                sample["solution_str"],
                sample["ground_truth"],
                sample.get("extra_info"),
                **reward_kwargs,
            )
            for sample in samples
        ]
        return [future.result() for future in futures]
