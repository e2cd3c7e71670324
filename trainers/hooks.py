"""Registers the pipelined trainer modes and the gloo checkpoint engine with verl.

Each piece waits for the verl module it extends (:mod:`verl_pipe.import_hooks`): the trainers register when
verl imports its V1 trainer package (in the TaskRunner), the engine when verl imports its checkpoint-engine
base (trainer and rollout workers). A failure is logged at WARNING by the import hook, never swallowed.
The separate-pool patches (:mod:`.patches`) are installed with every other patch, from
:mod:`verl_pipe.patch_registry`.
"""

from __future__ import annotations

import importlib

from verl_pipe.import_hooks import when_imported
from verl_pipe.trainer_modes import TRAINER_MODES as _ALL_MODES, plugin_modes

TRAINER_MODES = plugin_modes()  # the modes registered here (verl_pipe.trainer_modes holds them all)
TRAINER_MODULES = tuple(_ALL_MODES[name].module for name in TRAINER_MODES)
CHECKPOINT_ENGINE_MODULE = "verl_pipe.rollout.gloo_checkpoint_engine"


def _import_all(names) -> None:
    for name in names:
        importlib.import_module(name)


def install() -> None:
    when_imported("verl.trainer.ppo.v1", lambda _module: _import_all(TRAINER_MODULES))
    when_imported("verl.checkpoint_engine.base", lambda _module: _import_all([CHECKPOINT_ENGINE_MODULE]))
