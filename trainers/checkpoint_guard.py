"""Checkpoints a resume can trust: a failed save stops the run with the reason, a broken tracker is refused.

verl saves a checkpoint in place (``global_step_N/`` under ``trainer.default_local_dir``) and writes the tracker
``latest_checkpointed_iteration.txt`` last, so a save that fails leaves the tracker on the last complete checkpoint.
What it leaves to the user:

* the error: a full disk surfaces from the actor's ``torch.save`` as ``basic_ios::clear: iostream error`` inside a
  Ray traceback, naming neither the disk nor the checkpoint;
* the half-written ``global_step_N/``, which keeps the disk full;
* on resume, a tracker that names a folder that is gone makes ``find_latest_ckpt_path`` return None, and
  ``resume_mode=auto`` then trains from scratch without a word; an empty tracker (a crash between verl's truncating
  ``open`` and its write) fails with ``int('')``.

:func:`saving_checkpoint` wraps the save: on failure it removes the partial folder, puts back a tracker the failure
damaged, and raises :class:`CheckpointSaveError` naming the step, the folder, the free space and the checkpoint a
rerun resumes from. :func:`check_resumable` refuses a tracker that does not name a complete checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil

logger = logging.getLogger("verl_pipe")

from verl.utils.checkpoint.checkpoint_manager import get_checkpoint_tracker_filename

TRACKER = os.path.basename(get_checkpoint_tracker_filename(""))  # verl's name for it


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; the last complete one is intact."""


class CheckpointTrackerError(RuntimeError):
    """The tracker does not name a complete checkpoint, so ``resume_mode=auto`` cannot resume from it."""


def step_folder(checkpoint_dir: str, step: int) -> str:
    return os.path.join(checkpoint_dir, f"global_step_{step}")


def read_tracker(checkpoint_dir: str) -> int | None:
    """The step the tracker names; None when there is no tracker. Raises on one that names no step."""
    path = get_checkpoint_tracker_filename(checkpoint_dir)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read().strip()
    if not text.isdigit():
        raise CheckpointTrackerError(
            f"{path} holds {text!r}, not a step number (a save was cut off while verl wrote it). Write the step of "
            f"the last complete global_step_<N> folder into it, or set trainer.resume_mode=disable to start over"
        )
    return int(text)


def _write_tracker(checkpoint_dir: str, step: int) -> None:
    path = get_checkpoint_tracker_filename(checkpoint_dir)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(str(step))
    os.replace(temporary, path)


def resume_advice(checkpoint_dir: str) -> str:
    """What a rerun of the same command does, for an error message: the checkpoint it resumes from, or a fresh start."""
    try:
        saved = read_tracker(checkpoint_dir)
    except CheckpointTrackerError:
        saved = None
    if not saved:
        return "no checkpoint was saved yet, so it starts over (trainer.save_freq sets how often one is)"
    return (f"with trainer.resume_mode=auto it resumes from {step_folder(checkpoint_dir, saved)} (the prompts taken "
            "since are read again)")  # fmt: skip


def check_resumable(checkpoint_dir: str) -> int | None:
    """The step ``resume_mode=auto`` will resume from (None: no tracker, a fresh start); raises if the tracker is
    unreadable or names a folder that does not exist, where verl would start from scratch or crash."""
    step = read_tracker(checkpoint_dir)
    if step is None or step == 0:
        return step
    folder = step_folder(checkpoint_dir, step)
    if not os.path.isdir(folder):
        raise CheckpointTrackerError(
            f"{get_checkpoint_tracker_filename(checkpoint_dir)} names step {step}, but {folder} does not exist: resuming "
            f"would silently train from scratch. Restore that folder, point the tracker at a complete global_step_<N> "
            f"folder, or set trainer.resume_mode=disable to start over"
        )
    return step


@contextlib.contextmanager
def saving_checkpoint(checkpoint_dir: str, step: int):
    """Run verl's save of ``step`` inside; on failure clean up and raise :class:`CheckpointSaveError`."""
    try:
        previous = read_tracker(checkpoint_dir)
    except CheckpointTrackerError:
        previous = None
    try:
        yield
    except Exception as error:
        free = shutil.disk_usage(checkpoint_dir).free if os.path.isdir(checkpoint_dir) else 0
        partial = step_folder(checkpoint_dir, step)
        if step != previous and os.path.isdir(partial):
            shutil.rmtree(partial, ignore_errors=True)
        try:
            damaged = read_tracker(checkpoint_dir) not in (previous, step)
        except CheckpointTrackerError:
            damaged = True
        if damaged and previous is not None:
            _write_tracker(checkpoint_dir, previous)
        resume = (
            f"a rerun of the same command resumes from {step_folder(checkpoint_dir, previous)}"
            if previous
            else "no earlier checkpoint exists: a rerun starts from scratch"
        )
        raise CheckpointSaveError(
            f"the checkpoint of step {step} was not saved to {partial} ({type(error).__name__}: "
            f"{str(error).strip().splitlines()[-1] if str(error).strip() else ''}). {free / 2**20:.1f} MiB were free "
            f"on its disk when it failed{' (the disk is full)' if free < 2**20 else ''}; the partial folder was "
            f"removed. Free space there or set trainer.default_local_dir to a larger disk; {resume}"
        ) from error
