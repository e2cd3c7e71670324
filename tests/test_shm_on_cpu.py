"""Orphaned shared-memory segments (verl's weight buckets) leave /dev/shm with the job that made them, and only
those: a segment older than the job, or one a live process still maps or holds, stays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from verl_pipe.shm import leakable_segments, remove_orphaned_segments, removing_orphaned_segments

# A process that creates a segment, maps it (as verl's bucket sender does) and says so, then waits to be killed.
HOLDER = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, 4096)
buf = mmap.mmap(fd, 4096)
os.close(fd)  # held by its mapping only, as SharedMemory's buffer is once its fd is gone
print("mapped", flush=True)
time.sleep(600)
"""


def _segment(name: str) -> str:
    path = f"/dev/shm/psm_{name}_{os.getpid()}"
    with open(path, "wb") as fh:
        fh.write(b"\0" * 4096)
    return path


def _holder(path: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "mapped"
    return proc


def test_segments_created_during_the_job_go_and_older_ones_stay():
    older = _segment("older")
    try:
        with pytest.raises(RuntimeError):
            with removing_orphaned_segments(wait_s=0):
                leaked = _segment("leaked")
                raise RuntimeError("the job failed")  # whichever way the job ends
        assert not os.path.exists(leaked)
        assert os.path.exists(older)  # the control: not this job's
    finally:
        os.unlink(older)


def test_a_segment_a_live_process_maps_stays_until_its_holder_is_killed():
    """A concurrent job's bucket, made while ours ran, is mapped by its live sender: not ours to remove. Once its
    holder is SIGKILLed it is an orphan like any other."""
    before = leakable_segments()
    live = f"/dev/shm/psm_live_{os.getpid()}"
    holder = _holder(live)
    try:
        orphan = _segment("orphan")
        assert remove_orphaned_segments(before, wait_s=1.0) == [orphan]
        assert os.path.exists(live) and not os.path.exists(orphan)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert remove_orphaned_segments(before, wait_s=0) == [live]  # the control: the same segment, unheld
    finally:
        holder.kill()
        holder.wait()
        if os.path.exists(live):
            os.unlink(live)


def test_a_driver_removes_at_exit_what_its_killed_workers_left(tmp_path):
    """As a ``main_ppo`` driver (wrapped by the plugin's run_ppo patch) does: a worker SIGKILLed while it mapped a
    bucket leaves it; the driver's exit removes it, and leaves a live process's."""
    orphan, live = (f"/dev/shm/verl_weights_{kind}_{os.getpid()}" for kind in ("killed", "live"))
    driver = textwrap.dedent(f"""
        import signal, subprocess, sys
        import ray  # its exit hook is registered first: ours must run before it
        from verl_pipe.shm import remove_orphans_at_exit
        remove_orphans_at_exit(wait_s=1.0)
        worker = subprocess.Popen([sys.executable, "-c", {HOLDER!r}, {orphan!r}], stdout=subprocess.PIPE, text=True)
        assert worker.stdout.readline().strip() == "mapped"
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    """)
    holder = _holder(live)
    try:
        done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert not os.path.exists(orphan), done.stdout + done.stderr
        assert "removed 1 shared-memory segment" in done.stdout
        assert os.path.exists(live)  # not this driver's: mapped by a live process
    finally:
        holder.kill()
        holder.wait()
        for path in (orphan, live):
            if os.path.exists(path):
                os.unlink(path)


def test_the_quickstarts_training_process_leaves_none(tmp_path):
    """A stand-in for verl's trainer that leaves a segment, as a job killed by Ray does, run the way the quickstart
    runs verl."""
    from verl_pipe.quickstart import follow_training

    path = f"/dev/shm/psm_trainer_{os.getpid()}"
    argv = [sys.executable, "-c", f"open({path!r}, 'wb').write(b'x')"]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(tmp_path / "verl.jsonl")}
    assert follow_training(argv, env, str(tmp_path), steps=0) == 0
    assert (tmp_path / "train.log").exists() and not os.path.exists(path)


def test_a_segment_its_owner_is_about_to_unlink_is_left_to_it(monkeypatch):
    """SharedMemory closes its mapping and then unlinks its name: between the two, no process holds the segment.
    A check that looks then (another test's job on a concurrent pytest worker) must leave it to its owner, whose
    unlink would otherwise fail; a segment still unheld after the settle time is removed as before. Control: with
    no settle time the check takes the owner's segment."""
    import threading
    import time

    import verl_pipe.shm as shm

    def owner_unlinks(settle_s: float) -> tuple[list[str], list[OSError]]:
        monkeypatch.setattr(shm, "ORPHAN_SETTLE_S", settle_s)
        before = leakable_segments()
        closing = _segment("closing")  # closed (unheld), its unlink 0.1 s away
        errors: list[OSError] = []

        def unlink_soon():
            try:
                time.sleep(0.1)
                os.unlink(closing)
            except OSError as error:  # the owner's failure is what is checked
                errors.append(error)

        owner = threading.Thread(target=unlink_soon)
        owner.start()
        removed = remove_orphaned_segments(before, wait_s=0)
        owner.join()
        return removed, errors

    removed, errors = owner_unlinks(shm.ORPHAN_SETTLE_S)
    assert removed == [] and errors == []
    removed, errors = owner_unlinks(0.0)
    assert len(removed) == 1 and isinstance(errors[0], FileNotFoundError)
