"""A rollout engine that stalls, or whose server is killed mid-generation, stops a pipelined run, diagnosed, in
bounded time.

Three runs of ``one_off_pipeline``, one after another, through verl's stock entrypoint on the shared cluster, each
with a fault from its first rollout request on (:func:`verl_pipe.backends.cpu.faults.engine_fault`, through the servers'
timing slot): ``stall`` holds every request forever while the server is up and answers; ``kill`` kills the
server's process in the middle of its first request. The first run, with the stall watch at 5 s, and the second,
with the watch at 10 minutes (a dead replica is seen by the watch's look at the actors, at the first failed group
and every 5 s of any wait), each end with one error that names the wait, what TransferQueue holds and how the
replica answers (stuck, or dead). The
control is the stalled run with the watch off (``stall_timeout_s=null``, verl's own behaviour): it is still
waiting, with no step done, well past the point where the watch stopped the stalled run, and is then killed. After
each run, none of its processes is alive and /dev/shm holds nothing it added. (verl's own
``separate_async``, with its server killed the same way, was seen churning failed requests for 240 s until killed.)
"""

from __future__ import annotations

import re
import time

import pytest

from verl_pipe.chaos import processes_left, shm_files, shm_left_since, start_faulted_run
from verl_pipe.local_jobs import read_steps, stop_process_group

MODE = "one_off_pipeline"
STALL_TIMEOUT_S = 5
DEAD_REPLICA_TIMEOUT_S = 600
# The watch's account of TransferQueue: no group of the step finished ("... running, 0 finished and ..."), which a
# bare "0 finished" would also find in "10 finished".
NO_GROUP_FINISHED = re.compile(r"(?<!\d)0 finished")
# The control must still be waiting this long past the point where the watch stopped the stalled run.
CONTROL_GRACE_S = 15

pytestmark = pytest.mark.timeout(600)


def _assert_nothing_left(run_dir: str, shm_before: dict) -> None:
    """Once the run has ended, no process of it is alive and it left nothing in /dev/shm."""
    assert processes_left(run_dir) == 0, f"a process of {run_dir} is still alive"
    assert not (left := shm_left_since(shm_before)), left


def test_the_stall_watch_stops_a_run_whose_engine_stalled_or_died(tmp_path, tiny_model_path, ray_cluster, tail_of):
    # One run at a time: runs that wait forever hold their share of the shared cluster, and the control must not
    # keep a watched run from being placed.
    durations = {}
    # the killed server's run has a watch of 10 minutes: a dead replica is found by the watch's look at the actors
    # (at the first failed group, and every 5 s of any wait), not by the timeout
    cases = (("stalled", "stall", "its server answers", STALL_TIMEOUT_S),
             ("killed", "kill", "its server is dead", DEAD_REPLICA_TIMEOUT_S))  # fmt: skip
    for name, fault, replica_says, timeout_s in cases:
        shm_before = shm_files()
        started = time.monotonic()
        process, log_path = start_faulted_run(str(tmp_path / name), tiny_model_path, ray_cluster, MODE, fault,
                                              stall_timeout_s=timeout_s, steps=2)  # fmt: skip
        try:
            rc = process.wait(timeout=420)
        finally:
            stop_process_group(process, grace_s=30.0)
        durations[name] = time.monotonic() - started
        log = open(log_path, errors="replace").read()
        assert rc != 0, tail_of(log_path)
        assert "while the trainer waited for 2 prompt groups of step 1" in log, tail_of(log_path)
        assert NO_GROUP_FINISHED.search(log) and f"replica 0: {replica_says}" in log, tail_of(log_path)
        if fault == "stall":  # the timeout decides
            assert f"{MODE}: the sampler made no progress for" in log, tail_of(log_path)
            assert f"trainer.v1.{MODE}.stall_timeout_s" in log
        else:  # the look at the actors decides, seconds after its first failed group, not the 10-minute timeout
            assert f"{MODE}: an actor of the sampler's died while the trainer waited" in log, tail_of(log_path)
            assert int(re.search(r"the last progress (\d+) s ago", log).group(1)) < 30
            assert "Rollout replica 0 died" in log and durations[name] < DEAD_REPLICA_TIMEOUT_S / 2
        _assert_nothing_left(str(tmp_path / name), shm_before)
    # the control: without the watch the same stall is waited on forever. It started as the stalled run did, so
    # after that run's whole life and CONTROL_GRACE_S more it has waited CONTROL_GRACE_S past the watch's timeout.
    control, control_log = start_faulted_run(str(tmp_path / "control"), tiny_model_path, ray_cluster, MODE, "stall",
                                             stall_timeout_s=None, steps=2)  # fmt: skip
    try:
        time.sleep(durations["stalled"] + CONTROL_GRACE_S)
        assert control.poll() is None, tail_of(control_log)
        assert "made no progress" not in open(control_log, errors="replace").read()
        trained = [s for s in read_steps(str(tmp_path / "control")) if "timing_s/step" in s["data"]]
        assert not trained, "the control trained a step through a stalled engine"
    finally:
        stop_process_group(control, grace_s=30.0)
    _assert_nothing_left(str(tmp_path / "control"), shm_before)
    print(f"stopped after {durations['stalled']:.0f} s (stalled) and {durations['killed']:.0f} s (killed); the "
          f"control was still waiting {CONTROL_GRACE_S} s past the watch's timeout")  # fmt: skip


def test_the_none_finished_pattern_is_not_fooled_by_ten():
    """The control for NO_GROUP_FINISHED: the bare substring it replaced matched a run where groups finished."""
    held = "TransferQueue holds 0 pending, 2 running, {} finished and 0 failed groups"
    assert NO_GROUP_FINISHED.search(held.format(0))
    assert not NO_GROUP_FINISHED.search(held.format(10)) and "0 finished" in held.format(10)
