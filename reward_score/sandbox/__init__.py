"""The sandbox that runs model-written programs: bubblewrap namespaces, a dropped uid, rlimits, and a warm
runner that forks once per test. See :mod:`.isolation` for what the program can see and :mod:`.runner` for
what runs inside."""

from .config import ALLOW_UNISOLATED_ENV, SandboxConfig
from .isolation import SandboxUnavailable, probe_bwrap, require_isolation
from .session import DeadlineExceeded, RunnerDied, SandboxError, SandboxSession, TestRun

__all__ = [
    "ALLOW_UNISOLATED_ENV",
    "DeadlineExceeded",
    "RunnerDied",
    "SandboxConfig",
    "SandboxError",
    "SandboxSession",
    "SandboxUnavailable",
    "TestRun",
    "probe_bwrap",
    "require_isolation",
]
