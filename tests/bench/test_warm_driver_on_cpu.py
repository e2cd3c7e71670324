"""The warm verl driver: a failing job is reported with its error in its own log and the same child takes the next
job; a job past its timeout kills the child, and the next job gets a fresh one. (A whole verl run through it is
the pipeline benchmark's slow test.)"""

from __future__ import annotations

from verl_pipe.bench.warm_driver import WarmDriver


def test_failures_stay_in_their_job_and_a_timeout_replaces_the_driver(tmp_path):
    with WarmDriver() as driver:
        first_child = driver._child.pid
        rc, steps, log = driver.run(["data.no_such_key=1"], str(tmp_path / "bad"), timeout=120)
        assert rc == 1 and steps == []
        text = open(log).read()
        assert "no_such_key" in text  # the composing error, in the job's own log
        rc, _, log = driver.run(["trainer.no_such_option=2"], str(tmp_path / "bad2"), timeout=120)
        assert rc == 1 and driver._child.pid == first_child  # the same warm child took the next job
        rc, _, log = driver.run(["data.no_such_key=1"], str(tmp_path / "slow"), timeout=0.001)
        assert rc == 124 and "timed out" in open(log).read()
        assert driver._child is None  # killed; the next job starts a new one
        rc, _, _ = driver.run(["data.no_such_key=1"], str(tmp_path / "again"), timeout=120)
        assert rc == 1 and driver._child.pid != first_child
