"""A benchmark or test run stopped with SIGTERM leaves no Ray cluster behind (its head runs in a session of its own,
which the default SIGTERM would orphan, still running the job it was given)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

pytestmark = pytest.mark.e2e  # starts Ray heads of its own

_HOLD_A_HEAD = """
import sys, tempfile, time
tempfile.tempdir = sys.argv[1]  # the head's temp dir, so the test can find every process it started
from verl_pipe.local_jobs import local_ray_head
with local_ray_head(num_cpus=2) as address:
    if sys.argv[2] == "default":  # the control: SIGTERM's default action, as before sigterm_unwinds
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(address, flush=True)
    time.sleep(600)
"""


def _processes_under(folder: str) -> list[str]:
    ps = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if folder in line and "ps -ww" not in line]


def _terminated_holder(folder: str, mode: str, settle_s: float) -> list[str]:
    """The head's processes still alive ``settle_s`` after its holder got SIGTERM (sooner, once none is left)."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_A_HEAD, folder, mode], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip(), "the head did not come up"
        assert _processes_under(folder), "the test cannot see the head's processes"
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=60)
    finally:
        holder.kill()
    deadline = time.time() + settle_s
    while _processes_under(folder) and time.time() < deadline:
        time.sleep(0.5)
    return _processes_under(folder)


def test_sigterm_takes_the_ray_head_down_with_the_run():
    # short folders: Ray's socket paths inside them must stay under the 107 bytes a Unix socket allows
    folder, control = tempfile.mkdtemp(prefix="vpj"), tempfile.mkdtemp(prefix="vpj")
    try:
        assert _terminated_holder(folder, "unwinds", settle_s=20) == []
        # the control's head lives on: 5 s is ample (the unwinding head is gone within the holder's wait)
        left = _terminated_holder(control, "default", settle_s=5)
        assert left, "with SIGTERM's default action the head outlives its run"
    finally:
        for line in _processes_under(folder) + _processes_under(control):
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(control, ignore_errors=True)


_LEAVE_A_FILE = """
import os, sys, tempfile, ray
ray.init(address=sys.argv[1], logging_level="ERROR")

@ray.remote(num_cpus=0)
def leave_a_file():  # as a SIGKILLed vLLM engine leaves its ZeroMQ sockets
    handle, path = tempfile.mkstemp(prefix="left_by_a_worker_")
    return path

print(ray.get(leave_a_file.remote()), flush=True)
"""


def test_what_the_clusters_processes_leave_in_their_temp_folder_goes_with_the_head():
    from verl_pipe.local_jobs import local_ray_head

    with local_ray_head(num_cpus=2) as address:
        probe = subprocess.run([sys.executable, "-c", _LEAVE_A_FILE, address], capture_output=True, text=True,
                               env=dict(os.environ, RAY_AUTH_MODE="disabled"), timeout=120)  # fmt: skip
        assert probe.returncode == 0, probe.stderr[-3000:]
        left = probe.stdout.strip().splitlines()[-1]
        head_dir = left.split(os.sep + "tmp" + os.sep + "left_by_a_worker_")[0]
        assert os.path.exists(left) and os.path.basename(head_dir).startswith("vp_ray_"), left  # not in /tmp itself
    assert not os.path.exists(left) and not os.path.exists(head_dir)


_PLANT_ACTORS = """
import sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", namespace="planted")

@ray.remote(num_cpus=0)
class Leftover:
    def ping(self):
        return "up"

@ray.remote(num_cpus=0)
class OwnedByTheJob:
    def ping(self):
        return "up"

kept = Leftover.options(name="leftover", lifetime="detached").remote()  # outlives this driver: a leak
owned = OwnedByTheJob.remote()  # goes with this driver, as every actor of a verl job does
print(ray.get(kept.ping.remote()), ray.get(owned.ping.remote()), flush=True)
"""


def test_a_leftover_actor_keeps_the_head_busy_and_is_named():
    """Guards the check before each e2e test (tests/conftest.py): an actor left on the shared head is seen, by its
    class, and one that went with its job is not. Planted: a detached actor, which outlives its driver."""
    from verl_pipe.local_jobs import busy_workers, local_ray_head, wait_until_idle

    with local_ray_head(num_cpus=2) as address:
        assert wait_until_idle(address, timeout_s=30) == []  # a fresh head: its pooled workers are ray::IDLE
        plant = subprocess.run([sys.executable, "-c", _PLANT_ACTORS, address], capture_output=True, text=True,
                               env=dict(os.environ, RAY_AUTH_MODE="disabled"), timeout=180)  # fmt: skip
        assert plant.returncode == 0 and "up up" in plant.stdout, plant.stderr[-3000:]
        left = wait_until_idle(address, timeout_s=30)  # long enough for the job's own actor to go
        titles = [title for _, title in left]
        assert len(left) == 1 and titles[0].startswith("ray::Leftover"), left
        os.kill(left[0][0], signal.SIGKILL)
        assert wait_until_idle(address, timeout_s=30) == []
        with pytest.raises(KeyError, match="not a Ray head this process started"):
            busy_workers("127.0.0.1:1")
