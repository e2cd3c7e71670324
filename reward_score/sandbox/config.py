"""Limits of one sandboxed program, as a typed config with the defaults the code reward uses."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

# Set to 1 to accept running programs without namespace isolation when bubblewrap cannot work (logged loudly).
ALLOW_UNISOLATED_ENV = "VERL_PIPE_SANDBOX_ALLOW_UNISOLATED"
# Set to 0 to run sandboxes without a cgroup of their own (rlimits only; see sandbox.cgroups).
CGROUPS_ENV = "VERL_PIPE_SANDBOX_CGROUPS"
# What one sandbox's cgroup may hold on top of one test process's address space and the full tmpfs: the runner,
# bubblewrap, page cache and kernel memory (inodes, dentries, page tables).
CGROUP_MEMORY_SLACK_MB = 256


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
    # One cgroup per sandbox where the host allows it (see sandbox.cgroups): an equal CPU share, this cap in
    # cores (None: no cap), a memory limit over everything the sandbox holds (kernel memory, tmpfs and memfd
    # pages included; None: memory_mb + tmpfs_mb + CGROUP_MEMORY_SLACK_MB) and a task limit.
    use_cgroups: bool = True
    cgroup_memory_mb: int | None = None
    cpu_cap_cores: float | None = 1.0
    # The seccomp filter (sandbox.seccomp): kernel keyrings, file-activity notification, new namespaces, process
    # inspection and other calls no graded program needs are denied. Off only to show what it prevents.
    seccomp: bool = True
    # Hide /proc/sys and the pty multiplexer (/dev/pts, so /dev/ptmx leads nowhere): global counters there
    # (open ptys, open files, inodes) are the same in every sandbox, and a sample can move one that another reads.
    # Off only to show what it prevents.
    hide_global_counters: bool = True

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
        for key in ("use_cgroups", "seccomp", "hide_global_counters"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"sandbox.{key} must be true or false, got {getattr(self, key)!r}")
        memory = self.cgroup_memory_mb
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or memory < 64):
            raise ValueError(f"sandbox.cgroup_memory_mb must be an integer >= 64 (MiB) or null, got {memory!r}")
        cap = self.cpu_cap_cores
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap < 0.01
        ):
            raise ValueError(f"sandbox.cpu_cap_cores must be at least 0.01 (cores) or null for no cap, got {cap!r}")

    @property
    def cgroup_memory_bytes(self) -> int:
        """The sandbox cgroup's memory limit (everything its processes hold, kernel memory included)."""
        if self.cgroup_memory_mb is not None:
            return self.cgroup_memory_mb << 20
        return (self.memory_mb + self.tmpfs_mb + CGROUP_MEMORY_SLACK_MB) << 20

    @property
    def cgroup_pids_max(self) -> int:
        """Tasks (threads included) in one sandbox's cgroup: the candidate's RLIMIT_NPROC plus room for
        bubblewrap, the runner and an assert suite's tests process, whatever uid each runs as."""
        return self.max_processes + 16

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
