"""A watchdog for the trainer's wait on the sampler: no progress for ``stall_timeout_s`` stops the run, diagnosed.

While the trainer waits for finished prompt groups, the replay buffer re-reads TransferQueue every poll. Progress is
what the sampler produces: a group finished, or one more sample stored. A rollout engine that stops making
progress without dying (a paused engine, a request stuck in it) produces nothing, and verl's buffer waits forever;
one that died fails every request, and verl's buffer evicts each failed group and submits another, round after
round. The watch turns either into one error naming what the trainer waited for, what TransferQueue holds, and how
each rollout replica answers.

A dead actor does not need the whole timeout (default 30 min) to be told from a slow one: every ``check_every_s`` of a
stall the watch asks whether one of the sampler's actors is dead (a reward worker, a replica's engine process), and
stops the run at once if so.
"""

from __future__ import annotations

import time
from typing import Callable, Hashable, Optional


class SamplerStalledError(RuntimeError):
    """The sampler made no progress for ``stall_timeout_s`` while the trainer waited for it."""


DEAD_ACTOR_CHECK_EVERY_S = 5.0


class StallWatch:
    def __init__(self, timeout_s: Optional[float], clock: Callable[[], float] = time.monotonic,
                 check_every_s: float = DEAD_ACTOR_CHECK_EVERY_S):  # fmt: skip
        self.timeout_s = timeout_s
        self.check_every_s = check_every_s
        self._clock = clock
        self._signature: Optional[Hashable] = None
        self._since = self._checked = 0.0

    def start(self) -> None:
        """A new wait begins: progress is measured from now."""
        self._signature, self._since = None, self._clock()
        self._checked = self._since

    def observe(self, signature: Hashable, describe: Callable[[float], str],
                found_dead: Optional[Callable[[], bool]] = None) -> None:  # fmt: skip
        """One poll's view of the sampler; raise :class:`SamplerStalledError` (``describe(seconds)``) once it has
        not changed for ``timeout_s``, or sooner once ``found_dead()`` says an actor it needs is dead (asked every
        ``check_every_s`` of the stall)."""
        now = self._clock()
        if signature != self._signature:
            self._signature, self._since, self._checked = signature, now, now
            return
        if self.timeout_s is None:
            return
        stalled_s = now - self._since
        if stalled_s >= self.timeout_s:
            raise SamplerStalledError(describe(stalled_s))
        if found_dead is not None and now - self._checked >= self.check_every_s:
            self._checked = now
            if found_dead():
                raise SamplerStalledError(describe(stalled_s))
