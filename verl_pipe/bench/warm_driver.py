"""A warm verl driver: one child process that imports verl once and runs verl jobs one after another.

``python -m verl.trainer.main_ppo`` spends about 5 s of a 2-core machine importing torch, transformers and verl
before it reaches Ray, and a benchmark of fifty short runs pays that fifty times. The child here pays it once,
then, for each job, composes the overrides as main_ppo's Hydra entry point does, runs main_ppo's own body with
the job's output in the job's log, and disconnects from Ray (``ray.shutdown``), which ends the job: Ray frees every
actor it owned, as when a driver process exits. A job that outlives its timeout takes the child with it (its
process group is killed); the next job starts a fresh one. The child dies with its parent (a benchmark killed
with SIGKILL, as a test's timeout does): its job's actors must not go on running on a shared cluster unwatched.
Used by the pipeline benchmark.

The child speaks JSON lines: a job on its stdin, the job's exit code on the pipe the parent passed it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Optional


class WarmDriver:
    """Runs verl jobs through one long-lived driver process; a context manager (``close`` ends the child)."""

    def __init__(self, start_timeout_s: float = 300.0):
        self.start_timeout_s = start_timeout_s
        self._child: Optional[subprocess.Popen] = None
        self._results = None  # the read end of the child's result pipe

    def __enter__(self) -> "WarmDriver":
        self._start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start(self) -> None:
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, VERL_PLATFORM="cpu", TOKENIZERS_PARALLELISM="false")
        argv = [sys.executable, "-m", __name__, str(write_fd), str(os.getpid())]
        self._child = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, pass_fds=(write_fd,), start_new_session=True,
                                       text=True)  # fmt: skip
        os.close(write_fd)
        self._results = os.fdopen(read_fd, "r")
        ready = self._read(self.start_timeout_s)
        if not ready or not ready.get("ready"):
            self.close()
            raise RuntimeError(f"the warm verl driver did not start (said {ready!r})")

    def _read(self, timeout_s: float) -> Optional[dict[str, Any]]:
        """The child's next message, or None when it died or the timeout passed."""
        readable, _, _ = select.select([self._results], [], [], timeout_s)
        if not readable:
            return None
        line = self._results.readline()
        return json.loads(line) if line else None

    def run(self, overrides: list[str], run_dir: str, timeout: int = 600,
            extra_env: dict[str, str] | None = None) -> tuple[int, list[dict], str]:  # fmt: skip
        """Like :func:`verl_pipe.local_jobs.run_verl_job`: (exit code, verl's per-step records, log path); 124 when
        the job outlived ``timeout`` (the child is then killed and the next job gets a fresh one)."""
        from verl_pipe.local_jobs import job_env, read_steps

        os.makedirs(run_dir, exist_ok=True)
        if self._child is None or self._child.poll() is not None:
            self._start()
        log_path = os.path.join(run_dir, "train.log")
        env = job_env(run_dir, extra_env)
        job = {"overrides": overrides, "run_dir": run_dir, "log": log_path, "env": env}
        self._child.stdin.write(json.dumps(job) + "\n")
        self._child.stdin.flush()
        answer = self._read(timeout)
        if answer is None:
            timed_out = self._child.poll() is None
            self._kill()
            rc = 124 if timed_out else (self._child.returncode or 1)
            with open(log_path, "a") as log:
                log.write(f"\n[warm driver] the job {'timed out' if timed_out else 'took the driver down'}\n")
        else:
            rc = int(answer["rc"])
        return rc, read_steps(run_dir), log_path

    def _kill(self) -> None:
        if self._child is None:
            return
        if self._child.poll() is None:
            os.killpg(self._child.pid, signal.SIGKILL)
        self._child.wait()
        self._results.close()
        self._child = None

    def close(self) -> None:
        if self._child is None:
            return
        if self._child.poll() is None:
            try:
                self._child.stdin.write("null\n")
                self._child.stdin.flush()
                self._child.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()


# --- the child ---------------------------------------------------------------------------------------------------


def _run_job(overrides: list[str], run_dir: str, log: str, env: dict[str, str]) -> int:
    """One job, as ``python -m verl.trainer.main_ppo OVERRIDES`` in ``run_dir`` with ``env`` would run it."""
    import ray
    from verl.trainer import main_ppo

    from verl_pipe.recipe_check import compose_config

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    rc = 0
    with open(log, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            os.environ.update(env)
            os.chdir(run_dir)
            main_ppo.main(compose_config(overrides))  # Hydra's wrapper passes a given config straight through
        except BaseException:  # noqa: BLE001 - any failure is this job's, reported as its exit code
            traceback.print_exc()
            rc = 1
        finally:
            if ray.is_initialized():
                ray.shutdown()  # ends the job: Ray frees its actors
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
    return rc


PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the parent that started it dies (Linux; elsewhere nothing). This process is the
    verl job's Ray driver, so its death ends the job: Ray frees every actor the job owned."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent was gone before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _serve(result_fd: int, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    started = time.monotonic()
    import verl.trainer.main_ppo  # noqa: F401 - the import this process exists to pay once

    results = os.fdopen(result_fd, "w")

    def send(message: dict[str, Any]) -> None:
        results.write(json.dumps(message) + "\n")
        results.flush()

    send({"ready": True, "import_s": time.monotonic() - started})
    for line in sys.stdin:
        job = json.loads(line)
        if job is None:
            return
        send({"rc": _run_job(**job)})


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
