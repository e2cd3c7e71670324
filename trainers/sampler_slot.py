"""Which replay buffer verl builds for a pipelined mode: ours, named in verl's custom-sampler slot, or the user's.

verl builds its replay buffer itself and lets the config name the class
(``trainer.v1.sampler.custom_sampler.{path,name}``). The pipelined trainers name
:class:`~verl_pipe.trainers.replay_buffer.PipelineReplayBuffer` there before verl reads it, unless the user named
a sampler (theirs is then used, untouched). The class is named, not imported: this module imports nothing of
verl, so the start-up checks can use it without loading verl's trainer.
"""

from __future__ import annotations

from omegaconf import open_dict

# verl loads the class with load_extern_type(path, name); pkg:// imports by module name (no file path).
REPLAY_BUFFER_PATH = "pkg://verl_pipe.trainers.replay_buffer"
REPLAY_BUFFER_NAME = "PipelineReplayBuffer"


def user_sampler_configured(config) -> bool:
    """Whether ``trainer.v1.sampler.custom_sampler`` names a class other than ours (path and name both set, as
    verl tests it)."""
    custom = config.trainer.v1.get("sampler", {}).get("custom_sampler", None)
    if custom is None or not (custom.get("path") and custom.get("name")):
        return False
    return (custom.get("path"), custom.get("name")) != (REPLAY_BUFFER_PATH, REPLAY_BUFFER_NAME)


def select_pipeline_replay_buffer(config) -> bool:
    """Name our replay buffer in verl's custom-sampler slot unless the user named a sampler; returns whether ours
    is used. Call before verl's trainer constructor, which builds the buffer."""
    if user_sampler_configured(config):
        return False
    with open_dict(config):
        config.trainer.v1.sampler.custom_sampler = {"path": REPLAY_BUFFER_PATH, "name": REPLAY_BUFFER_NAME}
    return True
