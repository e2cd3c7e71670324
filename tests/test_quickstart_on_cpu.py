"""The quickstart's pieces that need no training run: its overrides against verl's real config schema (per trainer
mode, also through the recipes' dry run), its flags, and the per-step summaries built from verl's own log formats."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re

import pytest

from verl_pipe.cli import build_parser
from verl_pipe.backends.cpu.overrides import CpuBackendConfig, cpu_backend_overrides
from verl_pipe.compat import SetupError
from verl_pipe.quickstart import TRAINER_MODES, QuickstartConfig, training_overrides
from verl_pipe.run_metrics import VerlMetricsTail, summarize_step

# What each --mode must get on the CPU backend: separate sampler/trainer pools, and the weight-sync engine.
# (verl's naive engine only reaches rollout workers in the trainer's own processes; nccl needs GPUs.)
MODE_LAYOUT = {
    "sync": (False, "naive"),
    "separate_async": (True, "gloo"),
    "one_off_pipeline": (True, "gloo"),
    "minibatch_pipeline": (True, "gloo"),
    "in_flight_pipeline": (True, "gloo"),
}


def _compose(overrides: list[str]):
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.mark.parametrize("trainer,ranks", [("v1", 1), ("legacy", 2)])
def test_overrides_compose_against_verls_schema(trainer, ranks):
    """Guards: a misspelt key, which hydra rejects only after the user has waited for start-up."""
    cfg = QuickstartConfig(trainer=trainer, ranks=ranks, steps=4, overrides=["trainer.save_freq=2"])
    composed = _compose(training_overrides(cfg, "/models/m", "/d/train.parquet", "/d/val.parquet", "/runs/r"))
    assert composed.trainer.device == "cpu" and composed.trainer.n_gpus_per_node == ranks
    assert composed.trainer.use_v1 is (trainer == "v1")
    assert composed.trainer.total_training_steps == 4 and composed.trainer.save_freq == 2
    assert composed.actor_rollout_ref.rollout.name == "hf"
    assert composed.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert composed.actor_rollout_ref.actor.strategy == "fsdp2"
    assert composed.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert composed.reward.custom_reward_function.path == "pkg://verl_pipe.reward_score"
    assert composed.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1


def _overrides(cfg: QuickstartConfig) -> list[str]:
    return training_overrides(cfg, "/models/m", "/d/train.parquet", "/d/val.parquet", "/runs/r")


def test_every_mode_is_covered_here():
    assert set(TRAINER_MODES) == set(MODE_LAYOUT)


@pytest.mark.parametrize("minibatches", [1, 2])
@pytest.mark.parametrize("mode", list(MODE_LAYOUT))
def test_mode_sets_its_pools_and_weight_sync(mode, minibatches):
    separate, engine = MODE_LAYOUT[mode]
    cfg = QuickstartConfig(mode=mode, ranks=2, sampler_ranks=3 if separate else None, minibatches=minibatches)
    cfg.validate()
    composed = _compose(_overrides(cfg))
    rollout = composed.actor_rollout_ref.rollout
    assert composed.trainer.use_v1 is True and composed.trainer.v1.trainer_mode == mode
    assert composed.actor_rollout_ref.hybrid_engine is (not separate)
    assert rollout.checkpoint_engine.backend == engine
    assert composed.trainer.n_gpus_per_node == 2
    if separate:
        assert (rollout.nnodes, rollout.n_gpus_per_node) == (1, 3)
        assert composed.ray_kwargs.ray_init.num_cpus >= 2 + 3  # every rank placeable, plus verl's service actors
    assert composed.actor_rollout_ref.actor.ppo_mini_batch_size * minibatches == composed.data.train_batch_size
    if mode == "separate_async":  # verl asserts this identity at start-up (its default parameter_sync_step is 4)
        sync_step = composed.trainer.v1.separate_async.parameter_sync_step
        assert sync_step * composed.actor_rollout_ref.actor.ppo_mini_batch_size == composed.data.train_batch_size


def test_default_is_v1_sync_colocated():
    cfg = QuickstartConfig()
    assert (cfg.trainer, cfg.mode, cfg.separate_sampler_ranks) == ("v1", "sync", 0)
    assert cfg.describe_trainer() == "v1 trainer, mode sync (1 rank, rollout colocated)"
    assert not any(o.startswith("actor_rollout_ref.rollout.n_gpus_per_node") for o in _overrides(cfg))


def test_start_line_names_the_mode_and_pools():
    cfg = QuickstartConfig(mode="one_off_pipeline")
    assert cfg.describe_trainer() == "v1 trainer, mode one_off_pipeline (1 trainer + 1 sampler rank)"
    assert QuickstartConfig(trainer="legacy", ranks=2).describe_trainer() == "legacy trainer (2 ranks)"


def test_users_overrides_come_after_the_modes_and_win():
    cfg = QuickstartConfig(mode="minibatch_pipeline", overrides=["actor_rollout_ref.rollout.n_gpus_per_node=2"])
    composed = _compose(_overrides(cfg))
    assert composed.actor_rollout_ref.rollout.n_gpus_per_node == 2 and composed.trainer.v1.trainer_mode == cfg.mode


def _quickstart_cli(*argv: str) -> QuickstartConfig:
    """The config `make demo ARGS="..."` gives `verl-pipe quickstart`, built as the command builds it."""
    from verl_pipe.cli import quickstart_config

    return quickstart_config(build_parser().parse_args(["quickstart", *argv]))


@pytest.mark.parametrize("mode", list(MODE_LAYOUT))
def test_the_mode_flag_runs_that_mode(mode):
    """``make demo ARGS="--mode=<mode>"`` reaches verl's config as that mode, with the mode's pools and sync."""
    cfg = _quickstart_cli(f"--mode={mode}")
    cfg.validate()
    separate, engine = MODE_LAYOUT[mode]
    composed = _compose(_overrides(cfg))
    assert composed.trainer.v1.trainer_mode == mode
    assert composed.actor_rollout_ref.hybrid_engine is not separate
    assert composed.actor_rollout_ref.rollout.checkpoint_engine.backend == engine


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.v1.trainer_mode=one_off_pipeline",
         "the override trainer.v1.trainer_mode=one_off_pipeline sets what --mode sets in the quickstart, which builds "
         "the run around that flag: give --mode one_off_pipeline instead"),
        ("+verl_pipe_trainer=in_flight_pipeline", "give --mode in_flight_pipeline instead"),
        ("trainer.v1.trainer_mode=colocate_async",
         "--mode takes sync, separate_async, one_off_pipeline, minibatch_pipeline, in_flight_pipeline; for another "
         "verl mode, run verl with the CPU overrides (docs/cpu.md)"),
        ("actor_rollout_ref.rollout.name=vllm", "sets what --rollout sets in the quickstart"),
        ("trainer.total_training_steps=5", "give --steps 5 instead"),
    ],
)  # fmt: skip
def test_an_override_of_what_a_flag_sets_is_refused_naming_the_flag(override, message):
    """``make demo ARGS="+verl_pipe_trainer=one_off_pipeline"`` once ran ``sync`` silently (the quickstart's own mode
    key came after it and won). The quickstart builds the pools, the engine and the data around its flags, so an
    override of one of their keys is refused rather than read back into the flag."""
    _quickstart_cli("trainer.save_freq=2").validate()  # the control: an ordinary override passes through
    with pytest.raises(SetupError, match=re.escape(message)):
        _quickstart_cli(override).validate()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "async"}, "--mode must be one of sync, separate_async, one_off_pipeline, minibatch_pipeline"),
        ({"trainer": "legacy", "mode": "one_off_pipeline"}, "drop --trainer legacy, or use --mode sync"),
        ({"mode": "sync", "sampler_ranks": 2}, "--sampler-ranks sizes a separate rollout pool"),
        ({"mode": "separate_async", "sampler_ranks": 0}, "(--sampler-ranks)"),
        ({"prompts_per_step": 6, "minibatches": 4}, "(--minibatches, --prompts-per-step)"),
        ({"minibatches": 0}, "(--minibatches, --prompts-per-step)"),
    ],
)  # fmt: skip
def test_bad_mode_settings_name_the_flag(kwargs, message):
    with pytest.raises(SetupError, match=re.escape(message)):
        QuickstartConfig(**kwargs).validate()


def test_rollout_vllm_sets_verls_vllm_rollout_in_eager_mode():
    cfg = QuickstartConfig(rollout="vllm", mode="one_off_pipeline")
    composed = _compose(_overrides(cfg))
    assert composed.actor_rollout_ref.rollout.name == "vllm"
    assert composed.actor_rollout_ref.rollout.enforce_eager is True
    assert composed.actor_rollout_ref.rollout.checkpoint_engine.backend == "gloo"  # the mode's layout is kept
    default = _overrides(QuickstartConfig())
    assert "actor_rollout_ref.rollout.name=hf" in default and not any("enforce_eager" in o for o in default)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this venv")
def test_rollout_vllm_without_vllm_names_the_install_step():
    with pytest.raises(SetupError, match=re.escape("make install-vllm")):
        QuickstartConfig(rollout="vllm").validate()
    with pytest.raises(SetupError, match=re.escape("--rollout must be one of hf, vllm, got 'sglang'")):
        QuickstartConfig(rollout="sglang").validate()


def test_the_tiny_model_is_refused_for_vllm_with_the_reason():
    with pytest.raises(SetupError, match=re.escape("use --rollout hf with the tiny model")):
        QuickstartConfig(rollout="vllm", model="tiny").validate()


def test_cli_mode_flag(capsys):
    # as `make demo ARGS="--mode=one_off_pipeline --model tiny --steps 2"` passes it
    args = build_parser().parse_args(["quickstart", "--mode=one_off_pipeline", "--model", "tiny", "--steps", "2"])
    assert (args.mode, args.model, args.steps, args.overrides) == ("one_off_pipeline", "tiny", 2, [])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["quickstart", "--mode", "async"])
    err = capsys.readouterr().err
    assert "argument --mode: invalid choice: 'async'" in err and all(mode in err for mode in TRAINER_MODES)


# --- the same lists through the recipes' DRY_RUN path: verl's dataclasses, validate_config, the trainer registry
# and the pipelined modes' own start-up checks (a wrong key or a layout a mode refuses fails here) --------------


def _dry_run(cfg: QuickstartConfig):
    from verl_pipe.recipe_check import RecipeContext, dry_run

    return dry_run(_overrides(cfg), RecipeContext(recipe="quickstart_cpu", check_paths=False))


@pytest.mark.parametrize("mode", list(MODE_LAYOUT))
def test_mode_passes_the_recipes_dry_run(mode):
    separate, engine = MODE_LAYOUT[mode]
    cfg = QuickstartConfig(mode=mode)
    summary = _dry_run(cfg)
    assert summary.use_v1 and summary.trainer_mode == mode and summary.device == "cpu"
    assert summary.layout["hybrid_engine"] is (not separate) and summary.weight_sync == engine
    assert (summary.layout["trainer_gpus"], summary.layout["sampler_gpus"]) == (1, 1 if separate else 0)
    # the pipelined trainer's own derivation accepted the layout: a sync per step, or per minibatch update in the
    # modes that load each one (the demo's data trains 2 minibatches a step)
    if mode == "one_off_pipeline":
        assert summary.parameter_sync_step == 1
    if mode in ("minibatch_pipeline", "in_flight_pipeline"):
        assert summary.parameter_sync_step == cfg.minibatches == 2


def test_legacy_trainer_passes_the_recipes_dry_run():
    assert _dry_run(QuickstartConfig(trainer="legacy")).trainer_mode == "legacy"


def test_a_wrong_key_in_the_mode_table_fails_the_dry_run(monkeypatch):
    from verl_pipe import quickstart
    from verl_pipe.recipe_check import RecipeConfigError

    typo = "trainer.v1.separate_async.parameter_sync_stp"
    bad = dataclasses.replace(TRAINER_MODES["separate_async"], parameter_sync_step_key=typo)
    monkeypatch.setitem(quickstart.TRAINER_MODES, "separate_async", bad)
    with pytest.raises(RecipeConfigError) as info:
        _dry_run(QuickstartConfig(mode="separate_async"))
    assert info.value.key == typo


def test_ray_address_replaces_num_cpus():
    cfg = QuickstartConfig(ray_address="127.0.0.1:6379")
    composed = _compose(training_overrides(cfg, "/m", "/t.parquet", "/v.parquet", "/r"))
    assert composed.ray_kwargs.ray_init.address == "127.0.0.1:6379"
    assert composed.ray_kwargs.ray_init.num_cpus is None  # Ray refuses num_cpus when joining a cluster
    assert composed.ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM == "cpu"


_RAY_WORKER_PROBE = """
import json, os, sys
import ray
ray.init(**json.loads(sys.argv[1]), include_dashboard=False)

@ray.remote(num_cpus=0)
def probe():
    return {"nice": os.nice(0), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}

print(json.dumps(ray.get(probe.remote())))
ray.shutdown()
"""


def _ray_worker_seen_with(ray_init: dict) -> dict:
    """Start a Ray cluster of its own (address "local": never the suite's shared one) with these ray.init kwargs, as
    verl's driver does, and ask one of its workers."""
    import shutil
    import subprocess
    import sys
    import tempfile

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    temp_dir = tempfile.mkdtemp(prefix="ray-probe-", dir="/tmp")  # short: Ray's socket paths have a length limit
    kwargs = {**ray_init, "num_cpus": 1, "address": "local", "_temp_dir": temp_dir}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _RAY_WORKER_PROBE, json.dumps(kwargs)],
            capture_output=True, text=True, timeout=180, env=env, cwd=temp_dir,
        )  # fmt: skip
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_jobs_ray_workers_share_the_cores_as_ordinary_processes_and_sleep_while_they_wait():
    """Guards the demo against a busy neighbour: Ray's workers start at niceness 15 (below every ordinary process
    on the box) and OpenMP threads spin at barriers; together one busy loop made the demo's update 6.8x slower."""
    from omegaconf import OmegaConf

    composed = _compose(training_overrides(QuickstartConfig(), "/m", "/t.parquet", "/v.parquet", "/r"))
    ray_init = OmegaConf.to_container(composed.ray_kwargs.ray_init, resolve=True)
    assert ray_init["_system_config"] == {"worker_niceness": 0}
    assert ray_init["runtime_env"]["env_vars"]["OMP_WAIT_POLICY"] == "PASSIVE"
    seen = _ray_worker_seen_with({k: ray_init[k] for k in ("_system_config", "runtime_env")})
    assert seen == {"nice": 0, "omp_wait_policy": "PASSIVE"}
    # Control: without the override Ray's own default applies, which is what the demo ran with before.
    assert _ray_worker_seen_with({})["nice"] == 15


def test_the_cores_sharing_settings_can_be_turned_off_and_are_not_sent_to_a_cluster_the_job_joins():
    default = cpu_backend_overrides(CpuBackendConfig())
    assert "+ray_kwargs.ray_init._system_config.worker_niceness=0" in default
    # Ray refuses _system_config when joining a running cluster; its workers keep that cluster's niceness.
    joined = cpu_backend_overrides(CpuBackendConfig(ray_address="127.0.0.1:6379"))
    assert not any("_system_config" in o for o in joined)
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.OMP_WAIT_POLICY=PASSIVE" in joined
    plain = cpu_backend_overrides(CpuBackendConfig(omp_wait_policy=None, worker_niceness=None))
    assert not any("OMP_WAIT_POLICY" in o or "worker_niceness" in o for o in plain)
    with pytest.raises(ValueError, match="OMP_WAIT_POLICY"):
        cpu_backend_overrides(CpuBackendConfig(omp_wait_policy="sleepy"))
    with pytest.raises(ValueError, match="worker_niceness"):
        cpu_backend_overrides(CpuBackendConfig(worker_niceness=-5))


def test_vllm_servers_on_the_cpu_platform_use_the_jobs_threads_unbound_unless_the_user_binds_them(monkeypatch):
    from verl_pipe.backends.cpu.platform import PlatformCPU

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert PlatformCPU().rollout_env_vars() == {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-3")
    assert PlatformCPU().rollout_env_vars() == {"VLLM_CPU_OMP_THREADS_BIND": "0-3"}


@pytest.mark.parametrize(
    "kwargs, threads",
    [
        ({"mode": "sync"}, 4),  # the colocated trainer and its sampler take turns: every core
        ({"mode": "sync", "ranks": 2}, 2),
        ({"mode": "one_off_pipeline"}, 2),  # 1 trainer + 1 sampler rank compute at once
        ({"mode": "separate_async", "sampler_ranks": 3}, 1),
        ({"mode": "sync", "torch_threads": 3}, 3),  # given: as given
    ],
)
def test_torch_threads_share_the_cores_among_ranks_that_compute_at_once(monkeypatch, kwargs, threads):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    cfg = QuickstartConfig(**kwargs)
    # Ray would pin every verl actor to one thread; the job's environment reaches each of them, as a string (Ray
    # refuses any other type in env_vars)
    assert _compose(_overrides(cfg)).ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS == str(threads)
    assert not any("OMP_NUM_THREADS" in o for o in cpu_backend_overrides())  # the README's list: Ray's default
    with pytest.raises(ValueError, match=re.escape("torch_threads must be >= 1, got 0")):
        CpuBackendConfig(torch_threads=0).validate()


def test_each_dataset_brings_its_own_defaults_and_given_values_win():
    functions = QuickstartConfig()
    assert functions.data == "functions"
    assert (functions.max_prompt_length, functions.max_response_length, functions.temperature, functions.lr) == (
        256, 128, 0.7, 2e-5)  # fmt: skip
    embedded = QuickstartConfig(data="embedded", lr=1e-6)
    assert (embedded.max_prompt_length, embedded.max_response_length, embedded.temperature, embedded.lr) == (
        512, 192, 1.0, 1e-6)  # fmt: skip
    composed = _compose(_overrides(functions))
    assert composed.data.max_prompt_length == 256 and composed.actor_rollout_ref.rollout.temperature == 0.7
    assert composed.trainer.val_before_train is True  # the demo shows the untrained model's accuracy too
    assert not embedded.validate_at_start and not QuickstartConfig(validate_at_end=False).validate_at_start
    assert composed.data.shuffle is False and embedded.shuffle is True  # the demo reads the families in turn
    # the demo's 6 steps of 2 updates each (docs/demo.md: the 10 runs behind them); embedded keeps 5 of 1
    assert (functions.steps, functions.minibatches, embedded.steps, embedded.minibatches) == (6, 2, 5, 1)
    assert composed.trainer.total_training_steps == 6 and composed.actor_rollout_ref.actor.ppo_mini_batch_size == 4
    assert QuickstartConfig(prompts_per_step=3).minibatches == 1  # 2 would not divide the batch
    assert QuickstartConfig(steps=2, minibatches=4).minibatches == 4
    with pytest.raises(SetupError, match=re.escape("--data must be one of functions, embedded, got 'math'")):
        QuickstartConfig(data="math").validate()
    assert QuickstartConfig(data="math").steps == 5  # an unknown dataset still builds, for validate() to name


def test_step_summary_from_verl_log_formats(tmp_path):
    """Summaries read the exact shapes verl writes: FileLogger lines and rollout_data_dir dumps."""
    log = tmp_path / "verl_metrics.jsonl"
    data = {
        "critic/score/mean": 0.25,
        "response_length/mean": 120.0,
        "response_length/clip_ratio": 0.5,
        "timing_s/gen": 3.0,
        "timing_s/update_actor": 2.0,
        "timing_s/step": 5.5,
    }
    log.write_text(json.dumps({"step": 1, "data": data}) + "\n" + '{"step": 2, "da')  # second line still being written
    dump = tmp_path / "1.jsonl"
    outputs = ["```python\nprint(1)\n```", "no code here", "```python\nprint(2)\n```", "```py\nx\n```"]
    dump.write_text(
        "".join(json.dumps({"output": o, "score": s, "step": 1}) + "\n" for o, s in zip(outputs, [1.0, 0.0, 0.0, 1.0]))
    )

    tail = VerlMetricsTail(str(log))
    records = tail.poll()
    assert [step for step, _ in records] == [1]
    summary = summarize_step(1, records[0][1], str(dump))
    assert summary.pass_rate == 0.5 and summary.format_rate == 0.75
    assert summary.phases_s == {"gen": 3.0, "update_actor": 2.0, "step": 5.5}
    assert "pass   50%" in summary.line() and "format   75%" in summary.line()

    with open(log, "a") as fh:
        fh.write('ta": {"timing_s/step": 1.0}}\n')
    assert [step for step, _ in tail.poll()] == [2]  # the partial line is completed, not lost or duplicated


def test_the_data_seed_fixes_the_problems_while_the_seed_varies(tmp_path, monkeypatch):
    """Repeats of an experiment (bench learn's seeds) train and validate on the same problems: data_seed draws
    them, seed only the sampling; without data_seed the seed draws both, as before."""
    import pandas as pd

    from verl_pipe import quickstart

    monkeypatch.setattr(quickstart, "check_verl_version", lambda: None)

    def problems(**kwargs) -> list[str]:
        run_dir, argv, _ = quickstart.prepare(QuickstartConfig(data="functions", out_dir=str(tmp_path / str(kwargs)),
                                                               **kwargs))  # fmt: skip
        assert f"actor_rollout_ref.rollout.seed={kwargs['seed']}" in argv
        frame = pd.read_parquet(os.path.join(run_dir, "data", "val.parquet"))
        return [row["reward_model"]["ground_truth"] for _, row in frame.iterrows()]

    assert problems(seed=1, data_seed=0) == problems(seed=2, data_seed=0)
    assert problems(seed=1) != problems(seed=2)  # the control: the seed alone draws other problems
