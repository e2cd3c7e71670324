"""The warm verl driver: a failing job is reported with its error in its own log and the same child takes the next
job; a job past its timeout kills the child, and the next job gets a fresh one; the child dies with its parent. (A
whole verl run through it is the pipeline benchmark's slow test.)"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

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


def test_the_driver_dies_with_the_process_that_started_it(tmp_path):
    """Guards: a benchmark killed outright (a test's timeout sends SIGKILL) left its warm driver, a session of its own,
    running its verl job on the shared cluster, where it went on taking the CPU from the tests after it. The job
    here blocks for good (its log is a FIFO nobody reads), as a long verl job would. The control: the driver is
    alive, inside its job, while its parent is."""
    run_dir = tmp_path / "blocked"
    run_dir.mkdir()
    os.mkfifo(run_dir / "train.log")  # the job's open() of its log waits for a reader that never comes
    parent_code = (
        "import sys\n"
        "from verl_pipe.bench.warm_driver import WarmDriver\n"
        "driver = WarmDriver().__enter__()\n"
        "print(driver._child.pid, flush=True)\n"
        f"driver.run([], {str(run_dir)!r}, timeout=600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        time.sleep(2.0)
        assert _alive(child), "the control: the driver runs its job while its parent waits for it"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 20
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child), f"the warm driver {child} outlived the benchmark that started it"
    finally:
        parent.kill()
        with contextlib.suppress(ProcessLookupError, ValueError):
            if _alive(child):
                os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
