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
