"""The interleaved reward manager's config, its step metrics, and one real run_single through verl's DataProto."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_pipe.reward_manager.hooks import legacy_batch_reward_metrics
from verl_pipe.reward_manager.metrics import TIMING_KEYS, hidden_fraction, reward_step_metrics

# Scoring processes import their score function by module name; pytest imports this file by path. The helper
# module's folder is put on sys.path at collection, before any test starts the forkserver (which copies it).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scoring_helpers import die_or_echo  # noqa: E402


def test_hidden_fraction_counts_only_scoring_before_generation_ended():
    """Guards against a 'hidden' share that credits reward time spent after the last trajectory finished."""
    # Generation ends at t=10 (last enqueue). Sample A scores 2-4 (hidden), B scores 9-13 (1 of 4 s hidden).
    assert hidden_fraction([2.0, 10.0], [2.0, 9.0], [4.0, 13.0]) == pytest.approx(3.0 / 6.0)
    assert hidden_fraction([5.0, 5.0], [5.0, 5.0], [6.0, 7.0]) == 0.0  # all scored after generation: none hidden


def test_step_metrics_outcomes_sum_to_one_and_ignore_untimed_samples():
    """Guards against metrics that mix in samples scored by another manager (no timing) or miscount outcomes."""
    timed = {"reward_enqueue_ts": 1.0, "reward_start_ts": 1.0, "reward_end_ts": 2.0, "reward_time_s": 1.0,
             "reward_queue_s": 0.0}  # fmt: skip
    infos = [dict(timed, outcome="pass", sandbox_error=False), dict(timed, outcome="timeout", sandbox_error=True),
             {"outcome": "pass"}]  # fmt: skip
    metrics = reward_step_metrics(infos)
    assert metrics["reward/outcome/pass"] == metrics["reward/outcome/timeout"] == 0.5
    assert metrics["reward/sandbox_error_frac"] == 0.5
    assert reward_step_metrics([{"outcome": "pass"}]) == {}


def test_legacy_batch_metrics_read_top_level_non_tensor_fields():
    """Guards against the legacy trainer (reward info as top-level non-tensor fields) logging no reward metrics."""
    from verl import DataProto

    fields = {key: np.array([0.0, 1.0]) for key in TIMING_KEYS}
    fields["outcome"] = np.array(["pass", "wrong_answer"], dtype=object)
    batch = DataProto.from_dict(tensors={"x": torch.zeros(2, 1)}, non_tensors=fields)
    metrics = legacy_batch_reward_metrics(batch)
    assert metrics["reward/outcome/wrong_answer"] == 0.5 and "reward/hidden_frac" in metrics


def _config(**interleaved):
    reward = {"num_workers": 2, "reward_kwargs": {"format_penalty": -0.25}}
    if interleaved:
        reward["interleaved"] = interleaved
    return OmegaConf.create({"reward": reward})


def test_config_splits_cores_across_workers_and_names_bad_keys():
    """Guards against 8 reward workers each starting a sandbox per core (oversubscribing the node)."""
    from verl_pipe.reward_manager.interleaved import InterleavedConfig

    assert InterleavedConfig.from_reward_config(_config(concurrency=3).reward).concurrency == 3
    assert InterleavedConfig.from_reward_config(_config().reward).concurrency >= 1
    with pytest.raises(ValueError, match="reward.interleaved.max_inflight"):
        InterleavedConfig.from_reward_config(_config(max_inflight=3).reward)


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return bytes(int(i) for i in ids).decode()


def test_run_single_scores_a_real_program_with_our_reward_and_kwargs():
    """Guards against the manager falling back to verl's scorer or dropping reward_kwargs and timing fields."""
    from verl import DataProto
    from verl.utils.reward_score import default_compute_score

    from verl_pipe.reward_manager.interleaved import InterleavedRewardManager

    response = "no code here"
    ids = torch.tensor([list(response.encode())])
    tests = json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}])
    data = DataProto.from_dict(
        tensors={"responses": ids, "attention_mask": torch.ones_like(ids)},
        non_tensors={
            "data_source": np.array(["livecodebench"], dtype=object),
            "reward_model": np.array([{"ground_truth": tests}], dtype=object),
            "extra_info": np.array([{}], dtype=object),
        },
    )

    async def score():
        manager = InterleavedRewardManager(_config(), _Tokenizer(), default_compute_score)
        return await manager.run_single(data)

    out = asyncio.run(score())
    info = out["reward_extra_info"]
    assert out["reward_score"] == -0.25 and info["outcome"] == "format_error"  # our scorer, with reward_kwargs
    assert all(key in info for key in TIMING_KEYS)
    assert info["reward_start_ts"] >= info["reward_enqueue_ts"] and info["reward_end_ts"] >= info["reward_start_ts"]


def _one_sample():
    from verl import DataProto

    ids = torch.tensor([list(b"x")])
    return DataProto.from_dict(
        tensors={"responses": ids, "attention_mask": torch.ones_like(ids)},
        non_tensors={
            "data_source": np.array(["livecodebench"], dtype=object),
            "reward_model": np.array([{"ground_truth": "[]"}], dtype=object),
            "extra_info": np.array([{}], dtype=object),
        },
    )


def _run_with(score_fn, **interleaved):
    from verl_pipe.reward_manager.interleaved import InterleavedRewardManager

    async def score():
        manager = InterleavedRewardManager(_config(**interleaved), _Tokenizer(), score_fn)
        return await manager.run_single(_one_sample())

    return asyncio.run(score())


def test_a_raising_score_is_retried_once_then_the_sample_alone_gets_internal_error():
    """Guards against one sample's crashing score failing the whole reward step (the manager must return)."""
    calls = []

    def flaky(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RecursionError("crafted output")
        return {"score": 1.0, "outcome": "pass"}

    out = _run_with(flaky)
    assert out["reward_score"] == 1.0 and len(calls) == 2  # the retry scored it

    def always(**kwargs):
        raise MemoryError("crafted program")

    out = _run_with(always)
    assert out["reward_score"] == 0.0 and out["reward_extra_info"]["outcome"] == "internal_error"
    assert out["reward_extra_info"]["sandbox_error"] is False  # never dropped from training as an env failure


def test_a_stuck_score_is_given_up_at_the_sample_deadline():
    """Guards against a score that never returns holding the reward step forever."""
    import threading

    release = threading.Event()

    def stuck(**kwargs):
        release.wait(30)
        return {"score": 1.0}

    try:
        out = _run_with(stuck, sample_deadline_s=0.5)
    finally:
        release.set()
    assert out["reward_extra_info"]["outcome"] == "internal_error" and out["reward_extra_info"]["reward_time_s"] < 5


def test_a_scoring_process_that_dies_costs_only_its_own_sample():
    """Guards against a scoring process killed mid-sample failing the step or poisoning the other samples."""
    from verl_pipe.reward_manager.scoring_processes import ScoringProcessDied, ScoringProcesses

    async def scenario():
        processes = ScoringProcesses(die_or_echo, slots=2)
        try:
            honest, dead = await asyncio.gather(
                processes.score({"solution_str": "ok"}), processes.score({"solution_str": "die"}),
                return_exceptions=True,
            )  # fmt: skip
            after = await asyncio.gather(*(processes.score({"solution_str": "ok"}) for _ in range(4)))
        finally:
            processes.close()
        return honest, dead, after

    honest, dead, after = asyncio.run(scenario())
    assert honest["score"] == 1.0 and isinstance(dead, ScoringProcessDied)
    assert all(result["score"] == 1.0 for result in after)  # the dead slot was replaced
    assert honest["pid"] != os.getpid()  # scored outside this process


def test_the_manager_gives_a_sample_whose_process_dies_twice_internal_error():
    """Guards against the manager letting a dead scoring process fail run_single (and so the reward step)."""
    from verl_pipe.reward_manager.interleaved import InterleavedRewardManager
    from verl_pipe.reward_manager.scoring_processes import ScoringProcesses

    async def scenario():
        manager = InterleavedRewardManager(_config(concurrency=1), _Tokenizer(), default_score())
        assert manager.processes is not None  # our own score runs in scoring processes by default
        manager.processes.close()
        manager.processes = ScoringProcesses(die_or_echo, slots=1)
        manager.compute_score = die_or_echo
        dead = await manager.run_single(_one_sample_with("die"))
        alive = await manager.run_single(_one_sample_with("ok"))
        manager.processes.close()
        return dead, alive

    dead, alive = asyncio.run(scenario())
    assert dead["reward_extra_info"]["outcome"] == "internal_error" and dead["reward_score"] == 0.0
    assert alive["reward_score"] == 1.0


def default_score():
    from verl.utils.reward_score import default_compute_score

    return default_compute_score


def _one_sample_with(response: str):
    from verl import DataProto

    ids = torch.tensor([list(response.encode())])
    return DataProto.from_dict(
        tensors={"responses": ids, "attention_mask": torch.ones_like(ids)},
        non_tensors={
            "data_source": np.array(["livecodebench"], dtype=object),
            "reward_model": np.array([{"ground_truth": "[]"}], dtype=object),
            "extra_info": np.array([{}], dtype=object),
        },
    )


def _one_program(response: str):
    """A sample of a stdin problem with one real test, as the recipes' data has them."""
    from verl import DataProto

    ids = torch.tensor([list(response.encode())])
    tests = json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}])
    return DataProto.from_dict(
        tensors={"responses": ids, "attention_mask": torch.ones_like(ids)},
        non_tensors={
            "data_source": np.array(["livecodebench"], dtype=object),
            "reward_model": np.array([{"ground_truth": tests}], dtype=object),
            "extra_info": np.array([{}], dtype=object),
        },
    )


def test_our_score_named_as_verls_custom_reward_function_runs_in_scoring_processes():
    """Guards against the recipes' and the quickstart's setting silently scoring in the worker's threads: they name
    our score in ``reward.custom_reward_function``, which verl hands over wrapped in a partial of its own. Seen with
    ``make chaos``, whose kill of a scoring process found none to kill."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from verl_pipe.reward_manager.interleaved import InterleavedRewardManager

    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://verl_pipe.reward_score", "name": "compute_score", "reward_kwargs": {"format_penalty": -0.25}}}})
    as_verl_hands_it_over = get_custom_reward_fn(config)

    async def score(**interleaved):
        manager = InterleavedRewardManager(_config(concurrency=1, **interleaved), _Tokenizer(), as_verl_hands_it_over)
        try:
            return manager.processes is not None, await manager.run_single(_one_program("no code here"))
        finally:
            if manager.processes is not None:
                manager.processes.close()

    in_processes, out = asyncio.run(score())
    assert in_processes
    assert out["reward_score"] == -0.25 and out["reward_extra_info"]["outcome"] == "format_error"  # kwargs kept
    in_processes, out = asyncio.run(score(isolation="thread"))  # the control: asked for threads, gets threads
    assert not in_processes and out["reward_score"] == -0.25
