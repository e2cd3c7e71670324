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

pytestmark = [pytest.mark.timeout(300), pytest.mark.e2e]  # launches the quickstart and verl's main_ppo


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # it ended between the two calls
        return False


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return ""


def test_sigterm_stops_the_training_child(tmp_path):
    """Guards: a SIGTERM that ends the command but leaves verl's ``main_ppo`` behind (seen with ``bench learn``
    before the handler: the Ray head and main_ppo ran on)."""
    cli = os.path.join(os.path.dirname(sys.executable), "verl-pipe")
    argv = [cli, "quickstart", "--model", "tiny", "--steps", "3", "--out-dir", str(tmp_path / "run")]
    log_path = tmp_path / "command.log"  # a file, not a pipe: nothing reads a pipe while the test waits
    log = open(log_path, "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    command = psutil.Process(proc.pid)
    started: list[psutil.Process] = []
    try:
        # Terminate once the training child runs (waiting for its Ray cluster too cost the suite a minute more).
        _wait_for(lambda: any("main_ppo" in _cmdline(p) for p in command.children(recursive=True)), 180, "main_ppo")
        started = command.children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        output = log_path.read_text()
        assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
        assert "terminated (SIGTERM)" in output
        _wait_for(lambda: not [p for p in started if _alive(p)], 90, "the command's processes to end")
    finally:  # never leave a failed run's processes to the rest of the suite
        for child in started + (command.children(recursive=True) if command.is_running() else []):
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        proc.kill()
        log.close()
