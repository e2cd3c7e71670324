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
  to measure how much reward time was hidden behind generation (:mod:`verl_pipe.reward_manager.metrics`).

* guards each sample: our ``compute_score`` runs in scoring processes of its own
  (:mod:`verl_pipe.reward_manager.scoring_processes`), so a scoring process that dies costs only its sample; a score
  that raises or dies is tried once more, then the sample gets outcome ``internal_error`` and score 0 (logged
  once per kind); a score that outlives ``sample_deadline_s`` gets the same. One sample never fails the step.

Select it with ``reward.reward_manager.name=interleaved``. Options: ``+reward.interleaved.concurrency=N``,
``+reward.interleaved.sample_deadline_s=S`` (default 900), ``+reward.interleaved.isolation=process|thread``
(default ``process``; a custom ``compute_score`` always runs on threads, as verl runs it); keyword arguments
for our ``compute_score`` go in
``+reward.reward_kwargs.*`` (e.g. ``format_penalty``). A custom ``reward.custom_reward_function`` is used as
given; without one, this manager scores with ``verl_pipe.reward_score.compute_score`` rather than verl's.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.utils.reward_score import default_compute_score

from verl_pipe.reward_score import INTERNAL_ERROR_RESULT
from verl_pipe.reward_score.pool import default_concurrency
from verl_pipe.reward_manager.scoring_processes import ScoringProcesses

MANAGER_NAME = "interleaved"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InterleavedConfig:
    concurrency: int  # scores running at once in this reward worker
    # A score still running after this long is given up (internal_error); the sandbox's own deadline is
    # (timeout + 1) * tests + 5 s, so this only fires when the reward itself is stuck.
    sample_deadline_s: float = 900.0
    isolation: str = "process"  # "process": our scores run in scoring processes of their own; "thread": in-worker

    @classmethod
    def from_reward_config(cls, reward_cfg: Any) -> InterleavedConfig:
        section = dict(reward_cfg.get("interleaved") or {})
        known = ("concurrency", "sample_deadline_s", "isolation")
        unknown = sorted(set(section) - set(known))
        if unknown:
            raise ValueError(f"unknown key reward.interleaved.{unknown[0]} (known: {', '.join(known)})")
        workers = max(1, int(reward_cfg.get("num_workers") or 1))
        concurrency = int(section.get("concurrency") or max(1, math.ceil(default_concurrency() / workers)))
        if concurrency < 1:
            raise ValueError(f"reward.interleaved.concurrency must be >= 1, got {concurrency}")
        deadline = float(section.get("sample_deadline_s") or cls.sample_deadline_s)
        if deadline <= 0:
            raise ValueError(f"reward.interleaved.sample_deadline_s must be positive, got {deadline}")
        isolation = str(section.get("isolation") or cls.isolation)
        if isolation not in ("process", "thread"):
            raise ValueError(f"reward.interleaved.isolation must be 'process' or 'thread', got {isolation!r}")
        return cls(concurrency=concurrency, sample_deadline_s=deadline, isolation=isolation)


def scored_function(compute_score: Any) -> Any:
    """The function a score callable runs: through a plain ``partial`` (reward_kwargs), and through the ``partial``
    of verl's ``_call_with_kwargs`` in which verl hands over a ``reward.custom_reward_function`` (as the recipes and
    the quickstart name ours)."""
    if not isinstance(compute_score, functools.partial):
        return compute_score
    wrapper = compute_score.func
    if wrapper.__module__ == "verl.trainer.ppo.reward" and wrapper.__name__.startswith("_call_with_kwargs"):
        return compute_score.args[0] if compute_score.args else compute_score.func
    return compute_score.func


def _is_verls_default(compute_score: Any) -> bool:
    target = compute_score.func if isinstance(compute_score, functools.partial) else compute_score
    return target is None or target is default_compute_score


@register(MANAGER_NAME)
class InterleavedRewardManager(RewardManagerBase):
    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        reward_cfg = config.reward
        self.settings = InterleavedConfig.from_reward_config(reward_cfg)
        from verl_pipe.reward_score import compute_score as ours

        if _is_verls_default(compute_score):
            compute_score = functools.partial(ours, **dict(reward_cfg.get("reward_kwargs") or {}))
        self.compute_score = compute_score
        self.is_async = inspect.iscoroutinefunction(compute_score)
        self.executor = ThreadPoolExecutor(max_workers=self.settings.concurrency, thread_name_prefix="vp-reward")
        # Our own score (by name, so it pickles) runs in scoring processes; anything else as verl runs it.
        self.processes = (
            ScoringProcesses(compute_score, self.settings.concurrency)
            if self.settings.isolation == "process" and scored_function(compute_score) is ours
            else None
        )
        self.running = asyncio.Semaphore(self.settings.concurrency)
        self._reported: set[str] = set()

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
            result = await self._guarded_score(kwargs)
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

    async def _score_once(self, kwargs: dict) -> Any:
        if self.processes is not None:
            return await self.processes.score(kwargs)
        if self.is_async:
            return await self.compute_score(**kwargs)
        return await self.loop.run_in_executor(self.executor, lambda: self.compute_score(**kwargs))

    async def _guarded_score(self, kwargs: dict) -> Any:
        """The score, or after a failure and one retry (or past the deadline) an ``internal_error`` result."""
        failure: BaseException | None = None
        for _attempt in range(2):
            try:
                return await asyncio.wait_for(self._score_once(kwargs), self.settings.sample_deadline_s)
            except asyncio.TimeoutError as error:
                failure = error
                break  # a stuck score would be stuck again
            except Exception as error:  # noqa: BLE001 - one sample must never fail the reward step
                failure = error
        kind = f"{type(failure).__name__} from {getattr(self.compute_score, '__name__', 'compute_score')}"
        if kind not in self._reported:
            self._reported.add(kind)
            logger.error("interleaved reward: scoring one sample failed (%s); it gets outcome %s and score 0. "
                         "Further failures of this kind are not logged.", kind, INTERNAL_ERROR_RESULT["outcome"],
                         exc_info=failure)  # fmt: skip
        return dict(INTERNAL_ERROR_RESULT)
