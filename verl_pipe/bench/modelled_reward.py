"""A reward function for benchmarks: takes the latency model's ``reward_s`` per sample and scores by a hash.

Use it as ``reward.custom_reward_function.path=pkg://verl_pipe.bench.modelled_reward`` with the ``interleaved``
manager, whose ``reward.interleaved.concurrency`` plays the latency model's ``reward_workers``. The score is a
deterministic function of the response text, spread over [0, 1), so groups have nonzero GRPO advantages and
the updates are real.
"""

from __future__ import annotations

import hashlib
import time

from verl_pipe.bench.latency import active_model


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    model = active_model()
    if model is not None:
        time.sleep(model.wall(model.reward_s))
    digest = hashlib.blake2b(solution_str.encode("utf-8", "replace"), digest_size=8).digest()
    return {"score": int.from_bytes(digest, "big") / 2**64}
