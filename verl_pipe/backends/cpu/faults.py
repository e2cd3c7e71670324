"""Faults a rollout server can be made to have, for the tests and fault-injection runs: a stalled or a killed engine.

They are injected through the servers' timing slot (:mod:`.generation_timing`), which both the ``hf`` server and
the CPU vLLM server honour, so the servers carry no fault code. In every worker's environment:
``VERL_PIPE_GENERATION_TIMING=verl_pipe.backends.cpu.faults:engine_fault``, ``VERL_PIPE_ENGINE_FAULT`` one of

* ``stall``: the engine stops making progress without dying; its server is up and answers, but every request
  from then on is held forever (a paused engine, a request stuck in it);
* ``kill``: the server's process is killed (SIGKILL) in the middle of a request, as a crashed engine or a lost
  node would end it;

and ``VERL_PIPE_FAULT_AFTER_REQUESTS=N``: each replica serves its first N requests normally first.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any, Awaitable, Callable, Sequence, TypeVar

FAULT_ENV = "VERL_PIPE_ENGINE_FAULT"
AFTER_REQUESTS_ENV = "VERL_PIPE_FAULT_AFTER_REQUESTS"
FAULTS = ("stall", "kill")
Answer = TypeVar("Answer")


class _FaultyReplica:
    def __init__(self, fault: str, served_before_fault: int):
        self.fault = fault
        self.left = served_before_fault

    async def serve(
        self,
        prompt_ids: Sequence[int],
        generate: Callable[[], Awaitable[Answer]],
        aborted: Callable[[Answer], bool],
        cut: Callable[[Answer, float], Answer],
    ) -> tuple[Answer, dict[str, Any]]:
        if self.left > 0:
            self.left -= 1
            return await generate(), {}
        if self.fault == "kill":
            generating = asyncio.ensure_future(generate())  # mid-generation: the request has started
            await asyncio.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
            return await generating, {}  # never reached
        await asyncio.Event().wait()  # stall: never set; the request is held, the server's loop stays free
        raise AssertionError("unreachable")

    def abort_all(self) -> None:
        pass  # a faulty engine does not honour aborts either


class _EngineFault:
    def __init__(self, fault: str, served_before_fault: int):
        self.fault, self.served_before_fault = fault, served_before_fault

    def replica(self) -> _FaultyReplica:
        return _FaultyReplica(self.fault, self.served_before_fault)


def engine_fault() -> _EngineFault:
    """The timing-slot factory: each replica serves ``VERL_PIPE_FAULT_AFTER_REQUESTS`` requests, then has the fault
    ``VERL_PIPE_ENGINE_FAULT`` names."""
    fault = os.environ.get(FAULT_ENV, "")
    if fault not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={fault!r}: expected one of {', '.join(FAULTS)}")
    raw = os.environ.get(AFTER_REQUESTS_ENV, "0")
    try:
        count = int(raw)
    except ValueError:
        raise ValueError(f"{AFTER_REQUESTS_ENV}={raw!r}: expected a whole number of requests") from None
    if count < 0:
        raise ValueError(f"{AFTER_REQUESTS_ENV}={raw!r}: expected a whole number of requests >= 0")
    return _EngineFault(fault, count)
