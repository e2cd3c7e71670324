"""Shared fixtures: the tiny model, and one Ray cluster for every end-to-end test in the session.

End-to-end tests run verl's stock entrypoint (``python -m verl.trainer.main_ppo``) as separate Ray *jobs*
against one cluster started here, so each run pays for actor start-up but not for a new cluster; when a job's
driver exits, Ray frees every actor it owned, so named actors never collide between runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    from verl_pipe.models import build_tiny_qwen2

    return build_tiny_qwen2()


@pytest.fixture(scope="session")
def ray_cluster():
    """Address of a local Ray head with verl-pipe's CPU platform in every worker's environment."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    # Ray >= 2.5x enables token auth for new local clusters once ~/.ray/auth_token exists; this loopback-only test
    # cluster and every client of it (this process, the verl jobs) agree to run without it.
    os.environ["RAY_AUTH_MODE"] = "disabled"
    temp_dir = tempfile.mkdtemp(prefix="vp_ray_")
    env = dict(os.environ, VERL_PLATFORM="cpu", RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false")
    # --block keeps the cluster a child of this process: stopping it ends only this cluster. (`ray stop` would
    # kill every Ray cluster on the machine, including a user's running job.)
    argv = [
        ray_bin,
        "start",
        "--head",
        "--block",
        "--num-cpus=16",
        "--port=0",
        "--include-dashboard=false",
        f"--temp-dir={temp_dir}",
    ]
    head = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address_file = os.path.join(temp_dir, "ray_current_cluster")
    deadline = time.time() + 180
    while not os.path.exists(address_file):
        assert head.poll() is None, "ray start --head exited early"
        assert time.time() < deadline, "Ray head did not come up within 180 s"
        time.sleep(0.5)
    time.sleep(1.0)  # the file appears just before the GCS accepts clients
    with open(address_file) as fh:
        address = fh.read().strip()
    try:
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


@pytest.fixture(scope="session")
def verl_runner():
    """The function that runs verl's stock entrypoint as a child process (see :func:`run_verl`)."""
    return run_verl


def run_verl(overrides: list[str], run_dir: str, timeout: int = 600) -> tuple[int, list[dict], str]:
    """Run ``python -m verl.trainer.main_ppo`` on the CPU backend; return (rc, per-step metrics, log path)."""
    os.makedirs(run_dir, exist_ok=True)
    metrics_path = os.path.join(run_dir, "verl_metrics.jsonl")
    log_path = os.path.join(run_dir, "train.log")
    env = dict(os.environ, VERL_PLATFORM="cpu", VERL_FILE_LOGGER_PATH=metrics_path, TOKENIZERS_PARALLELISM="false")
    argv = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    with open(log_path, "w") as log:
        rc = subprocess.run(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, cwd=run_dir
        ).returncode
    steps = []
    if os.path.exists(metrics_path):
        with open(metrics_path) as fh:
            steps = [json.loads(line) for line in fh if line.strip()]
    return rc, steps, log_path


def log_tail(path: str, lines: int = 60) -> str:
    with open(path, errors="replace") as fh:
        return "".join(fh.readlines()[-lines:])


@pytest.fixture(scope="session")
def tail_of():
    return log_tail
