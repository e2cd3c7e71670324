"""A watchdog for the trainer's wait on the sampler: no progress for ``stall_timeout_s``, a dead actor, or prompt
groups failing round after round stop the run, diagnosed.

While the trainer waits for finished prompt groups, the replay buffer re-reads TransferQueue every poll. Progress is
what the sampler produces: a group finished, or one more sample stored. A rollout engine that stops making
progress without dying (a paused engine, a request stuck in it) produces nothing, and verl's buffer waits forever;
an actor that died (a rollout server or its engine, a reward worker) fails every request routed to it, and verl's
buffer evicts each failed group and submits another, round after round, for ever and at full speed. The watch
turns each into one error naming what the trainer waited for, what TransferQueue holds, and how each of the
sampler's actors answers:

* no progress for ``timeout_s`` (default 30 min): the sampler is stuck;
* every ``check_every_s`` of waiting, progress or not, and at once when a group fails, the watch asks whether one
  of the sampler's actors is dead, and stops the run if so. A dead actor among live ones (one reward worker of
  eight) still lets groups finish, so the look cannot wait for a stall;
* ``max_failed_in_a_row`` groups failed with none finished in between: whatever fails them (a reward function
  that raises on every sample, an engine that rejects every request) will not stop by itself, and each round
  burns the CPU the rest of the run needs.

With ``timeout_s=None`` the watch does nothing at all (verl's own behaviour: wait for ever).
"""

from __future__ import annotations

import time
from typing import Callable, Hashable, Optional


class SamplerStalledError(RuntimeError):
    """The sampler made no progress for ``stall_timeout_s``, an actor it needs died, or its groups kept failing."""


DEAD_ACTOR_CHECK_EVERY_S = 5.0
# After a group failed the watch looks at the actors at once, but no more often than this: groups fail by the dozen a
# second once an actor is dead.
CHECK_AFTER_FAILURE_EVERY_S = 1.0
# (seconds the sampler went without progress, whether an actor was found dead) -> the error's text
Describe = Callable[[float, bool], str]


class StallWatch:
    def __init__(self, timeout_s: Optional[float], clock: Callable[[], float] = time.monotonic,
                 check_every_s: float = DEAD_ACTOR_CHECK_EVERY_S,
                 max_failed_in_a_row: Optional[int] = None):  # fmt: skip
        self.timeout_s = timeout_s
        self.check_every_s = check_every_s
        self.max_failed_in_a_row = max_failed_in_a_row
        self._clock = clock
        self._signature: Optional[Hashable] = None
        self._since = 0.0
        # the last look at the actors; kept across waits, so that a trainer waiting often looks no more often
        self._checked = float("-inf")
        self.failed_in_a_row = 0  # groups failed since the last one finished (across waits)

    def start(self) -> None:
        """A new wait begins: progress is measured from now."""
        self._signature, self._since = None, self._clock()

    def observe(self, signature: Hashable, describe: Describe, found_dead: Optional[Callable[[], bool]] = None) -> None:
        """One poll's view of the sampler; raise :class:`SamplerStalledError` once it has not changed for
        ``timeout_s`` (``describe(seconds without progress, False)``), or once ``found_dead()`` says an actor it
        needs is dead (asked every ``check_every_s`` of waiting, whether or not the sampler progressed;
        ``describe(seconds, True)``)."""
        if self.timeout_s is None:
            return
        now = self._clock()
        if signature != self._signature:
            self._signature, self._since = signature, now
        elif now - self._since >= self.timeout_s:
            raise SamplerStalledError(describe(now - self._since, False))
        self._look(found_dead, describe, every_s=self.check_every_s)

    def group_finished(self) -> None:
        """A group finished: the groups that failed before it were not failing in a row."""
        self.failed_in_a_row = 0

    def groups_failed(self, count: int, describe: Describe, describe_failures: Callable[[int], str],
                      found_dead: Optional[Callable[[], bool]] = None) -> None:  # fmt: skip
        """``count`` groups failed (verl's buffer evicts and replaces them): raise once ``max_failed_in_a_row`` have
        failed with none finished in between (``describe_failures(count in a row)``), or once ``found_dead()``,
        asked at once (at most every ``CHECK_AFTER_FAILURE_EVERY_S``), says an actor is dead."""
        if self.timeout_s is None or count <= 0:
            return
        self.failed_in_a_row += count
        if self.max_failed_in_a_row is not None and self.failed_in_a_row >= self.max_failed_in_a_row:
            raise SamplerStalledError(describe_failures(self.failed_in_a_row))
        self._look(found_dead, describe, every_s=CHECK_AFTER_FAILURE_EVERY_S)

    def _look(self, found_dead: Optional[Callable[[], bool]], describe: Describe, every_s: float) -> None:
        now = self._clock()
        if found_dead is None or now - self._checked < every_s:
            return
        self._checked = now
        if found_dead():
            raise SamplerStalledError(describe(now - self._since, True))
