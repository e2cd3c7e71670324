"""Running verl jobs back to back on the CPU backend: a private local Ray head, and one job on it.

Starting Ray once and letting each ``python -m verl.trainer.main_ppo`` join it saves tens of seconds per job;
when a job's driver exits, Ray frees every actor it owned, so named actors never collide between jobs. The head
runs with ``--block`` as a child of this process, so stopping it ends only this cluster (``ray stop`` would kill
every Ray cluster on the machine, a user's running job included). Used by the tests and the benchmarks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Iterator


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM ends the process through its ``finally`` clauses (its default action skips them,
    and would leave a Ray head or a verl job that runs in a session of its own behind). Only in the main thread,
    and only where nobody else handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def unwind(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def local_ray_head(
    num_cpus: int = 16, start_timeout_s: float = 180.0, stop_grace_s: float = 5.0, resources: dict | None = None
) -> Iterator[str]:
    """Start a head with verl-pipe's CPU platform in every worker's environment; yields its address. ``resources``:
    custom resources of the head's node (e.g. one that a pool is placed by)."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    # Recent Ray enables token auth for new local clusters once ~/.ray/auth_token exists; this loopback-only
    # cluster and every client of it (this process, the verl jobs) agree to run without it.
    os.environ["RAY_AUTH_MODE"] = "disabled"
    temp_dir = tempfile.mkdtemp(prefix="vp_ray_")
    env = _node_env(temp_dir)
    argv = [
        ray_bin,
        "start",
        "--head",
        "--block",
        f"--num-cpus={num_cpus}",
        "--port=0",
        "--include-dashboard=false",
        f"--temp-dir={temp_dir}",
        *([f"--resources={json.dumps(resources)}"] if resources else []),
    ]
    head = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = ""
    with sigterm_unwinds():  # a bench or test run stopped with SIGTERM takes its head down too
        try:
            address_file = os.path.join(temp_dir, "ray_current_cluster")
            deadline = time.time() + start_timeout_s
            while not os.path.exists(address_file):
                if head.poll() is not None:
                    raise RuntimeError(f"`ray start --head` exited early with code {head.returncode}")
                if time.time() > deadline:
                    raise RuntimeError(f"the Ray head did not come up within {start_timeout_s:.0f} s")
                time.sleep(0.5)
            time.sleep(1.0)  # the file appears just before the GCS accepts clients
            with open(address_file) as fh:
                address = fh.read().strip()
            _HEAD_TEMP_DIRS[address] = temp_dir
            yield address
        finally:
            _HEAD_TEMP_DIRS.pop(address, None)
            # `ray start --block` takes ~33 s to stop gracefully; everything it started (GCS, raylet, workers) is in
            # its process group, so after a short grace the group goes at once.
            stop_process_group(head, stop_grace_s)
            shutil.rmtree(temp_dir, ignore_errors=True)


# address -> temp folder of each head this process started: every process of that cluster (raylet, workers) has
# the folder in its environment (``_node_env``), which tells its workers from another cluster's on the machine.
_HEAD_TEMP_DIRS: dict[str, str] = {}
# Titles of a head's processes that hold no job's actor: a pooled idle worker, and Ray's own agents (seen on a fresh
# head, 2026-12-07).
RAY_OWN_TITLES = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def busy_workers(address: str) -> list[tuple[int, str]]:
    """(pid, title) of the Ray workers of the head at ``address`` (started here by :func:`local_ray_head`) that hold
    an actor or run a task: each actor has a worker process of its own, titled ``ray::<Class>[.<method>]``, which
    Ray ends with the actor (after a job's driver exits, with each of the job's actors)."""
    temp_dir = _HEAD_TEMP_DIRS.get(address)
    if temp_dir is None:
        raise KeyError(f"{address} is not a Ray head this process started with local_ray_head")
    marker = f"TMPDIR={os.path.join(temp_dir, 'tmp')}".encode()
    busy = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                title = fh.read().split(b"\0")[0].decode(errors="replace").strip()
            if not title.startswith("ray::") or title.startswith(RAY_OWN_TITLES):
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    busy.append((int(pid), title))
        except OSError:  # gone meanwhile
            continue
    return sorted(busy)


def wait_until_idle(address: str, timeout_s: float = 60.0) -> list[tuple[int, str]]:
    """The head's busy workers (:func:`busy_workers`) once there are none, or once ``timeout_s`` passed (a job's
    actors take a few seconds to go after its driver exits): an empty list when the cluster is idle."""
    deadline = time.monotonic() + timeout_s
    while (busy := busy_workers(address)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return busy


def _node_env(temp_dir: str) -> dict[str, str]:
    """The environment of a Ray node's processes: the CPU platform, and ``temp_dir``/tmp as their temporary folder,
    removed with the node. What a SIGKILLed process leaves in it goes too: vLLM's ZeroMQ sockets and rendezvous files
    (seven per engine start), which it would otherwise leave in /tmp for good."""
    scratch = os.path.join(temp_dir, "tmp")
    os.makedirs(scratch, exist_ok=True)
    return dict(os.environ, VERL_PLATFORM="cpu", RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false",
                TMPDIR=scratch)  # fmt: skip


@contextlib.contextmanager
def joined_ray_node(
    address: str, num_cpus: int, resources: dict, start_timeout_s: float = 120.0, stop_grace_s: float = 5.0
) -> Iterator[subprocess.Popen]:
    """A second Ray node on this machine (its own raylet and object store) joined to the head at ``address``, with
    ``resources`` to place pools by; yields its ``ray start`` process: stopping its group takes the node down, as
    losing a machine would."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    temp_dir = tempfile.mkdtemp(prefix="vp_ray_node_")
    env = _node_env(temp_dir)
    argv = [ray_bin, "start", f"--address={address}", "--block", f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources)}"]  # fmt: skip
    node = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + start_timeout_s
        while not _node_with(address, next(iter(resources))):
            if node.poll() is not None:
                raise RuntimeError(f"`ray start --address={address}` exited early with code {node.returncode}")
            if time.time() > deadline:
                raise RuntimeError(f"the Ray node with {resources} did not join within {start_timeout_s:.0f} s")
            time.sleep(1.0)
        yield node
    finally:
        stop_process_group(node, stop_grace_s)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _node_with(address: str, resource: str) -> bool:
    """Whether an alive node of the cluster at ``address`` has ``resource`` (asked from a child: this process stays
    out of the cluster)."""
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
        "print(any(n['Alive'] and sys.argv[2] in n['Resources'] for n in ray.nodes()))"
    )
    done = subprocess.run([sys.executable, "-c", probe, address, resource], capture_output=True, text=True,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled"))  # fmt: skip
    return done.stdout.strip().endswith("True")


def stop_process_group(process: subprocess.Popen, grace_s: float) -> None:
    """End a child started in a session of its own, and everything in its group: SIGTERM, SIGKILL after ``grace_s``
    (the group's other members too, when the child itself has already exited)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return  # nothing of the group is left
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def job_env(run_dir: str, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a verl job's driver: the CPU platform and verl's file logger in ``run_dir``."""
    env = {"VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": os.path.join(run_dir, "verl_metrics.jsonl"),
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    env.update(extra_env or {})
    return env


def read_steps(run_dir: str) -> list[dict]:
    """verl's per-step records of the job in ``run_dir`` (its file logger's lines; none if it wrote nothing)."""
    metrics_path = os.path.join(run_dir, "verl_metrics.jsonl")
    if not os.path.exists(metrics_path):
        return []
    with open(metrics_path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def run_verl_job(
    overrides: list[str], run_dir: str, timeout: int = 600, extra_env: dict[str, str] | None = None
) -> tuple[int, list[dict], str]:
    """Run ``python -m verl.trainer.main_ppo`` on the CPU backend; return (rc, verl's per-step records, log path).

    verl's file logger writes to ``VERL_FILE_LOGGER_PATH`` in the TaskRunner, which does not inherit this
    process's environment when it joins an existing cluster: pass it in the job's runtime_env as well.
    """
    os.makedirs(run_dir, exist_ok=True)
    log_path = os.path.join(run_dir, "train.log")
    env = dict(os.environ, **job_env(run_dir, extra_env))
    argv = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    with open(log_path, "w") as log:
        rc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, cwd=run_dir).returncode
    return rc, read_steps(run_dir), log_path
