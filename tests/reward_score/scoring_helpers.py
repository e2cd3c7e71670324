"""Score functions for the scoring-process tests. They live in a plain module (not a test file, which pytest
imports by path) so the forkserver's processes can import them by name."""

from __future__ import annotations

import os
import signal


def die_or_echo(**kwargs):
    """A score that takes its own process down (as the kernel's OOM killer would) when asked to."""
    if kwargs.get("solution_str") == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"score": 1.0, "pid": os.getpid()}
