"""Faults a rollout server can be made to have, for the tests and the fault-injection runs: a stalled engine.

A stalled engine stops making progress without dying: its server is up and answers, but the requests it holds
never end (a paused engine, a request stuck in it). It is injected through the servers' timing slot
(:mod:`.generation_timing`), which both the ``hf`` server and the CPU vLLM server honour, so the servers carry no
fault code: ``VERL_PIPE_GENERATION_TIMING=verl_pipe.backends.cpu.faults:stalled_engine`` with
``VERL_PIPE_STALL_AFTER_REQUESTS=N`` in every worker's environment serves each replica's first N requests
normally and holds every later one forever.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Awaitable, Callable, Sequence, TypeVar

STALL_AFTER_ENV = "VERL_PIPE_STALL_AFTER_REQUESTS"
Answer = TypeVar("Answer")


class _StalledReplica:
    def __init__(self, served_before_stall: int):
        self.left = served_before_stall

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
        await asyncio.Event().wait()  # never set: the request is held, the server's loop stays free
        raise AssertionError("unreachable")

    def abort_all(self) -> None:
        pass  # a stalled engine does not honour aborts either


class _StalledEngine:
    def __init__(self, served_before_stall: int):
        self.served_before_stall = served_before_stall

    def replica(self) -> _StalledReplica:
        return _StalledReplica(self.served_before_stall)


def stalled_engine() -> _StalledEngine:
    """The timing-slot factory: each replica serves ``VERL_PIPE_STALL_AFTER_REQUESTS`` requests, then stalls."""
    raw = os.environ.get(STALL_AFTER_ENV, "0")
    try:
        count = int(raw)
    except ValueError:
        raise ValueError(f"{STALL_AFTER_ENV}={raw!r}: expected a whole number of requests") from None
    if count < 0:
        raise ValueError(f"{STALL_AFTER_ENV}={raw!r}: expected a whole number of requests >= 0")
    return _StalledEngine(count)
