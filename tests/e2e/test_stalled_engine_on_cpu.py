"""A rollout engine that stops making progress without dying stops a pipelined run, diagnosed, in bounded time.

Two runs of ``one_off_pipeline`` start together through verl's stock entrypoint on the shared cluster, each with
every rollout request held forever from the first (:func:`verl_pipe.backends.cpu.faults.stalled_engine`, through
the servers' timing slot: the server is up and answers, its requests never end). With the stall watch at 5 s the
run ends with one error that names the wait, what TransferQueue holds and how the replica answers. The control is
the same run with the watch off (``stall_timeout_s=null``, verl's own behaviour): it is still waiting, with no step
done, well after the watched run has stopped, and is then killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from verl_pipe.backends.cpu.faults import STALL_AFTER_ENV
from verl_pipe.backends.cpu.generation_timing import GENERATION_TIMING_ENV
from verl_pipe.data.embedded import write_embedded_dataset
from verl_pipe.local_jobs import job_env, read_steps
from verl_pipe.quickstart import QuickstartConfig, training_overrides

MODE = "one_off_pipeline"
STALL_TIMEOUT_S = 5
# The control must still be waiting this long after the watched run stopped (both stalled at about the same time).
CONTROL_GRACE_S = 15

pytestmark = pytest.mark.timeout(600)


def _start(run_dir: str, model: str, ray_address: str, stall_timeout: str) -> tuple[subprocess.Popen, str]:
    cfg = QuickstartConfig(data="embedded", model=model, mode=MODE, algorithm="grpo", steps=2, prompts_per_step=2,
                           samples_per_prompt=2, max_response_length=8, validate_at_end=False,
                           ray_address=ray_address, out_dir=run_dir)  # fmt: skip
    train_file, val_file = write_embedded_dataset(os.path.join(run_dir, "data"))
    # (the count quoted: hydra would pass a number, and Ray takes only strings)
    worker_env = {GENERATION_TIMING_ENV: "verl_pipe.backends.cpu.faults:stalled_engine", STALL_AFTER_ENV: "'0'"}
    overrides = training_overrides(cfg, model, train_file, val_file, run_dir) + [
        "trainer.val_before_train=False",
        f"+trainer.v1.{MODE}.stall_timeout_s={stall_timeout}",
        *(f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}={value}" for name, value in worker_env.items()),
    ]
    log_path = os.path.join(run_dir, "train.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=run_dir,
                                   env=dict(os.environ, **job_env(run_dir)), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    return process, log_path


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_the_stall_watch_stops_a_run_whose_engine_stalled(tmp_path, tiny_model_path, ray_cluster, tail_of):
    watched, watched_log = _start(str(tmp_path / "watched"), tiny_model_path, ray_cluster, str(STALL_TIMEOUT_S))
    control, control_log = _start(str(tmp_path / "control"), tiny_model_path, ray_cluster, "null")
    try:
        started = time.monotonic()
        rc = watched.wait(timeout=420)
        stopped_after = time.monotonic() - started
        log = open(watched_log, errors="replace").read()
        assert rc != 0, tail_of(watched_log)
        assert f"{MODE}: the sampler made no progress for" in log, tail_of(watched_log)
        assert "while the trainer waited for 2 prompt groups of step 1" in log
        assert "0 finished" in log and "replica 0: its server answers" in log, tail_of(watched_log)
        assert f"trainer.v1.{MODE}.stall_timeout_s" in log
        # the control: without the watch the same stall is waited on forever
        time.sleep(CONTROL_GRACE_S)
        assert control.poll() is None, tail_of(control_log)
        assert "made no progress" not in open(control_log, errors="replace").read()
        trained = [s for s in read_steps(str(tmp_path / "control")) if "timing_s/step" in s["data"]]
        assert not trained, "the control trained a step through a stalled engine"
        print(f"watched run stopped {stopped_after:.0f} s after both started; control still waiting "
              f"{CONTROL_GRACE_S} s later")  # fmt: skip
    finally:
        _stop(watched)
        _stop(control)
