"""What the scoring processes leave behind when their reward worker is killed: nothing.

Ray ends a job by SIGKILLing its actors and their child processes, so no cleanup of the reward worker ever runs. A
``multiprocessing`` pool's queues are named semaphores in /dev/shm, unlinked only by such a cleanup: the control
below shows the design we had leaving them there. Ours talk over plain pipes; their children exit on their own once
the worker is gone, even when only the worker is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from verl_pipe.chaos import process_table, shm_added_since, shm_files

HELPERS = os.path.dirname(os.path.abspath(__file__))  # scoring_helpers, importable by name in the children

OURS = r"""
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
from scoring_helpers import die_or_echo
from verl_pipe.reward_manager.scoring_processes import ScoringProcesses

async def main():
    processes = ScoringProcesses(die_or_echo, slots=2)
    answers = await asyncio.gather(*(processes.score({"solution_str": "ok"}) for _ in range(2)))
    print(json.dumps(sorted({answer["pid"] for answer in answers})), flush=True)
    await asyncio.sleep(3600)  # a reward worker between steps

asyncio.run(main())
"""

MULTIPROCESSING_POOL = r"""
import json, multiprocessing, os, sys, time
sys.path.insert(0, sys.argv[1])
from concurrent.futures import ProcessPoolExecutor
from scoring_helpers import die_or_echo

if __name__ == "__main__":
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("forkserver"))
    print(json.dumps([pool.submit(die_or_echo, solution_str="ok").result()["pid"]]), flush=True)
    time.sleep(3600)
"""


def _descendants(pid: int) -> list[int]:
    table, found, frontier = process_table(), [], [pid]
    while frontier:
        children = [child for child, (parent, _) in table.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _start(script: str) -> tuple[subprocess.Popen, list[int]]:
    worker = subprocess.Popen([sys.executable, "-c", script, HELPERS], stdout=subprocess.PIPE, text=True)
    scored_in = json.loads(worker.stdout.readline())
    return worker, scored_in


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}") and process_table().get(pid) is not None]


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _alive(pids)


@pytest.mark.parametrize("kill", ["the worker alone", "the worker and its children, as Ray does"])
def test_a_killed_reward_worker_leaves_no_scoring_process_and_nothing_in_dev_shm(kill):
    before = shm_files()
    worker, scored_in = _start(OURS)
    children = _descendants(worker.pid)
    assert set(scored_in) <= set(children), (scored_in, children)  # scored outside the worker, in its children
    for pid in [worker.pid] + (children if kill != "the worker alone" else []):
        os.kill(pid, signal.SIGKILL)
    worker.wait()
    assert _gone_within(children, 10), f"scoring processes outlived their worker: {_alive(children)}"
    assert shm_added_since(before) == {}


def test_control_a_multiprocessing_pool_killed_as_ray_kills_leaves_semaphores_in_dev_shm():
    before = shm_files()
    worker, _ = _start(MULTIPROCESSING_POOL)
    for pid in [worker.pid] + _descendants(worker.pid):  # the pool's process, its forkserver, its resource tracker
        os.kill(pid, signal.SIGKILL)
    worker.wait()
    time.sleep(1.0)
    left = shm_added_since(before)
    try:
        assert left and all(name.startswith("sem.") for name in left), left
    finally:
        for name in left:
            os.unlink(os.path.join("/dev/shm", name))


def test_a_sample_that_cannot_be_sent_keeps_no_slot():
    """Guards against a slot lost for good to a sample whose arguments do not pickle (the next sample would wait for
    ever on a pool of one)."""
    import asyncio
    import pickle

    sys.path.insert(0, HELPERS)
    from scoring_helpers import die_or_echo

    from verl_pipe.reward_manager.scoring_processes import ScoringProcesses

    async def scenario():
        processes = ScoringProcesses(die_or_echo, slots=1)
        try:
            with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
                await processes.score({"solution_str": lambda: None})
            return await asyncio.wait_for(processes.score({"solution_str": "ok"}), timeout=60)
        finally:
            processes.close()

    assert asyncio.run(scenario())["score"] == 1.0


def test_a_killed_fork_server_is_started_again_for_the_next_scoring_process():
    """The scoring processes come from one fork server per worker; the OOM killer (or chaos) may take it. The
    scoring processes it forked go on; the next one needed comes from a new server, and the sample lost with the dead
    scoring process is reported as died (so the manager retries it), never left waiting."""
    import asyncio

    sys.path.insert(0, HELPERS)
    from scoring_helpers import die_or_echo

    from verl_pipe.reward_manager.scoring_processes import ScoringProcessDied, ScoringProcesses

    async def scenario():
        processes = ScoringProcesses(die_or_echo, slots=1)
        try:
            first = await asyncio.wait_for(processes.score({"solution_str": "ok"}), timeout=60)
            first_server = processes.server.process
            first_server.kill()
            first_server.wait()
            again = await processes.score({"solution_str": "ok"})  # its scoring process outlives the server
            with pytest.raises(ScoringProcessDied):
                await processes.score({"solution_str": "die"})
            after = await asyncio.wait_for(processes.score({"solution_str": "ok"}), timeout=60)
            return first["pid"], again["pid"], after["pid"], processes.server.process is not first_server
        finally:
            processes.close()

    first, again, after, new_server = asyncio.run(scenario())
    assert again == first and after != first and new_server
