"""A checkpoint save that fails on a real full disk (a small tmpfs, real ENOSPC from torch.save) stops with an error
that names the step, the disk and the checkpoint a rerun resumes from, removes its partial folder and leaves the
tracker on the last complete checkpoint; a tracker that names no complete checkpoint is refused before verl reads
it. The controls are verl's own behaviour on the same disk and trackers."""

import os

import pytest
import torch

from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
from verl_pipe.trainers.checkpoint_guard import (
    TRACKER,
    CheckpointSaveError,
    CheckpointTrackerError,
    check_resumable,
    read_tracker,
    saving_checkpoint,
    step_folder,
)

TENSOR_BYTES = 2**20  # larger than the disk's room after step 1


def _checkpoint_dir_with_step_1(root: str) -> str:
    os.makedirs(step_folder(root, 1))
    torch.save(torch.zeros(16), os.path.join(step_folder(root, 1), "model.pt"))
    with open(os.path.join(root, TRACKER), "w") as handle:
        handle.write("1")
    return root


def _save_step_2(root: str) -> None:
    """What verl's save does: the step's folder, the weights, then the tracker."""
    os.makedirs(step_folder(root, 2))
    torch.save(torch.zeros(TENSOR_BYTES // 4), os.path.join(step_folder(root, 2), "model.pt"))
    with open(os.path.join(root, TRACKER), "w") as handle:
        handle.write("2")


def test_a_save_on_a_full_disk_names_the_disk_and_keeps_the_last_checkpoint(tmp_path, small_disk):
    root = _checkpoint_dir_with_step_1(small_disk(str(tmp_path / "checkpoints"), "256k"))
    with pytest.raises(CheckpointSaveError) as raised:
        with saving_checkpoint(root, 2):
            _save_step_2(root)
    message = str(raised.value)
    assert "step 2" in message and "the disk is full" in message, message
    assert f"resumes from {step_folder(root, 1)}" in message, message
    assert not os.path.exists(step_folder(root, 2)), "the partial folder must not stay to fill the disk"
    assert read_tracker(root) == 1 and check_resumable(root) == 1


def test_control_verls_save_on_the_same_disk_says_nothing_of_the_disk_and_leaves_its_partial_folder(
    tmp_path, small_disk
):
    root = _checkpoint_dir_with_step_1(small_disk(str(tmp_path / "checkpoints"), "256k"))
    with pytest.raises(RuntimeError) as raised:
        _save_step_2(root)
    assert "disk" not in str(raised.value) and "space" not in str(raised.value), raised.value
    assert os.path.isdir(step_folder(root, 2))


def test_a_tracker_the_failure_damaged_is_put_back(tmp_path):
    root = _checkpoint_dir_with_step_1(str(tmp_path))
    with pytest.raises(CheckpointSaveError, match="no space"):
        with saving_checkpoint(root, 2):
            os.makedirs(step_folder(root, 2))
            open(os.path.join(root, TRACKER), "w").close()  # verl's open("w") truncated it, then the write failed
            raise OSError(28, "no space")
    assert read_tracker(root) == 1


def test_a_save_that_succeeds_passes_through(tmp_path):
    root = _checkpoint_dir_with_step_1(str(tmp_path))
    with saving_checkpoint(root, 2):
        _save_step_2(root)
    assert read_tracker(root) == 2 and os.path.isdir(step_folder(root, 2))


def test_a_tracker_naming_a_missing_folder_is_refused_where_verl_would_train_from_scratch(tmp_path):
    root = _checkpoint_dir_with_step_1(str(tmp_path))
    with open(os.path.join(root, TRACKER), "w") as handle:
        handle.write("3")
    assert find_latest_ckpt_path(root) is None  # control: verl's resume_mode=auto then starts from step 0
    with pytest.raises(CheckpointTrackerError, match="global_step_3 does not exist"):
        check_resumable(root)


def test_an_empty_tracker_is_named(tmp_path):
    root = _checkpoint_dir_with_step_1(str(tmp_path))
    open(os.path.join(root, TRACKER), "w").close()
    with pytest.raises(ValueError):  # control: verl's own reading
        find_latest_ckpt_path(root)
    with pytest.raises(CheckpointTrackerError, match=TRACKER):
        check_resumable(root)


def test_no_tracker_is_a_fresh_start(tmp_path):
    assert check_resumable(str(tmp_path)) is None
