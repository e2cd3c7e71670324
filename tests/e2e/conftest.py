"""Runs that more than one test module reads, made once per session (each run is a minute of the suite's budget).

Each is verl's stock entrypoint on the CPU backend with the tiny random Qwen2 and fixed seeds, made once per
(mode, reward, overrides) whether it passes or fails (:mod:`shared_runs`: a failed run is not re-run by each of
its readers):

* ``learning_run``: the vowel task (:mod:`learning_task`), verl's GRPO at a large learning rate, 6 steps of
  4 prompts x 8 samples, validating before the first step and after steps 3 and 6 (verl's validation hooks fall
  before, between and after a schedule's steps, and every mode must take them); read by the learning tests and
  by the in-flight tests (its lag bound, against sync);
* ``grpo_plus_run``: GRPO+ (overlong filter ``wrong``) with the length reward, 3 steps of 4 prompts x 2 samples;
  read by the GRPO+ test (sync) and by the in-flight test that compares lag bound 0 with sync step by step.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import pytest

from verl_pipe.data.embedded import write_embedded_dataset
from verl_pipe.quickstart import QuickstartConfig, training_overrides

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from shared_runs import SharedRuns  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TASK = os.path.join(HERE, "learning_task.py")
LENGTH_REWARD = os.path.join(HERE, "length_reward.py")
LEARNING_STEPS = 6
# The learning runs validate before training (logged at step 0) and every VALIDATE_EVERY steps.
VALIDATE_EVERY = 3
VALIDATED_AT = [0, 3, 6]
GRPO_PLUS_STEPS = 3


@dataclass
class LearningRun:
    scores: list[float]  # the vowel share per step (the true share, for the negated reward too)
    metrics: dict[int, dict]  # verl's metrics per step
    trained: dict[int, list[tuple]]  # per step: (prompt, response, reward) of every trained sample, sorted


@dataclass
class SharedRun:
    steps: list[dict]  # verl's file-logger records
    metrics: dict[int, dict]  # the per-step records (timing included), by step
    trained: dict[int, list[tuple]]
    log: str
    run_dir: str


def _trained(run_dir: str, steps: int) -> dict[int, list[tuple]]:
    """What verl dumped as trained at each step (``trainer.rollout_data_dir``), in a canonical order."""
    out = {}
    for step in range(1, steps + 1):
        with open(os.path.join(run_dir, "rollouts", f"{step}.jsonl")) as fh:
            rows = [json.loads(line) for line in fh]
        out[step] = sorted((r["input"], r["output"], round(float(r["score"]), 6)) for r in rows)
    return out


@pytest.fixture(scope="session")
def learning_run(tmp_path_factory, tiny_model_path, ray_cluster, verl_runner, tail_of):
    runs = SharedRuns("learning")

    def run(mode: str, reward: str = "compute_score", *extra: str, seed: int = 7) -> LearningRun:
        return runs.get((mode, reward, extra, seed), lambda: make(mode, reward, extra, seed))

    def make(mode: str, reward: str, extra: tuple[str, ...], seed: int) -> LearningRun:
        run_dir = str(tmp_path_factory.mktemp(f"learn_{mode}_{reward}_seed{seed}"))
        cfg = QuickstartConfig(
            data="embedded",
            # one torch thread per actor in every mode, so that runs of different layouts (a colocated sync, a
            # separate sampler) compute the same step-1 samples and losses to the bit
            torch_threads=1,
            model=tiny_model_path,
            mode=mode,
            algorithm="grpo",
            steps=LEARNING_STEPS,
            prompts_per_step=4,
            samples_per_prompt=8,
            max_response_length=16,
            lr=5e-2,
            seed=seed,
            validate_at_end=False,
            ray_address=ray_cluster,
            out_dir=run_dir,
        )
        train_file, val_file = write_embedded_dataset(os.path.join(run_dir, "data"), seed=cfg.seed)
        overrides = training_overrides(cfg, tiny_model_path, train_file, val_file, run_dir) + [
            f"reward.custom_reward_function.path={TASK}",
            f"reward.custom_reward_function.name={reward}",
            # every mode validates before its first step and between steps (each verl hook a schedule must handle)
            "trainer.val_before_train=True",
            f"trainer.test_freq={VALIDATE_EVERY}",
            *extra,
        ]
        rc, steps, log = verl_runner(overrides, run_dir, timeout=600)
        assert rc == 0, tail_of(log)
        metrics = {s["step"]: s["data"] for s in steps if "timing_s/step" in s["data"]}
        assert sorted(metrics) == list(range(1, LEARNING_STEPS + 1)), tail_of(log)
        validated = sorted(s["step"] for s in steps if any(key.startswith("val-") for key in s["data"]))
        assert validated == VALIDATED_AT, f"{mode}: validations logged at steps {validated}, not {VALIDATED_AT}"
        sign = -1.0 if reward.startswith("negated") else 1.0
        scores = [sign * metrics[step]["critic/score/mean"] for step in sorted(metrics)]
        return LearningRun(scores, metrics, _trained(run_dir, LEARNING_STEPS))

    return run


@pytest.fixture(scope="session")
def grpo_plus_run(tmp_path_factory, tiny_model_path, ray_cluster, verl_runner, tail_of):
    runs = SharedRuns("GRPO+")

    def run(mode: str = "sync", *extra: str) -> SharedRun:
        return runs.get((mode, extra), lambda: make(mode, extra))

    def make(mode: str, extra: tuple[str, ...]) -> SharedRun:
        run_dir = str(tmp_path_factory.mktemp(f"grpo_plus_{mode}"))
        cfg = QuickstartConfig(
            data="embedded",
            # one torch thread per actor in every mode, so that runs of different layouts (a colocated sync, a
            # separate sampler) compute the same step-1 samples and losses to the bit
            torch_threads=1,
            model=tiny_model_path,
            mode=mode,
            algorithm="grpo_plus",
            steps=GRPO_PLUS_STEPS,
            prompts_per_step=4,
            samples_per_prompt=2,
            max_response_length=24,
            lr=5e-3,  # every update moves the policy far beyond the bf16 noise of the log-prob checks
            ray_address=ray_cluster,
            out_dir=run_dir,
        )
        train_file, val_file = write_embedded_dataset(os.path.join(run_dir, "data"))
        overrides = training_overrides(cfg, tiny_model_path, train_file, val_file, run_dir) + [
            f"reward.custom_reward_function.path={LENGTH_REWARD}",
            "reward.custom_reward_function.name=half_zero_score",
            "actor_rollout_ref.actor.policy_loss.overlong_filter=wrong",
            *extra,
        ]
        assert "algorithm.adv_estimator=grpo" not in overrides
        rc, steps, log = verl_runner(overrides, run_dir)
        assert rc == 0, tail_of(log)
        metrics = {s["step"]: s["data"] for s in steps if "timing_s/step" in s["data"]}
        assert sorted(metrics) == list(range(1, GRPO_PLUS_STEPS + 1)), tail_of(log)
        return SharedRun(steps, metrics, _trained(run_dir, GRPO_PLUS_STEPS), log, run_dir)

    return run
