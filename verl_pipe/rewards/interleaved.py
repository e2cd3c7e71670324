"""The ``interleaved`` reward manager: score each trajectory the moment it finishes, off the rollout's path.

verl 0.9.1 already calls a reward-loop worker per finished trajectory (``AgentLoopWorker._compute_score``);
what it lacks for sandboxed code rewards is a bound on the work: its naive manager hands every sample to the
event loop's default executor, so eight reward workers (``reward.num_workers``) times that executor's 32+
threads start hundreds of sandboxes at once on a node whose cores are busy generating. This manager:

* runs scores on a pool of ``concurrency`` threads per reward worker (each score is already its own
  sandboxed process tree, so threads only wait on pipes); by default the node's cores are split across
  ``reward.num_workers``;
* bounds in-flight work: at most ``concurrency`` scores run per worker; a burst of finished trajectories
  waits in the worker's asyncio queue (a decoded response each) instead of spawning more processes, and that
  wait is measured;
* returns ``verl_pipe.reward_score``'s per-sample outcome and ``sandbox_error`` flag with each sample (GRPO+'s
  environment-failure filter reads them), plus its timing: ``reward_queue_s`` (waiting for a slot),
  ``reward_time_s`` (scoring) and the wall-clock ``reward_{enqueue,start,end}_ts`` the step metrics use
  to measure how much reward time was hidden behind generation (:mod:`verl_pipe.rewards.metrics`).

Select it with ``reward.reward_manager.name=interleaved``. Option: ``+reward.interleaved.concurrency=N``; keyword arguments for our ``compute_score`` go in
``+reward.reward_kwargs.*`` (e.g. ``format_penalty``). A custom ``reward.custom_reward_function`` is used as
given; without one, this manager scores with ``verl_pipe.reward_score.compute_score`` rather than verl's.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.utils.reward_score import default_compute_score

from verl_pipe.reward_score.pool import default_concurrency

MANAGER_NAME = "interleaved"


@dataclass(frozen=True)
class InterleavedConfig:
    concurrency: int  # scores running at once in this reward worker

    @classmethod
    def from_reward_config(cls, reward_cfg: Any) -> InterleavedConfig:
        section = dict(reward_cfg.get("interleaved") or {})
        unknown = sorted(set(section) - {"concurrency"})
        if unknown:
            raise ValueError(f"unknown key reward.interleaved.{unknown[0]} (known: concurrency)")
        workers = max(1, int(reward_cfg.get("num_workers") or 1))
        concurrency = int(section.get("concurrency") or max(1, math.ceil(default_concurrency() / workers)))
        if concurrency < 1:
            raise ValueError(f"reward.interleaved.concurrency must be >= 1, got {concurrency}")
        return cls(concurrency=concurrency)


def _is_verls_default(compute_score: Any) -> bool:
    target = compute_score.func if isinstance(compute_score, functools.partial) else compute_score
    return target is None or target is default_compute_score


@register(MANAGER_NAME)
class InterleavedRewardManager(RewardManagerBase):
    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        reward_cfg = config.reward
        self.settings = InterleavedConfig.from_reward_config(reward_cfg)
        if _is_verls_default(compute_score):
            from verl_pipe.reward_score import compute_score as ours

            compute_score = functools.partial(ours, **dict(reward_cfg.get("reward_kwargs") or {}))
        self.compute_score = compute_score
        self.is_async = inspect.iscoroutinefunction(compute_score)
        self.executor = ThreadPoolExecutor(max_workers=self.settings.concurrency, thread_name_prefix="vp-reward")
        self.running = asyncio.Semaphore(self.settings.concurrency)

    async def run_single(self, data: DataProto) -> dict:
        enqueued = time.time()
        item = data[-1:][0]
        response_ids = item.batch["responses"]
        valid = int(item.batch["attention_mask"][-response_ids.shape[-1] :].sum())
        solution = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(response_ids[:valid], skip_special_tokens=True)
        )
        kwargs = {
            "data_source": item.non_tensor_batch["data_source"],
            "solution_str": solution,
            "ground_truth": item.non_tensor_batch["reward_model"]["ground_truth"],
            "extra_info": dict(item.non_tensor_batch.get("extra_info") or {}),
        }
        async with self.running:
            started = time.time()
            if self.is_async:
                result = await self.compute_score(**kwargs)
            else:
                result = await self.loop.run_in_executor(self.executor, lambda: self.compute_score(**kwargs))
            finished = time.time()
        info = dict(result) if isinstance(result, dict) else {"score": float(result)}
        info.update(
            reward_queue_s=started - enqueued,
            reward_enqueue_ts=enqueued,
            reward_time_s=finished - started,
            reward_start_ts=started,
            reward_end_ts=finished,
        )
        return {"reward_score": float(info["score"]), "reward_extra_info": info}
