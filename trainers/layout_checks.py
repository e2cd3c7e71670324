"""Start-up checks of a pipelined mode's layout: each names the key and the fix before any worker starts.

Hybrid replicas on, a rollout, checkpoint engine or platform that cannot run the mode (the ``naive`` engine between
separate pools, in-flight loads on a replica without them: :mod:`verl_pipe.rollout.composition`), a batch that does
not split into minibatches, uniform-group skipping with one sample per prompt, DAPO's group filter where it cannot
run (a mode without refill yet, one sample per prompt, a reward known only after sampling), pools larger than the
Ray cluster.
The trainer runs them in its constructor; the recipes' dry run (:mod:`verl_pipe.recipe_check`) runs the same checks
without one.
"""

from __future__ import annotations

import ray

from verl_pipe.rollout.composition import RolloutCompositionError, compose
from verl_pipe.trainers.config import PipelineConfig, PipelineConfigError
from verl_pipe.trainers.dynamic_sampling import DynamicSamplingConfig
from verl_pipe.trainers.sampler_slot import user_sampler_configured


def _cluster_ranks(resource: str) -> float:
    # Without a running Ray (the dry run) the cluster's size is unknown: that check passes.
    return float(ray.cluster_resources().get(resource, 0)) if ray.is_initialized() else float("inf")


def check_layout(mode: str, pipeline_cfg: PipelineConfig, config) -> None:
    rollout = config.actor_rollout_ref.rollout
    if config.actor_rollout_ref.get("hybrid_engine", True):
        raise PipelineConfigError(
            f"trainer.v1.trainer_mode={mode} runs samplers and trainer on separate pools: set "
            "actor_rollout_ref.hybrid_engine=False and size the sampler pool with "
            "actor_rollout_ref.rollout.nnodes / actor_rollout_ref.rollout.n_gpus_per_node "
            f"(on the CPU backend, `verl-pipe quickstart --mode {mode}` sets all of it)"
        )
    if rollout.nnodes < 1 or rollout.n_gpus_per_node < 1:
        raise PipelineConfigError(
            f"trainer.v1.trainer_mode={mode} needs a sampler pool: set actor_rollout_ref.rollout.nnodes >= 1 and "
            f"actor_rollout_ref.rollout.n_gpus_per_node >= 1 (got {rollout.nnodes} x {rollout.n_gpus_per_node})"
        )
    try:  # the replica, server and checkpoint engine it would build: a combination that cannot work is refused now
        compose(config)
    except RolloutCompositionError as error:
        raise PipelineConfigError(str(error)) from error
    train_batch = config.data.train_batch_size
    mini_batch = config.actor_rollout_ref.actor.ppo_mini_batch_size
    if mini_batch < 1 or train_batch % mini_batch:
        raise PipelineConfigError(
            f"data.train_batch_size={train_batch} must be a multiple of "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}: each minibatch is whole prompt groups"
        )
    if pipeline_cfg.skip_uniform_reward_groups and rollout.n < 2:
        raise PipelineConfigError(
            f"trainer.v1.{mode}.skip_uniform_reward_groups=true with actor_rollout_ref.rollout.n={rollout.n}: "
            "a group of one sample is always uniform, so every batch would be skipped; sample n >= 2 per prompt"
        )
    if not user_sampler_configured(config):  # a user's own sampler owns its filtering
        DynamicSamplingConfig.from_verl(config)  # algorithm.filter_groups: checked here, run by our buffer
    device = str(config.trainer.get("device", "cuda"))
    resource = "CPU" if device == "cpu" else ("NPU" if device == "npu" else "GPU")
    trainer_ranks = config.trainer.nnodes * config.trainer.n_gpus_per_node
    sampler_ranks = rollout.nnodes * rollout.n_gpus_per_node
    available = _cluster_ranks(resource)
    if trainer_ranks + sampler_ranks > available:
        raise PipelineConfigError(
            f"{mode} needs {trainer_ranks} trainer ranks (trainer.nnodes x trainer.n_gpus_per_node) plus "
            f"{sampler_ranks} sampler ranks (actor_rollout_ref.rollout.nnodes x "
            f"actor_rollout_ref.rollout.n_gpus_per_node) = {trainer_ranks + sampler_ranks} {resource}, but the "
            f"Ray cluster has {available:g}: shrink one of the pools or add nodes"
        )
