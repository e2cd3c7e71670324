"""The stall watch's rule on a made-up clock, its setting's checks, and the stalled-engine fault's own behaviour
(the end-to-end case is tests/e2e/test_stalled_engine_on_cpu.py)."""

from __future__ import annotations

import asyncio

import pytest

from verl_pipe.backends.cpu.faults import AFTER_REQUESTS_ENV, FAULT_ENV, engine_fault
from verl_pipe.trainers.config import PipelineConfig, PipelineConfigError
from verl_pipe.trainers.stall_watch import SamplerStalledError, StallWatch


def since_progress(seconds: float, dead: bool) -> str:
    return f"{'dead' if dead else 'stalled'}, {seconds:.0f} s since progress"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_change_for_the_timeout_raises_with_the_diagnosis_and_any_change_resets_it():
    clock = Clock()
    watch = StallWatch(10.0, clock=clock)
    watch.start()
    describe = lambda seconds, dead: f"stuck for {seconds:.0f} s"  # noqa: E731
    watch.observe(("a",), describe)
    clock.now = 9.0
    watch.observe(("a",), describe)  # 9 s without change: not yet
    clock.now = 9.5
    watch.observe(("b",), describe)  # progress: the clock restarts here
    clock.now = 19.0
    watch.observe(("b",), describe)
    clock.now = 19.5
    with pytest.raises(SamplerStalledError, match="stuck for 10 s"):
        watch.observe(("b",), describe)


def test_a_new_wait_starts_afresh_and_none_waits_forever():
    clock = Clock()
    watch = StallWatch(10.0, clock=clock)
    watch.start()
    watch.observe(("a",), since_progress)
    clock.now = 100.0  # the trainer trained meanwhile; its next wait begins now
    watch.start()
    watch.observe(("a",), since_progress)  # the same view as before the training, seen anew
    forever = StallWatch(None, clock=clock)
    forever.start()
    forever.observe(("a",), since_progress)
    clock.now = 1e9
    forever.observe(("a",), since_progress)  # the control: without a timeout nothing is ever raised


def test_a_dead_actor_is_looked_for_every_few_seconds_of_waiting_progress_or_not():
    """One reward worker of several dead still lets groups finish, and a group being cleared flickers in
    TransferQueue's listing: the look cannot wait for a stall (``make chaos --faults reward_kill`` hung there)."""
    clock = Clock()
    watch = StallWatch(1800.0, clock=clock, check_every_s=5.0)
    asked = []
    dead = False

    def found_dead() -> bool:
        asked.append(clock.now)
        return dead

    watch.start()
    for step, clock.now in enumerate((0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0)):  # progress at every poll
        watch.observe((step,), since_progress, found_dead)
    assert asked == [0.0, 6.0, 12.0]  # alive: asked every 5 s, never stopped
    dead = True
    clock.now = 13.0
    watch.start()  # the next wait: the look keeps its own clock across waits
    watch.observe(("b",), since_progress, found_dead)
    clock.now = 17.0
    with pytest.raises(SamplerStalledError, match="^dead, 0 s since progress$"):
        watch.observe(("c",), since_progress, found_dead)
    # the control: without the look, the same dead actor behind a changing view is never found
    blind = StallWatch(1800.0, clock=clock, check_every_s=5.0)
    blind.start()
    for step in range(100):
        clock.now += 1.0
        blind.observe((step,), since_progress)
    # and with the watch off, nothing is asked at all (verl's own behaviour)
    off, asked[:] = StallWatch(None, clock=clock, check_every_s=5.0), []
    off.start()
    off.observe(("a",), since_progress, found_dead)
    off.groups_failed(1000, since_progress, str, found_dead)
    assert asked == []


def test_a_failed_group_looks_at_the_actors_at_once_and_failures_in_a_row_are_bounded():
    clock = Clock()
    watch = StallWatch(1800.0, clock=clock, check_every_s=5.0, max_failed_in_a_row=10)
    asked = []
    watch.start()
    watch.observe(("a",), since_progress, lambda: asked.append(clock.now) or False)  # looked at t=0
    clock.now = 1.5
    watch.groups_failed(2, since_progress, lambda n: f"{n} failed", lambda: asked.append(clock.now) or False)
    clock.now = 1.6  # another failure within the second: not asked again
    watch.groups_failed(2, since_progress, lambda n: f"{n} failed", lambda: asked.append(clock.now) or False)
    assert asked == [0.0, 1.5] and watch.failed_in_a_row == 4
    watch.group_finished()  # a group finished: the failures before it were not in a row
    clock.now = 1.7
    watch.groups_failed(9, since_progress, lambda n: f"{n} failed")
    with pytest.raises(SamplerStalledError, match="^10 failed$"):
        watch.groups_failed(1, since_progress, lambda n: f"{n} failed")
    # a dead actor found at the first failure stops the wait there
    dead = StallWatch(1800.0, clock=clock, check_every_s=5.0, max_failed_in_a_row=None)
    dead.start()
    clock.now = 3.0
    with pytest.raises(SamplerStalledError, match="^dead, 1 s since progress$"):
        dead.groups_failed(1, since_progress, str, lambda: True)
    # the control: no bound and no look, and groups fail for ever
    endless = StallWatch(1800.0, clock=clock, max_failed_in_a_row=None)
    endless.start()
    for _ in range(10_000):
        endless.groups_failed(1, since_progress, str)


@pytest.mark.parametrize("value", [0, -1, "soon", True, 2.5])
def test_a_bad_failure_bound_names_the_key(value):
    with pytest.raises(PipelineConfigError, match=r"trainer\.v1\.in_flight_pipeline\.max_failed_groups_in_a_row"):
        PipelineConfig.from_section("in_flight_pipeline", {"max_failed_groups_in_a_row": value})
    assert PipelineConfig.from_section("in_flight_pipeline", {"max_failed_groups_in_a_row": None}) \
        .max_failed_groups_in_a_row is None


@pytest.mark.parametrize("value", [0, -1, "soon", True])
def test_a_bad_stall_timeout_names_the_key(value):
    with pytest.raises(PipelineConfigError, match=r"trainer\.v1\.one_off_pipeline\.stall_timeout_s"):
        PipelineConfig.from_section("one_off_pipeline", {"stall_timeout_s": value})
    assert PipelineConfig.from_section("one_off_pipeline", {"stall_timeout_s": None}).stall_timeout_s is None


def test_the_stalled_engine_serves_its_first_requests_then_holds_every_later_one(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "stall")
    monkeypatch.setenv(AFTER_REQUESTS_ENV, "1")
    replica = engine_fault().replica()

    async def generate():
        return "answer"

    async def serve():
        first = await replica.serve([1], generate, aborted=lambda a: False, cut=lambda a, s: a)
        with pytest.raises(asyncio.TimeoutError):  # held: it never returns
            await asyncio.wait_for(replica.serve([1], generate, aborted=lambda a: False, cut=lambda a, s: a), 0.2)
        return first

    assert asyncio.run(serve()) == ("answer", {})
    monkeypatch.setenv(AFTER_REQUESTS_ENV, "many")
    with pytest.raises(ValueError, match=AFTER_REQUESTS_ENV):
        engine_fault()
    monkeypatch.setenv(FAULT_ENV, "melt")
    with pytest.raises(ValueError, match="expected one of stall, kill"):
        engine_fault()
