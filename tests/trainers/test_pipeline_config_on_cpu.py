"""Misconfigured pipelined modes stop at start-up with the key and the fix named, against verl's real schema.

The checks run on the config hydra composes from verl's own ``ppo_trainer.yaml`` with the user's overrides,
exactly what the TaskRunner hands the trainer, through the check the trainer's constructor runs.
"""

from __future__ import annotations

import os

import pytest

import verl  # noqa: F401 - registers the modes
from verl_pipe.trainers.config import PipelineConfig, PipelineConfigError
from verl_pipe.trainers.ray_trainer_async import OneOffPipelineTrainer
from verl_pipe.trainers.ray_trainer_pipeline import MinibatchPipelineTrainer

GOOD = [
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "trainer.device=cpu",
]


def _compose(overrides):
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _check(trainer_cls, overrides):
    config = _compose(overrides)
    trainer = trainer_cls.__new__(trainer_cls)
    trainer.pipeline_cfg = PipelineConfig.from_section(trainer_cls.MODE, config.trainer.v1.get(trainer_cls.MODE, {}))
    trainer._check_layout(config)
    return trainer.parameter_sync_step_for(config)


@pytest.mark.parametrize("trainer_cls", [OneOffPipelineTrainer, MinibatchPipelineTrainer])
def test_a_good_layout_passes(trainer_cls):
    steps = _check(trainer_cls, GOOD)
    # minibatch: one optimizer step per minibatch, as verl's step() counts them; one-off: one update per batch.
    assert steps == (2 if trainer_cls is MinibatchPipelineTrainer else 1)


@pytest.mark.parametrize("trainer_cls", [OneOffPipelineTrainer, MinibatchPipelineTrainer])
def test_pools_larger_than_the_cluster_name_the_keys(trainer_cls, monkeypatch):
    """The pools are checked against the resources Ray reports (here a 16-CPU cluster, as the suite's), naming
    both pools' keys; the same layout with pools that fit passes."""
    from verl_pipe.trainers import layout_checks

    monkeypatch.setattr(layout_checks.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(layout_checks.ray, "cluster_resources", lambda: {"CPU": 16.0, "memory": 1e10})
    sampler = [o for o in GOOD if not o.startswith("actor_rollout_ref.rollout.n_gpus_per_node=")]
    _check(trainer_cls, sampler + ["actor_rollout_ref.rollout.n_gpus_per_node=8"])  # verl's 8 trainer ranks + 8
    with pytest.raises(PipelineConfigError) as info:
        _check(trainer_cls, sampler + ["actor_rollout_ref.rollout.n_gpus_per_node=9"])
    message = str(info.value)
    assert "8 trainer ranks (trainer.nnodes x trainer.n_gpus_per_node) plus 9 sampler ranks" in message, message
    assert "actor_rollout_ref.rollout.n_gpus_per_node) = 17 CPU" in message and "Ray cluster has 16" in message


@pytest.mark.parametrize(
    "change,key",
    [
        ("actor_rollout_ref.hybrid_engine=True", "actor_rollout_ref.hybrid_engine=False"),
        ("actor_rollout_ref.rollout.checkpoint_engine.backend=naive", "checkpoint_engine.backend=naive"),
        ("actor_rollout_ref.rollout.n_gpus_per_node=0", "actor_rollout_ref.rollout.n_gpus_per_node"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3"),
    ],
)
@pytest.mark.parametrize("trainer_cls", [OneOffPipelineTrainer, MinibatchPipelineTrainer])
def test_misconfiguration_names_the_key(trainer_cls, change, key):
    overrides = [o for o in GOOD if o.split("=")[0] != change.split("=")[0]] + [change]
    with pytest.raises(PipelineConfigError) as info:
        _check(trainer_cls, overrides)
    assert key in str(info.value)


def test_contradicting_parameter_sync_step_is_refused():
    with pytest.raises(PipelineConfigError, match="trainer.v1.minibatch_pipeline.parameter_sync_step=3"):
        _check(MinibatchPipelineTrainer, GOOD + ["+trainer.v1.minibatch_pipeline.parameter_sync_step=3"])


@pytest.mark.parametrize("trainer_cls", [OneOffPipelineTrainer, MinibatchPipelineTrainer])
def test_uniform_group_skipping_needs_groups(trainer_cls):
    mode = trainer_cls.MODE
    skip = f"+trainer.v1.{mode}.skip_uniform_reward_groups=true"
    assert _check(trainer_cls, GOOD + [skip, "actor_rollout_ref.rollout.n=2"])
    with pytest.raises(PipelineConfigError, match=f"trainer.v1.{mode}.skip_uniform_reward_groups=true with "):
        _check(trainer_cls, GOOD + [skip, "actor_rollout_ref.rollout.n=1"])


def test_staleness_bound_is_checked():
    assert _check(OneOffPipelineTrainer, GOOD + ["+trainer.v1.one_off_pipeline.max_staleness=1"]) == 1
    with pytest.raises(PipelineConfigError, match="trainer.v1.one_off_pipeline.max_staleness=0 would drop every"):
        _check(OneOffPipelineTrainer, GOOD + ["+trainer.v1.one_off_pipeline.max_staleness=0"])
    assert _check(MinibatchPipelineTrainer, GOOD + ["+trainer.v1.minibatch_pipeline.max_staleness=0"]) == 2
    for bad in (-1, 1.5, True, "x"):
        with pytest.raises(PipelineConfigError, match="trainer.v1.minibatch_pipeline.max_staleness must be"):
            PipelineConfig.from_section("minibatch_pipeline", {"max_staleness": bad})


@pytest.mark.parametrize("trainer_cls", [OneOffPipelineTrainer, MinibatchPipelineTrainer])
def test_preset_switches_a_verl_config_to_the_mode(trainer_cls):
    """``+verl_pipe_trainer=<mode>`` next to GRPO+'s preset: the mode, separate pools, a non-naive engine."""
    preset = [
        "hydra.searchpath=[pkg://verl_pipe.config]",
        "+verl_pipe=grpo_plus",
        f"+verl_pipe_trainer={trainer_cls.MODE}",
    ]
    sizes = ["actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1", "trainer.device=cpu"]
    config = _compose(preset + sizes)
    assert config.trainer.use_v1 and config.trainer.v1.trainer_mode == trainer_cls.MODE
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"
    assert config.algorithm.adv_estimator == "grpo_plus"
    _check(trainer_cls, preset + sizes)  # the preset alone gives a valid layout
    with pytest.raises(PipelineConfigError, match="actor_rollout_ref.rollout.n_gpus_per_node"):
        _check(trainer_cls, preset)  # ... once the sampler pool is sized


def test_unknown_and_bad_section_keys_are_named():
    with pytest.raises(PipelineConfigError, match="trainer.v1.one_off_pipeline.poll_intervall"):
        PipelineConfig.from_section("one_off_pipeline", {"poll_intervall": 1})
    with pytest.raises(PipelineConfigError, match="poll_interval_s must be > 0"):
        PipelineConfig.from_section("one_off_pipeline", {"poll_interval_s": 0})
    assert PipelineConfig.from_section("one_off_pipeline", {"parameter_sync_step": 1}).poll_interval_s == 0.05


def test_modes_and_engine_are_found_through_verls_registries_in_a_fresh_process():
    """What verl's TaskRunner and workers do: only ``import verl`` (the entry point), then look the names up."""
    import subprocess
    import sys

    probe = (
        "import verl\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "from verl.checkpoint_engine import CheckpointEngineRegistry\n"
        "print(get_trainer_cls('one_off_pipeline').__name__, get_trainer_cls('minibatch_pipeline').__name__,"
        " CheckpointEngineRegistry.get('gloo').__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180)
    assert out.stdout.split() == ["OneOffPipelineTrainer", "MinibatchPipelineTrainer", "GlooCheckpointEngine"], (
        out.stderr[-2000:]
    )
