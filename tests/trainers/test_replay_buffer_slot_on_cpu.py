"""The pipelined modes' replay buffer goes through verl's own extension point, ``trainer.v1.sampler.custom_sampler``.

Checked against verl's real config (hydra composes ``ppo_trainer.yaml``) and verl's real ``_build_replay_buffer``:
our class is named in the slot unless the user named a sampler, verl builds it with the mode's poll interval, and
DAPO's group filter (which verl does not hand a custom sampler) is handed to ours where it refills, and refused at
start-up elsewhere, with the alternative named.
"""

from __future__ import annotations

import os
import re

import pytest

import verl  # noqa: F401 - registers the modes
from verl_pipe.trainers.config import PipelineConfig, PipelineConfigError
from verl_pipe.trainers.ray_trainer_async import OneOffPipelineTrainer
from verl_pipe.trainers.ray_trainer_in_flight import InFlightPipelineTrainer
from verl_pipe.trainers.ray_trainer_pipeline import MinibatchPipelineTrainer
from verl_pipe.trainers.sampler_slot import REPLAY_BUFFER_NAME, REPLAY_BUFFER_PATH, select_pipeline_replay_buffer

LAYOUT = [
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "trainer.device=cpu",
]
USER_SAMPLER = [
    "trainer.v1.sampler.custom_sampler.path=pkg://my_project.samplers",
    "trainer.v1.sampler.custom_sampler.name=MySampler",
]
MODES = [OneOffPipelineTrainer, MinibatchPipelineTrainer]


def _compose(overrides):
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _check_layout(trainer_cls, config) -> None:
    trainer = trainer_cls.__new__(trainer_cls)  # the checks only, as the recipes' dry run runs them
    trainer.pipeline_cfg = PipelineConfig.from_section(trainer_cls.MODE, config.trainer.v1.get(trainer_cls.MODE, {}))
    trainer._check_layout(config)


@pytest.mark.parametrize("trainer_cls", MODES)
def test_verl_builds_our_replay_buffer_from_the_slot(trainer_cls):
    from verl_pipe.trainers.replay_buffer import PipelineReplayBuffer

    mode = trainer_cls.MODE
    config = _compose(LAYOUT + [f"trainer.v1.trainer_mode={mode}", f"+trainer.v1.{mode}.poll_interval_s=0.2"])
    assert select_pipeline_replay_buffer(config)
    assert dict(config.trainer.v1.sampler.custom_sampler) == {"path": REPLAY_BUFFER_PATH, "name": REPLAY_BUFFER_NAME}
    trainer = trainer_cls.__new__(trainer_cls)
    trainer.config, trainer.trainer_mode = config, mode
    buffer = trainer._build_replay_buffer()  # verl's own method (one-off adds its poll callback on top)
    assert type(buffer) is PipelineReplayBuffer
    assert buffer.poll_interval == 0.2  # from the trainer_config verl passes: trainer.v1.<mode>
    assert (buffer.on_poll is not None) == (trainer_cls is OneOffPipelineTrainer)
    # selecting again (a second trainer on the same config) still counts the slot as ours
    assert select_pipeline_replay_buffer(config)


def test_poll_interval_defaults_to_the_pipeline_config():
    config = _compose(LAYOUT + ["trainer.v1.trainer_mode=minibatch_pipeline"])
    select_pipeline_replay_buffer(config)
    trainer = MinibatchPipelineTrainer.__new__(MinibatchPipelineTrainer)
    trainer.config, trainer.trainer_mode = config, "minibatch_pipeline"
    assert trainer._build_replay_buffer().poll_interval == PipelineConfig().poll_interval_s


def test_a_users_sampler_is_left_alone():
    config = _compose(LAYOUT + USER_SAMPLER)
    assert not select_pipeline_replay_buffer(config)
    assert dict(config.trainer.v1.sampler.custom_sampler) == {"path": "pkg://my_project.samplers", "name": "MySampler"}


DAPO = ["algorithm.filter_groups.enable=true", "actor_rollout_ref.rollout.n=2"]


@pytest.mark.parametrize(
    "bad, key",
    [
        (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n=1"),
        (["algorithm.filter_groups.metric=''"], "algorithm.filter_groups.metric"),
        (["algorithm.filter_groups.max_num_gen_batches=-1"], "algorithm.filter_groups.max_num_gen_batches"),
        (["reward.reward_model.enable=true"], "reward.reward_model.enable_resource_pool"),
    ],
)
def test_dapo_settings_that_cannot_work_are_named(bad, key):
    with pytest.raises(PipelineConfigError, match=re.escape(key)):
        _check_layout(MinibatchPipelineTrainer, _compose(LAYOUT + DAPO + bad))
    # a user's own sampler receives the setting through its own config: not ours to refuse
    _check_layout(MinibatchPipelineTrainer, _compose(LAYOUT + USER_SAMPLER + DAPO + bad))


@pytest.mark.parametrize("trainer_cls", [MinibatchPipelineTrainer, InFlightPipelineTrainer, OneOffPipelineTrainer])
def test_verl_builds_our_buffer_with_its_dapo_metric_and_the_refill_budget(trainer_cls):
    """verl hands its DAPO metric to its own buffer only; the trainer hands it to ours, with the budget. one-off's
    batches overlap, so it refills each evicted group into its own batch rather than verl's current step."""
    mode = trainer_cls.MODE
    config = _compose(LAYOUT + DAPO + [f"trainer.v1.trainer_mode={mode}", "actor_rollout_ref.rollout.name=hf",
                                       "algorithm.filter_groups.max_num_gen_batches=3"])  # fmt: skip
    _check_layout(trainer_cls, config)
    select_pipeline_replay_buffer(config)
    trainer = trainer_cls.__new__(trainer_cls)
    trainer.config, trainer.trainer_mode = config, mode
    buffer = trainer._build_replay_buffer()
    assert buffer.filter_groups_metric == "reward" and buffer.refill_fn is not None
    assert buffer.dynamic_sampling.cfg.refills_per_step == 2 * 8  # (3 - 1) x data.train_batch_size
    own_batches = trainer_cls is OneOffPipelineTrainer
    assert (buffer.refill_fn == trainer._refill_evicted_groups) if own_batches else buffer.refill_fn is not None
    # the control: off, verl's metric stays unset and nothing is dropped
    off = _compose(LAYOUT + [f"trainer.v1.trainer_mode={mode}", "actor_rollout_ref.rollout.name=hf"])
    select_pipeline_replay_buffer(off)
    trainer.config = off
    buffer = trainer._build_replay_buffer()
    assert buffer.filter_groups_metric is None and buffer.dynamic_sampling is None
