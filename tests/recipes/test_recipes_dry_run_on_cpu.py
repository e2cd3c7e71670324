"""The GPU recipes, run for real as bash scripts with ``DRY_RUN``: every stage composes against verl 0.9.1's own
config schema and dataclasses, and resolves to the paper's hyperparameters and a GPU layout that fills the cluster.

Each dry run imports verl (torch: several seconds on 2 cores), so the runs start together in a small pool the
first time a test needs one; failures that bash or hydra catch return before verl is imported.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Variables the recipes read: a developer's own settings must not leak into the expectations below.
RECIPE_ENV = ("STAGE", "STAGE1_CKPT", "STAGE2_CKPT", "MODEL_PATH", "DATA_DIR", "TRAIN_FILES", "VAL_FILES", "CKPT_DIR",
              "NNODES", "GPUS_PER_NODE", "TRAINER_MODE", "TRAINER_GPUS", "ALGO", "PROJECT", "EXPERIMENT", "LOGGER",
              "DRY_RUN", "MODEL", "STEPS", "RANKS")  # fmt: skip
R1_14B = "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B"
R1_1_5B = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"


# The virtualenv `make install` builds; a recipe must find it without PYTHON, activation or PATH.
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
BARE_PATH = "/usr/bin:/bin"


@dataclass(frozen=True)
class Run:
    script: str
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    # As a user straight after `make install`: no PYTHON, no activated virtualenv, nothing of it on PATH.
    bare: bool = False


def _run(run: Run) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in RECIPE_ENV}
    if run.bare:
        for name in ("PYTHON", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
            env.pop(name, None)
        env["PATH"] = BARE_PATH
    else:
        env["PYTHON"] = sys.executable
    env.update(run.env)
    return subprocess.run(["bash", str(REPO / "recipes" / run.script), *run.args],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip


STAGE1_CKPT = "/ckpt/deepcoder/deepcoder-14b-16k-one_off_pipeline/global_step_160"
# One entry per dry run that imports verl; they run two at a time (the machine has 2 cores).
HEAVY = {
    "14b_stage1": Run("deepcoder_14b.sh", {"DRY_RUN": "json"}, ("trainer.total_epochs=3",)),
    "14b_stage2_sync": Run("deepcoder_14b.sh", {"DRY_RUN": "json", "STAGE": "2", "STAGE1_CKPT": STAGE1_CKPT,
                                                "TRAINER_MODE": "sync"}),
    "1.5b_text": Run("deepcoder_1.5b.sh", {"DRY_RUN": "1"}, bare=True),
    "quickstart_one_off": Run("quickstart_cpu.sh", {"DRY_RUN": "json", "MODEL": "tiny", "MODE": "one_off_pipeline"},
                              bare=True),
    "quickstart_preset": Run("quickstart_cpu.sh", {"DRY_RUN": "json", "MODEL": "tiny"},
                             ("+verl_pipe_trainer=in_flight_pipeline",)),
    "14b_in_flight": Run("deepcoder_14b.sh", {"DRY_RUN": "json", "TRAINER_MODE": "in_flight_pipeline"}),
    "scaler_stage1": Run("deepscaler_1.5b.sh", {"DRY_RUN": "json"}),
    "scaler_stage2_sync": Run("deepscaler_1.5b.sh", {"DRY_RUN": "json", "STAGE": "2", "STAGE1_CKPT": "/c/s1",
                                                     "TRAINER_MODE": "sync"}),
    "scaler_stage3_minibatch": Run("deepscaler_1.5b.sh", {"DRY_RUN": "json", "STAGE": "3", "STAGE2_CKPT": "/c/s2",
                                                          "TRAINER_MODE": "minibatch_pipeline"}),
    "scaler_grpo": Run("deepscaler_1.5b.sh", {"DRY_RUN": "json", "ALGO": "grpo", "TRAINER_MODE": "sync"}),
}  # fmt: skip


@pytest.fixture(scope="module")
def dry_runs():
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures: dict[str, Future] = {name: pool.submit(_run, run) for name, run in HEAVY.items()}
        yield futures


def _json(dry_runs, name: str) -> dict:
    result = dry_runs[name].result()
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _assert_grpo_plus(s: dict) -> None:
    """DeepCoder's GRPO+: clip-high 0.2/0.28, no entropy bonus, no KL anywhere, overlong masking, lr 1e-6."""
    assert (s["adv_estimator"], s["loss_mode"], s["loss_agg_mode"]) == ("grpo_plus", "grpo_plus", "token-mean")
    assert (s["clip_ratio_low"], s["clip_ratio_high"]) == (0.2, 0.28)
    assert s["entropy_coeff"] == 0
    assert not s["use_kl_loss"] and s["kl_loss_coef"] == 0 and not s["use_kl_in_reward"]
    assert s["overlong_filter"] == "all"
    assert s["lr"] == 1e-6 and s["temperature"] == 0.6 and s["rollout_name"] == "vllm"


def _assert_layout(s: dict, mode: str, nodes: int, gpus_per_node: int, trainer_gpus: int | None = None) -> None:
    """The pools add up to exactly the cluster the script was given."""
    layout = s["layout"]
    assert s["trainer_mode"] == mode == layout["trainer_mode"]
    assert s["cluster_gpus"] == layout["total_gpus"] == nodes * gpus_per_node
    if mode == "sync":  # hybrid engine: every GPU trains and samples in turn
        assert layout["hybrid_engine"] and layout["sampler_gpus"] == 0
        assert (layout["trainer_nodes"], layout["trainer_gpus_per_node"]) == (nodes, gpus_per_node)
    else:
        assert not layout["hybrid_engine"] and s["weight_sync"] == "nccl"
        assert layout["trainer_gpus"] == trainer_gpus and layout["sampler_gpus"] == nodes * gpus_per_node - trainer_gpus
    assert layout["rollout_replicas"] * layout["rollout_tp"] == (layout["sampler_gpus"] or layout["trainer_gpus"])
    assert "hf_model" in s["save_contents"]  # the next stage starts from the HF weights of this one


def test_deepcoder_14b_stage1_one_off_by_default(dry_runs):
    s = _json(dry_runs, "14b_stage1")
    _assert_grpo_plus(s)
    assert (s["recipe"], s["stage"], s["stages"]) == ("deepcoder_14b", 1, [16384, 32768])
    assert s["model"] == R1_14B
    assert (s["max_prompt_length"], s["max_response_length"], s["n"], s["val_n"]) == (2048, 16384, 8, 2)
    assert (s["train_batch_size"], s["ppo_mini_batch_size"], s["ppo_max_token_len_per_gpu"]) == (32, 16, 20000)
    assert (s["layout"]["ulysses_sp"], s["layout"]["rollout_tp"]) == (2, 2)
    _assert_layout(s, "one_off_pipeline", nodes=4, gpus_per_node=8, trainer_gpus=16)
    assert s["layout"]["trainer_nodes"] == s["layout"]["sampler_nodes"] == 2  # whole nodes per pool
    assert s["parameter_sync_step"] == 1
    assert s["reward_path"] == "pkg://verl_pipe.reward_score" and s["reward_manager"] == "interleaved"
    assert s["total_epochs"] == 3  # an override given to the script wins over the recipe's 100


def test_deepcoder_14b_stage2_starts_from_stage1_and_sync_is_the_papers_setting(dry_runs):
    s = _json(dry_runs, "14b_stage2_sync")
    _assert_grpo_plus(s)
    assert s["stage"] == 2 and s["model"] == f"{STAGE1_CKPT}/actor/huggingface"
    assert (s["max_response_length"], s["n"]) == (32768, 8)
    assert (s["train_batch_size"], s["ppo_mini_batch_size"], s["ppo_max_token_len_per_gpu"]) == (128, 64, 24000)
    _assert_layout(s, "sync", nodes=4, gpus_per_node=8)
    assert s["parameter_sync_step"] is None


def _require_venv() -> None:
    if not VENV_PYTHON.exists():
        pytest.skip(f"no {VENV_PYTHON}: `make install` builds the virtualenv these runs must find by themselves")


def test_deepcoder_1_5b_prints_a_readable_summary(dry_runs):
    """Also: straight after `make install`, with no PYTHON and no venv on PATH (its python3 lacks hydra)."""
    _require_venv()
    result = dry_runs["1.5b_text"].result()
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for expected in (R1_1_5B, "response 32768", "n=8, temperature 0.6", "lr 1e-06",
                     "clip 0.2/0.28", "entropy coeff 0,", "KL loss off", "KL in reward off", "overlong filter all",
                     "trainer mode        one_off_pipeline", "trainer 1x4=4", "sampler 1x4=4",
                     "= 8 GPUs of 8 in the cluster",
                     "train_batch_size 64 prompts", "ok: verl's validate_config passed"):  # fmt: skip
        assert expected in out, out


def test_quickstart_recipe_mode_sets_separate_pools_without_venv_on_path(dry_runs):
    """MODE=one_off_pipeline reaches the quickstart as its mode: separate pools and the gloo engine, found valid by
    the pipelined trainer's own checks, with the project's .venv found by the script itself."""
    _require_venv()
    s = _json(dry_runs, "quickstart_one_off")
    assert (s["recipe"], s["trainer_mode"], s["device"], s["weight_sync"]) == (
        "quickstart_cpu", "one_off_pipeline", "cpu", "gloo")  # fmt: skip
    assert not s["layout"]["hybrid_engine"] and (s["layout"]["trainer_gpus"], s["layout"]["sampler_gpus"]) == (1, 1)


def test_quickstart_recipe_refuses_a_mode_preset_naming_the_flag(dry_runs):
    """A +verl_pipe_trainer preset among the quickstart's arguments once ran sync silently (the recipe passed MODE's
    default after it); the mode is MODE (--mode), and the preset is refused, naming it."""
    refused = dry_runs["quickstart_preset"].result()
    assert refused.returncode == 2, refused.stdout[-2000:]
    assert "+verl_pipe_trainer=in_flight_pipeline sets what --mode sets" in refused.stderr, refused.stderr[-2000:]
    assert "give --mode in_flight_pipeline instead" in refused.stderr


def test_gpu_recipes_run_in_flight_pipeline_on_separate_pools(dry_runs):
    s = _json(dry_runs, "14b_in_flight")
    _assert_layout(s, "in_flight_pipeline", 4, 8, trainer_gpus=16)
    assert s["parameter_sync_step"] == s["train_batch_size"] // s["ppo_mini_batch_size"]
    # what the run builds on the GPUs: verl's vLLM server with verl-pipe's extension, switched to in-flight loads
    # (before, the dry run never built a replica, and the real run raised TypeError once every worker was up)
    classes = s["rollout_classes"]
    assert classes["platform"] == "cuda" and classes["in_flight_loads"]
    assert classes["replica"] == "verl_pipe.rollout.vllm_server:PipevLLMReplica"
    assert classes["server"] == "verl_pipe.rollout.vllm_server:PipevLLMHttpServer"
    assert classes["checkpoint_engine_cls"].endswith(":NCCLCheckpointEngine")
    assert classes["checkpoint_manager"].endswith(":InFlightCheckpointManager")


def test_every_gpu_recipe_dry_run_names_the_classes_it_builds(dry_runs):
    """verl's own modes keep verl's own vLLM classes; ours get the extension (in-flight loads only in_flight's)."""
    verl_vllm = "verl.workers.rollout.vllm_rollout.vllm_async_server:"
    expected = {"14b_stage2_sync": (verl_vllm + "vLLMReplica", "naive", False),
                "14b_stage1": ("verl_pipe.rollout.vllm_server:PipevLLMReplica", "nccl", False),
                "scaler_stage3_minibatch": ("verl_pipe.rollout.vllm_server:PipevLLMReplica", "nccl", False),
                "14b_in_flight": ("verl_pipe.rollout.vllm_server:PipevLLMReplica", "nccl", True)}  # fmt: skip
    for name, (replica, engine, in_flight) in expected.items():
        classes = _json(dry_runs, name)["rollout_classes"]
        assert (classes["replica"], classes["checkpoint_engine"], classes["in_flight_loads"]) == (
            replica, engine, in_flight), (name, classes)  # fmt: skip
    text = dry_runs["1.5b_text"].result().stdout
    assert "replica (cuda)      verl_pipe.rollout.vllm_server:PipevLLMReplica" in text, text
    assert "checkpoint engine   nccl: verl.checkpoint_engine.nccl_checkpoint_engine:NCCLCheckpointEngine" in text


@pytest.mark.parametrize(("rollout", "says"), [
    ("sglang", "the 'sglang' rollout cannot do yet: set actor_rollout_ref.rollout.name=vllm"),
    ("hf", "has no cuda path: set actor_rollout_ref.rollout.name=vllm"),
])  # fmt: skip
def test_a_rollout_that_would_fail_after_start_up_is_refused_before_it(rollout, says):
    refused = _run(Run("deepcoder_14b.sh", {"DRY_RUN": "1", "TRAINER_MODE": "in_flight_pipeline"},
                       (f"actor_rollout_ref.rollout.name={rollout}",)))  # fmt: skip
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "failed at actor_rollout_ref.rollout.name:" in refused.stderr and says in refused.stderr, refused.stderr


def test_recipe_python_prefers_python_env_then_activated_venv_then_project_venv(tmp_path):
    def pick(**env: str) -> str:
        probe = "source recipes/common.sh; recipe_python"
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV")}
        return subprocess.run(["bash", "-c", probe], cwd=REPO, env={**clean, **env}, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    assert pick(PYTHON="/opt/py/bin/python") == "/opt/py/bin/python"  # PYTHON=... stays the override
    assert pick(VIRTUAL_ENV=str(tmp_path)) == "python3"  # an activated virtualenv's python3 is on PATH
    assert pick() == (str(VENV_PYTHON) if VENV_PYTHON.exists() else "python3")


def test_a_python_without_verl_stops_naming_the_fix():
    result = _run(Run("deepcoder_14b.sh", {"DRY_RUN": "1", "PYTHON": "/usr/bin/python3"}))
    if result.returncode == 0:
        pytest.skip("this machine's /usr/bin/python3 has verl, hydra and verl-pipe")
    assert result.returncode == 2 and "/usr/bin/python3 cannot import" in result.stderr, result.stderr
    assert "make install" in result.stderr and "PYTHON=" in result.stderr


def test_deepscaler_stage1_8k_on_one_node(dry_runs):
    s = _json(dry_runs, "scaler_stage1")
    _assert_grpo_plus(s)
    assert (s["stages"], s["stage"], s["model"]) == ([8192, 16384, 24576], 1, R1_1_5B)
    assert (s["max_prompt_length"], s["max_response_length"], s["n"], s["val_n"]) == (1024, 8192, 8, 8)
    assert (s["train_batch_size"], s["ppo_mini_batch_size"], s["ppo_max_token_len_per_gpu"]) == (128, 64, 32768)
    _assert_layout(s, "one_off_pipeline", nodes=1, gpus_per_node=8, trainer_gpus=4)
    assert s["reward_path"] == "pkg://verl_pipe.reward_score"  # DeepScaleR's math grading for data_source=deepscaler


def test_deepscaler_stage2_16k_sync_on_four_nodes(dry_runs):
    s = _json(dry_runs, "scaler_stage2_sync")
    _assert_grpo_plus(s)
    assert (s["stage"], s["model"], s["max_response_length"], s["n"]) == (2, "/c/s1", 16384, 16)
    _assert_layout(s, "sync", nodes=4, gpus_per_node=8)


def test_deepscaler_stage3_24k_minibatch_pipeline(dry_runs):
    s = _json(dry_runs, "scaler_stage3_minibatch")
    _assert_grpo_plus(s)
    assert (s["stage"], s["model"], s["max_response_length"], s["n"]) == (3, "/c/s2", 24576, 16)
    _assert_layout(s, "minibatch_pipeline", nodes=4, gpus_per_node=8, trainer_gpus=16)
    assert s["parameter_sync_step"] == 2  # 128 prompts / 64 per minibatch: one optimizer step each


def test_deepscaler_original_loss_is_one_switch_away(dry_runs):
    s = _json(dry_runs, "scaler_grpo")
    assert (s["adv_estimator"], s["loss_mode"]) == ("grpo", "vanilla")
    assert (s["clip_ratio_low"], s["clip_ratio_high"], s["entropy_coeff"]) == (0.2, 0.2, 0.001)
    assert s["use_kl_loss"] and s["kl_loss_coef"] == 0.001 and s["overlong_filter"] is None


# --- failures that stop before verl is imported ------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, env",
    [("deepcoder_14b.sh", {}), ("deepscaler_1.5b.sh", {"STAGE": "2", "STAGE1_CKPT": "/c/s1"}),
     ("quickstart_cpu.sh", {"MODEL": "tiny"})],  # quickstart's DRY_RUN composes the list `verl-pipe quickstart` uses
)  # fmt: skip
def test_a_misspelled_override_fails_naming_the_key(script, env):
    result = _run(Run(script, {"DRY_RUN": "1", **env}, ("actor_rollout_ref.actor.clip_ratio_hihg=0.3",)))
    assert result.returncode == 2 and result.stdout == ""
    assert "failed at actor_rollout_ref.actor.clip_ratio_hihg" in result.stderr, result.stderr


@pytest.mark.parametrize(
    "script, env, message",
    [
        ("deepcoder_14b.sh", {"STAGE": "2"}, "set STAGE1_CKPT"),
        ("deepscaler_1.5b.sh", {"STAGE": "3"}, "set STAGE2_CKPT"),
        ("deepcoder_14b.sh", {"STAGE": "3"}, "STAGE=3: use 1 (16K) or 2 (32K)"),
        ("deepcoder_14b.sh", {"TRAINER_GPUS": "5"}, "TRAINER_GPUS=5 must be whole nodes"),
        ("deepcoder_14b.sh", {"TRAINER_GPUS": "32"}, "TRAINER_GPUS=32 leaves no sampler GPU"),
        ("deepcoder_1.5b.sh", {"TRAINER_MODE": "async"}, "TRAINER_MODE=async: use one_off_pipeline"),
        ("deepscaler_1.5b.sh", {"NNODES": "two"}, "NNODES=two must be a positive whole number"),
    ],
)
def test_bad_environment_fails_naming_the_variable(script, env, message):
    result = _run(Run(script, {"DRY_RUN": "1", **env}))
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_stage_checkpoint_must_exist_for_a_real_run(tmp_path):
    """Without DRY_RUN a missing checkpoint stops the script before verl starts; a step folder resolves to its
    actor/huggingface weights."""
    result = _run(Run("deepcoder_14b.sh", {"STAGE": "2", "STAGE1_CKPT": str(tmp_path / "nope")}))
    assert result.returncode == 2 and "is neither a verl checkpoint step" in result.stderr, result.stderr
    hf = tmp_path / "global_step_7" / "actor" / "huggingface"
    hf.mkdir(parents=True)
    probe = f'source recipes/common.sh; RECIPE=t STAGE=2; recipe_stage_model STAGE1_CKPT "{tmp_path}/global_step_7/"'
    out = subprocess.run(["bash", "-c", probe], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(hf)


def test_pool_split_follows_whole_nodes_or_an_equal_share_of_every_node():
    def layout(nodes: int, gpn: int, trainer: int) -> list[str]:
        probe = (f"source recipes/common.sh; RECIPE=t TRAINER_MODE=one_off_pipeline NNODES={nodes} GPUS_PER_NODE={gpn} "
                 f"TRAINER_GPUS={trainer}; recipe_layout; printf '%s\\n' \"${{LAYOUT_ARGS[@]}}\"")  # fmt: skip
        out = subprocess.run(["bash", "-c", probe], cwd=REPO, capture_output=True, text=True, check=True).stdout
        return [re.sub(r"^.*\.", "", line) for line in out.split()[1:]]

    assert layout(4, 8, 8) == ["nnodes=1", "n_gpus_per_node=8", "nnodes=3", "n_gpus_per_node=8"]
    assert layout(4, 8, 12) == ["nnodes=4", "n_gpus_per_node=3", "nnodes=4", "n_gpus_per_node=5"]
    assert layout(1, 8, 2) == ["nnodes=1", "n_gpus_per_node=2", "nnodes=1", "n_gpus_per_node=6"]


def test_a_value_of_the_wrong_type_names_its_key():
    """``rollout.n=x`` passes hydra and verl's own checks (dynamic batching skips the batch arithmetic); the summary
    read must still stop at it rather than print a traceback."""
    from omegaconf import OmegaConf

    from verl_pipe.recipe_check import RecipeConfigError, _get

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": "x", "temperature": "0.6"}}})
    with pytest.raises(RecipeConfigError) as info:
        _get(config, "actor_rollout_ref.rollout.n", int)
    assert info.value.key == "actor_rollout_ref.rollout.n" and "'x' is not a valid int" in str(info.value)
    assert _get(config, "actor_rollout_ref.rollout.temperature", float) == 0.6
