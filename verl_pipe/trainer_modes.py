"""The one table of verl V1 trainer modes that verl-pipe knows: verl's own and the three the plugin adds.

Everything that lists modes reads it: the trainers' registration (the modules to import), the quickstart's
``--mode`` and the CLI's help, the recipes' dry run, the benchmarks' schedules, and the shipped presets
(``+verl_pipe_trainer=<mode>``) and recipe shell, which a test holds to it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

# +verl_pipe_trainer=<mode>: the hydra preset that switches any verl command line to one of the plugin's modes.
MODE_PRESET_GROUP = "verl_pipe_trainer"


@dataclass(frozen=True)
class TrainerMode:
    """A V1 trainer mode (``trainer.v1.trainer_mode=<name>``) and what running it needs."""

    name: str
    summary: str
    # Samplers and trainer on separate pools: actor_rollout_ref.hybrid_engine=False, a rollout pool of its own and
    # a checkpoint engine between the pools. Otherwise colocated: rollout replicas live in the trainer ranks.
    separate_pools: bool
    # The module that defines and registers the mode's trainer class (its MODE is ``name``); None for verl's own.
    module: Optional[str] = None
    # verl's separate_async asserts train_batch_size == parameter_sync_step x ppo_mini_batch_size; this key sets it
    # (ours derive it from their own section).
    parameter_sync_step_key: Optional[str] = None

    @property
    def from_plugin(self) -> bool:
        """Registered by the plugin; a hydra preset ``+verl_pipe_trainer=<name>`` ships with it."""
        return self.module is not None


TRAINER_MODES: dict[str, TrainerMode] = {
    mode.name: mode
    for mode in (
        TrainerMode(
            "sync",
            summary="verl's synchronous trainer (the default): every rank samples, then trains",
            separate_pools=False,
        ),
        TrainerMode(
            "separate_async",
            summary="verl's off-policy trainer on separate pools (one warm-up batch, partial rollouts)",
            separate_pools=True,
            parameter_sync_step_key="trainer.v1.separate_async.parameter_sync_step",
        ),
        TrainerMode(
            "one_off_pipeline",
            summary="verl-pipe: the samplers generate batch k+1 while the trainer trains batch k",
            separate_pools=True,
            module="verl_pipe.trainers.ray_trainer_async",
        ),
        TrainerMode(
            "minibatch_pipeline",
            summary="verl-pipe: the trainer updates on each minibatch of finished groups while the rest generate",
            separate_pools=True,
            module="verl_pipe.trainers.ray_trainer_pipeline",
        ),
        TrainerMode(
            "in_flight_pipeline",
            summary="verl-pipe: the samplers never drain; new weights load between decode steps (lag bound 1)",
            separate_pools=True,
            module="verl_pipe.trainers.ray_trainer_in_flight",
        ),
    )
}


def plugin_modes() -> tuple[str, ...]:
    """The modes the plugin registers with verl, in the table's order."""
    return tuple(name for name, mode in TRAINER_MODES.items() if mode.from_plugin)


def preset_modes() -> tuple[str, ...]:
    """The modes that ship a ``+verl_pipe_trainer=<mode>`` preset (verl_pipe/config/verl_pipe_trainer/*.yaml)."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config", MODE_PRESET_GROUP)
    return tuple(sorted(name[: -len(".yaml")] for name in os.listdir(folder) if name.endswith(".yaml")))
