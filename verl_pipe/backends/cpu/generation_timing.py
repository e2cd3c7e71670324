"""The rollout servers' timing slot: how long a request should take when that is not how long it takes.

Empty by default: a server answers each request as soon as it is generated. A benchmark that models a GPU
cluster on the CPU backend fills it, so each request lasts as long as on the modelled replica, given everything
else that replica runs (the tokens are real, the time is modelled). The ``hf`` server and the CPU vLLM server
both honour it.

The slot is filled by naming a factory in the environment, ``VERL_PIPE_GENERATION_TIMING=package.module:factory``,
not by setting it in memory: rollout servers run in Ray worker processes, which inherit the job's environment
(``ray_kwargs.ray_init.runtime_env.env_vars``) and nothing else. The factory is imported by that name only, so
this backend depends on no module that fills the slot.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Awaitable, Callable, Optional, Protocol, Sequence, TypeVar

GENERATION_TIMING_ENV = "VERL_PIPE_GENERATION_TIMING"
Answer = TypeVar("Answer")


class ReplicaTiming(Protocol):
    """The timing of one server's replica: every request it serves goes through ``serve``."""

    async def serve(
        self,
        prompt_ids: Sequence[int],
        generate: Callable[[], Awaitable[Answer]],
        aborted: Callable[[Answer], bool],
        cut: Callable[[Answer, float], Answer],
    ) -> tuple[Answer, dict[str, Any]]:
        """Run ``generate`` (the server's real generation) and return its answer when the timing says the request
        ends, with extra fields to report (``TokenOutput.extra_fields``). ``aborted(answer)``: the server cut its
        own generation; ``cut(answer, share)``: the answer cut to a share of its tokens and marked aborted (what a
        request ended by :meth:`abort_all` returns)."""
        ...

    def abort_all(self) -> None:
        """A weight sync aborts the replica's requests: end each where it has got to."""
        ...

    def weights_loaded(self, version: int, in_flight: bool) -> None:
        """Optional: the replica now serves policy ``version``. ``in_flight``: loaded between decode steps without
        aborting, so running requests go on under it after a stall (the weight transfer); otherwise a sync that
        aborted them (:meth:`abort_all`) came first and the resumed requests run under it. A timing that models
        versions reports them in ``serve``'s extra fields. Timings may leave it out: callers look it up with
        ``getattr(timing, "weights_loaded", None)`` and skip it when absent."""
        ...


class GenerationTiming(Protocol):
    def replica(self) -> ReplicaTiming:
        """A fresh timing state for one server's replica."""
        ...


_LOADED: tuple[Optional[str], Optional[Callable[[], Optional[GenerationTiming]]]] = (None, None)


def generation_timing() -> Optional[GenerationTiming]:
    """The timing the environment names (its factory called now: it may return None), or None if it names none."""
    global _LOADED
    spec = os.environ.get(GENERATION_TIMING_ENV) or None
    if spec is None:
        return None
    if spec != _LOADED[0]:
        module_name, _, factory_name = spec.partition(":")
        if not module_name or not factory_name:
            raise ValueError(f"{GENERATION_TIMING_ENV}={spec!r}: expected 'package.module:factory'")
        _LOADED = (spec, getattr(importlib.import_module(module_name), factory_name))
    return _LOADED[1]()

