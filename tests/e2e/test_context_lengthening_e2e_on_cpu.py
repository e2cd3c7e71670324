"""DeepCoder's iterative context lengthening, end to end: ``recipes/deepcoder_14b.sh`` runs stage 1, checkpoints,
and ``STAGE=2 STAGE1_CKPT=.../global_step_2`` continues from that checkpoint at a longer response length.

Both stages are the recipe's own command line (its GRPO+ preset, layout, checkpoint contents and stage logic), with
CPU-scale overrides appended the way a user appends any hydra override: the tiny random Qwen2, the CPU backend (hf
rollout, one trainer and one sampler rank), 4 prompts x 2 samples, response lengths 16 then 32. Stage 1 runs the
recipe's default mode (one_off_pipeline); stage 2 runs in_flight_pipeline (a later stage is a fresh run, so its mode
may differ; this covers two of our modes in two runs). What is checked at the switch:

* stage 2 starts from stage 1's weights: the rollout server's log-probs of a fixed probe sequence
  (``VERL_PIPE_WEIGHT_SYNC_PROBE``), as loaded by stage 2's engine and as sent by stage 2's trainer in its first
  sync, equal those of stage 1's last weights; and stage 2's first step's old log-probs agree with the engine's;
* control: the fresh model's probe log-probs (stage 1's engine before any update, what a stage 2 started from the
  base model would serve) differ from stage 1's last ones by far more than the tolerance;
* the engine serves the new length (stage 2's answers reach 32 tokens, stage 1's stopped at 16) and the overlong
  mask cuts at it (its limit is 32 in stage 2, 16 in stage 1; it counts as cut exactly the answers verl counts
  as clipped at the new length).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from verl_pipe.backends.cpu.overrides import CpuBackendConfig, cpu_backend_overrides
from verl_pipe.data.embedded import write_embedded_dataset
from verl_pipe.local_jobs import job_env, read_steps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LENGTH_REWARD = os.path.join(REPO, "tests", "e2e", "length_reward.py")
STEPS = 2
STAGE_LENGTHS = {1: 16, 2: 32}
STAGE_MODES = {1: "one_off_pipeline", 2: "in_flight_pipeline"}
# Rollout (bf16 server) vs actor (FSDP2) log-prob gap of the same weights; measured ~1e-4 on the tiny model.
LOGPROB_TOL = 2e-3

pytestmark = pytest.mark.timeout(900)


@dataclass
class Stage:
    run_dir: str
    metrics: dict[int, dict]  # verl's per-step records
    probes: list[dict]  # one per weight sync: the probe's log-probs before and after it
    checkpoint: str  # the last step's .../global_step_N folder


def _cpu_scale(length: int, run_dir: str, ray_address: str) -> list[str]:
    """What a user appends to the recipe's command line to rehearse it on a CPU box with a tiny model."""
    env_vars = "+ray_kwargs.ray_init.runtime_env.env_vars"  # the job's workers do not inherit the driver's env
    return [
        *cpu_backend_overrides(CpuBackendConfig(sampler_ranks=1, torch_threads=1, ray_address=ray_address)),
        f"data.max_response_length={length}",
        "data.max_prompt_length=256",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2048",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",  # one trainer rank
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.optim.lr=5e-3",  # every update moves the probe far beyond LOGPROB_TOL
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        # The random model seldom ends an answer, so the recipe's overlong_filter=all would mask nearly every sample
        # and the updates would hardly move the weights: mask only the cut answers that scored 0 (about half).
        f"reward.custom_reward_function.path={LENGTH_REWARD}",
        "reward.custom_reward_function.name=half_zero_score",
        "actor_rollout_ref.actor.policy_loss.overlong_filter=wrong",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.save_freq={STEPS}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        f"{env_vars}.VERL_FILE_LOGGER_PATH={os.path.join(run_dir, 'verl_metrics.jsonl')}",
        f"{env_vars}.VERL_PIPE_WEIGHT_SYNC_PROBE={os.path.join(run_dir, 'probe.jsonl')}",
    ]


def _run_stage(stage: int, root: str, model: str, ray_address: str, tail_of, stage1_ckpt: str = "") -> Stage:
    run_dir = os.path.join(root, f"stage{stage}")
    os.makedirs(run_dir)
    train_file, val_file = write_embedded_dataset(os.path.join(run_dir, "data"))
    env = dict(os.environ, **job_env(run_dir))
    env.update(
        PYTHON=sys.executable, STAGE=str(stage), MODEL_PATH=model, TRAIN_FILES=train_file, VAL_FILES=val_file,
        CKPT_DIR=os.path.join(run_dir, "ckpt"), PROJECT="lengthening", EXPERIMENT=f"stage{stage}",
        NNODES="1", GPUS_PER_NODE="2", TRAINER_GPUS="1", TRAINER_MODE=STAGE_MODES[stage], LOGGER="[console,file]",
    )  # fmt: skip
    env.pop("STAGE1_CKPT", None)
    if stage1_ckpt:
        env["STAGE1_CKPT"] = stage1_ckpt
    log_path = os.path.join(run_dir, "train.log")
    argv = ["bash", os.path.join(REPO, "recipes", "deepcoder_14b.sh"), *_cpu_scale(STAGE_LENGTHS[stage], run_dir,
                                                                                     ray_address)]  # fmt: skip
    with open(log_path, "w") as log:
        rc = subprocess.run(argv, env=env, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT, timeout=600).returncode
    assert rc == 0, tail_of(log_path)
    metrics = {s["step"]: s["data"] for s in read_steps(run_dir) if "timing_s/step" in s["data"]}
    assert sorted(metrics) == list(range(1, STEPS + 1)), tail_of(log_path)
    with open(os.path.join(run_dir, "probe.jsonl")) as fh:
        probes = [json.loads(line) for line in fh]
    checkpoint = os.path.join(run_dir, "ckpt", "lengthening", f"stage{stage}", f"global_step_{STEPS}")
    return Stage(run_dir, metrics, probes, checkpoint)


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def stages(tmp_path_factory, tiny_model_path, ray_cluster, tail_of) -> dict[int, Stage]:
    root = str(tmp_path_factory.mktemp("lengthening"))
    first = _run_stage(1, root, tiny_model_path, ray_cluster, tail_of)
    assert os.path.isfile(os.path.join(first.checkpoint, "actor", "huggingface", "config.json")), (
        "the recipe's checkpoint contents must hold hf_model: stage 2 starts from it"
    )
    second = _run_stage(2, root, tiny_model_path, ray_cluster, tail_of, stage1_ckpt=first.checkpoint)
    return {1: first, 2: second}


def test_stage_two_starts_from_stage_ones_last_weights(stages):
    first, second = stages[1].probes, stages[2].probes
    fresh, stage1_last = first[0]["before"], first[-1]["after"]
    switch = second[0]  # stage 2's first sync: its engine as loaded, then its trainer's weights
    assert _gap(switch["before"], stage1_last) < LOGPROB_TOL, "stage 2's engine did not load stage 1's weights"
    assert _gap(switch["after"], stage1_last) < LOGPROB_TOL, "stage 2's trainer did not load stage 1's weights"
    # control: a stage 2 from the base model would serve the fresh model's log-probs, far from stage 1's last
    assert _gap(fresh, stage1_last) > 10 * LOGPROB_TOL, "stage 1's updates did not move the probe: no control"
    # the trainer's old log-probs of stage 2's first samples are the engine's: one policy at the switch
    assert stages[2].metrics[1]["training/rollout_probs_diff_max"] < LOGPROB_TOL


def test_stage_two_serves_and_masks_at_its_longer_length(stages):
    for stage, length in STAGE_LENGTHS.items():
        metrics = stages[stage].metrics
        # the random model rarely ends an answer: most run to the stage's limit, none past it
        served = max(data["response_length/max"] for data in metrics.values())
        assert served == length, f"stage {stage}: the engine served answers of up to {served} tokens, not {length}"
        for step, data in metrics.items():
            where = f"stage {stage} step {step}"
            assert data["actor/grpo_plus/overlong_length_limit"] == length, where
            # the mask counts as cut exactly the answers verl counts as clipped at this stage's length
            assert data["actor/grpo_plus/truncated_frac"] == data["response_length/clip_ratio"] > 0, where
