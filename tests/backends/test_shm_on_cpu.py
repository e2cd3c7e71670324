"""A verl job's leaked weight-bucket segments leave /dev/shm with the job, and only those."""

from __future__ import annotations

import os
import sys

import pytest

from verl_pipe.backends.cpu.shm import removing_leaked_weight_buckets


def _segment(name: str) -> str:
    path = f"/dev/shm/psm_{name}_{os.getpid()}"
    with open(path, "wb") as fh:
        fh.write(b"\0" * 4096)
    return path


def test_segments_created_during_the_job_go_and_older_ones_stay():
    older = _segment("older")
    try:
        with pytest.raises(RuntimeError):
            with removing_leaked_weight_buckets():
                leaked = _segment("leaked")
                raise RuntimeError("the job failed")  # whichever way the job ends
        assert not os.path.exists(leaked)
        assert os.path.exists(older)  # the control: not this job's
    finally:
        os.unlink(older)


def test_the_quickstarts_training_process_leaves_none(tmp_path):
    """A stand-in for verl's trainer that leaves a segment, as a job killed by Ray does, run the way the quickstart
    runs verl."""
    from verl_pipe.quickstart import follow_training

    path = f"/dev/shm/psm_trainer_{os.getpid()}"
    argv = [sys.executable, "-c", f"open({path!r}, 'wb').write(b'x')"]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(tmp_path / "verl.jsonl")}
    assert follow_training(argv, env, str(tmp_path), steps=0) == 0
    assert (tmp_path / "train.log").exists() and not os.path.exists(path)
