"""Limits of one sandboxed program, as a typed config with the defaults the code reward uses."""

from __future__ import annotations

import os
from dataclasses import dataclass

# Set to 1 to accept running programs without namespace isolation when bubblewrap cannot work (logged loudly).
ALLOW_UNISOLATED_ENV = "VERL_PIPE_SANDBOX_ALLOW_UNISOLATED"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class SandboxConfig:
    """Resource limits for one program's process tree.

    Defaults follow the LiveCodeBench / DeepCoder harnesses where they state one (6 s per test); the rest are
    sized so a 2-core box runs two sandboxes at once with room to spare.
    """

    memory_mb: int = 2048  # RLIMIT_AS per test process
    output_mb: int = 32  # stdout captured per test; more is a failure (RLIMIT_FSIZE kills the writer)
    result_mb: int = 16  # encoded return value of a functional test
    max_processes: int = 64  # RLIMIT_NPROC for the whole sandbox (threads count too)
    open_files: int = 64
    tmpfs_mb: int = 256  # the private, writable /tmp (work dir included)
    startup_timeout_s: float = 20.0  # bubblewrap + interpreter start; generous for loaded machines
    allow_unisolated: bool = False
    # As root the sandbox drops to a uid of its own (RLIMIT_NPROC is not enforced for uid 0); uids are drawn
    # from [uid_base, uid_base + 2**26) so concurrent sandboxes never share one.
    uid_base: int = 200_000

    def __post_init__(self) -> None:
        for key in ("memory_mb", "output_mb", "result_mb", "max_processes", "open_files", "tmpfs_mb"):
            if getattr(self, key) <= 0:
                raise ValueError(f"sandbox.{key} must be positive, got {getattr(self, key)}")
        if self.max_processes < 4:
            raise ValueError(
                f"sandbox.max_processes must be at least 4 (runner + test + init), got {self.max_processes}"
            )
        if self.startup_timeout_s <= 0:
            raise ValueError(f"sandbox.startup_timeout_s must be positive, got {self.startup_timeout_s}")

    @classmethod
    def from_env(cls, **overrides) -> SandboxConfig:
        if "allow_unisolated" not in overrides and _env_flag(ALLOW_UNISOLATED_ENV):
            overrides["allow_unisolated"] = True
        return cls(**overrides)

    def child_limits(self, timeout_s: float) -> dict[str, int]:
        """The rlimits a test process gets (CPU one second above the wall-clock timeout, as a backstop)."""
        return {
            "memory_bytes": self.memory_mb << 20,
            "cpu_seconds": int(timeout_s) + 2,
            "file_bytes": self.output_mb << 20,
            "open_files": self.open_files,
            "output_bytes": self.output_mb << 20,
            "result_bytes": self.result_mb << 20,
        }
