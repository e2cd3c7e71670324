"""The ``hf`` rollout server's timing slot: how long a request should take when that is not how long it takes.

Empty by default: the server answers each request as soon as it is generated. A benchmark that models a GPU
cluster on the CPU backend fills it, so each request lasts as long as on the modelled replica (the tokens are
real, the time is modelled).

The slot is filled by naming a factory in the environment, ``VERL_PIPE_GENERATION_TIMING=package.module:factory``,
not by setting it in memory: rollout servers run in Ray worker processes, which inherit the job's environment
(``ray_kwargs.ray_init.runtime_env.env_vars``) and nothing else. The factory is imported by that name only, so
this backend depends on no module that fills the slot.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable, NamedTuple, Optional, Protocol, Sequence

GENERATION_TIMING_ENV = "VERL_PIPE_GENERATION_TIMING"


class RequestTiming(NamedTuple):
    wall_s: float  # from the moment the request gets a slot to its answer
    extra_fields: dict[str, Any]  # reported with the answer (``TokenOutput.extra_fields``)


class GenerationTiming(Protocol):
    # Requests one replica serves at once; the rest wait for a slot, as on a saturated GPU replica.
    replica_concurrency: int

    def request_timing(self, prompt_ids: Sequence[int], sample_index: int) -> RequestTiming:
        """Timing of the ``sample_index``-th request (0, 1, ...) this replica serves for ``prompt_ids``."""
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
