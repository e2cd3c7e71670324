"""Runs that several tests read, made at most once per session, whether they succeed or fail.

A shared run is a verl job of a minute or more. Caching only its result meant that a run which failed (or hit its
timeout) was started again by every test that reads it: ten consumers of a broken run cost ten failed runs of up
to ten minutes each, and CI's 90-minute limit stopped the suite before its summary (2026-12-02). Here a failure is
cached too: the first consumer fails with the run's error, every later one fails at once, naming the run and
what the first one saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable

import pytest

# How much of the first failure's message every later consumer repeats.
FAILURE_EXCERPT_CHARS = 2000


@dataclass(frozen=True)
class FailedRun:
    key: Hashable
    error: str  # the exception's type and message, as the first consumer saw it


class SharedRuns:
    """``get(key, make)``: ``make()``'s result for ``key``, made once per session (its failure too)."""

    def __init__(self, name: str):
        self.name = name
        self._outcomes: dict[Hashable, Any] = {}

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        if key in self._outcomes:
            outcome = self._outcomes[key]
            if isinstance(outcome, FailedRun):
                pytest.fail(
                    f"the shared {self.name} run {key!r} failed earlier in this session and is not run again; "
                    f"its error:\n{outcome.error[-FAILURE_EXCERPT_CHARS:]}",
                    pytrace=False,
                )
            return outcome
        try:
            result = make()
        except KeyboardInterrupt:
            raise
        # BaseException: pytest.fail and pytest-timeout's timeout are OutcomeExceptions, not Exceptions
        except BaseException as error:
            self._outcomes[key] = FailedRun(key, f"{type(error).__name__}: {error}")
            raise
        self._outcomes[key] = result
        return result
