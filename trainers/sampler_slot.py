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
# in_flight_pipeline's buffer: deadline-ordered groups from a sampler that never drains (another module: same reason).
IN_FLIGHT_BUFFER_PATH = "pkg://verl_pipe.trainers.in_flight_buffer"
IN_FLIGHT_BUFFER_NAME = "InFlightReplayBuffer"
OURS = {(REPLAY_BUFFER_PATH, REPLAY_BUFFER_NAME), (IN_FLIGHT_BUFFER_PATH, IN_FLIGHT_BUFFER_NAME)}


def user_sampler_configured(config) -> bool:
    """Whether ``trainer.v1.sampler.custom_sampler`` names a class other than ours (path and name both set, as
    verl tests it)."""
    custom = config.trainer.v1.get("sampler", {}).get("custom_sampler", None)
    if custom is None or not (custom.get("path") and custom.get("name")):
        return False
    return (custom.get("path"), custom.get("name")) not in OURS


def select_pipeline_replay_buffer(
    config, path: str = REPLAY_BUFFER_PATH, name: str = REPLAY_BUFFER_NAME
) -> bool:
    """Name our replay buffer (``path``/``name``: a mode's own) in verl's custom-sampler slot unless the user named a
    sampler; returns whether ours is used. Call before verl's trainer constructor, which builds the buffer."""
    if user_sampler_configured(config):
        return False
    with open_dict(config):
        config.trainer.v1.sampler.custom_sampler = {"path": path, "name": name}
    return True
