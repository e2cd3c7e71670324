"""The stall watch's rule on a made-up clock, its setting's checks, and the stalled-engine fault's own behaviour
(the end-to-end case is tests/e2e/test_stalled_engine_on_cpu.py)."""

from __future__ import annotations

import asyncio

import pytest

from verl_pipe.backends.cpu.faults import AFTER_REQUESTS_ENV, FAULT_ENV, engine_fault
from verl_pipe.trainers.config import PipelineConfig, PipelineConfigError
from verl_pipe.trainers.stall_watch import SamplerStalledError, StallWatch


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_change_for_the_timeout_raises_with_the_diagnosis_and_any_change_resets_it():
    clock = Clock()
    watch = StallWatch(10.0, clock=clock)
    watch.start()
    describe = lambda seconds: f"stuck for {seconds:.0f} s"  # noqa: E731
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
    watch.observe(("a",), str)
    clock.now = 100.0  # the trainer trained meanwhile; its next wait begins now
    watch.start()
    watch.observe(("a",), str)  # the same view as before the training, seen anew
    forever = StallWatch(None, clock=clock)
    forever.start()
    forever.observe(("a",), str)
    clock.now = 1e9
    forever.observe(("a",), str)  # the control: without a timeout nothing is ever raised


def test_a_dead_actor_found_during_a_stall_stops_the_wait_long_before_the_timeout():
    clock = Clock()
    watch = StallWatch(1800.0, clock=clock, check_every_s=5.0)
    asked = []
    dead = False

    def found_dead() -> bool:
        asked.append(clock.now)
        return dead

    watch.start()
    watch.observe(("a",), str, found_dead)
    for clock.now in (2.0, 4.0, 6.0, 8.0, 10.0, 12.0):  # alive: asked every 5 s of the stall, never stopped
        watch.observe(("a",), str, found_dead)
    assert asked == [6.0, 12.0]
    clock.now = 13.0
    watch.observe(("b",), str, found_dead)  # progress: the next question waits 5 s from here
    dead = True
    clock.now = 17.0
    watch.observe(("b",), str, found_dead)
    clock.now = 18.0
    with pytest.raises(SamplerStalledError, match="^5.0$"):  # the diagnosis of a 5 s stall, not of 1800 s
        watch.observe(("b",), str, found_dead)
    # the control: without the question, the same dead actor keeps the trainer waiting to the timeout
    blind = StallWatch(1800.0, clock=clock, check_every_s=5.0)
    blind.start()
    blind.observe(("b",), str)
    clock.now = 1000.0
    blind.observe(("b",), str)


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
