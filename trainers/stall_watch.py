"""A watchdog for the trainer's wait on the sampler: no progress for ``stall_timeout_s`` stops the run, diagnosed.

While the trainer waits for finished prompt groups, the replay buffer re-reads TransferQueue every poll. Progress is
what the sampler produces: a group finished, or one more sample stored. A rollout engine that stops making
progress without dying (a paused engine, a request stuck in it) produces nothing, and verl's buffer waits forever;
one that died fails every request, and verl's buffer evicts each failed group and submits another, round after
round. The watch turns either into one error naming what the trainer waited for, what TransferQueue holds, and how
each rollout replica answers.
"""

from __future__ import annotations

import time
from typing import Callable, Hashable, Optional


class SamplerStalledError(RuntimeError):
    """The sampler made no progress for ``stall_timeout_s`` while the trainer waited for it."""


class StallWatch:
    def __init__(self, timeout_s: Optional[float], clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self._clock = clock
        self._signature: Optional[Hashable] = None
        self._since = 0.0

    def start(self) -> None:
        """A new wait begins: progress is measured from now."""
        self._signature, self._since = None, self._clock()

    def observe(self, signature: Hashable, describe: Callable[[float], str]) -> None:
        """One poll's view of the sampler; raise :class:`SamplerStalledError` (``describe(seconds)``) once it has
        not changed for ``timeout_s``."""
        now = self._clock()
        if signature != self._signature:
            self._signature, self._since = signature, now
            return
        stalled_s = now - self._since
        if self.timeout_s is not None and stalled_s >= self.timeout_s:
            raise SamplerStalledError(describe(stalled_s))
