"""SIGTERM to a ``verl-pipe`` command stops what it started, as Ctrl-C does.

A scheduler, CI's timeout or ``kill`` sends SIGTERM. Python's default ends the process on the spot, skipping its
``finally`` blocks: the verl training child (and the Ray cluster that child started) ran on, holding the cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.timeout(300)


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def test_sigterm_stops_the_training_child_and_its_ray_cluster(tmp_path):
    """Guards: a SIGTERM that ends the command but leaves verl's ``main_ppo`` and its Ray processes behind (seen
    with ``bench learn`` before the handler: the Ray head and main_ppo ran on)."""
    cli = os.path.join(os.path.dirname(sys.executable), "verl-pipe")
    argv = [cli, "quickstart", "--model", "tiny", "--steps", "3", "--out-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    command = psutil.Process(proc.pid)
    started: list[psutil.Process] = []
    try:
        # Terminate once the training child has brought its Ray cluster up (the processes a bare kill leaves).
        _wait_for(lambda: any("raylet" in p.name() for p in command.children(recursive=True)), 180, "Ray's raylet")
        started = command.children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
        assert "terminated (SIGTERM)" in output
        _wait_for(lambda: not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], 90,
                  "the command's processes to end")  # fmt: skip
    finally:  # never leave a failed run's processes to the rest of the suite
        for child in started + (command.children(recursive=True) if command.is_running() else []):
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        proc.kill()
