"""Shared-memory segments a verl job leaves behind on the host.

verl's weight senders put each bucket in a named segment (``/dev/shm/psm_*`` on the hf path, ``verl_weights_*`` on
vLLM's) and unlink it when they close; a process that is SIGKILLed, or ended by Ray at the end of a job, never
closes it, and each such run would leave hundreds of MB in /dev/shm (RAM) until the machine restarts.

A segment is an orphan when no live process maps it or holds it open: its creator and every reader are gone, and
nothing can attach to it by name any more except by accident. Only orphans that appeared while the job ran are
removed, so a concurrent job's segments (mapped by its live processes) and anything older are never touched.
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import logging
import os
import time
from typing import Iterator

logger = logging.getLogger("verl_pipe")

SHM_DIR = "/dev/shm"
# verl's weight buckets (hf path: Python's SharedMemory default names; vLLM path: verl's own prefix), vLLM's
# shared-memory broadcast buffers (SharedMemory, psm_*), and the named semaphores of multiprocessing's spawn
# context (vLLM's, left when their process is SIGKILLed; mapped by every process that uses them).
LEAKABLE_SEGMENTS = ("psm_*", "verl_weights_*", "sem.mp-*")
# How long a segment must stay unheld to count as an orphan (a live owner unlinks within microseconds of closing).
ORPHAN_SETTLE_S = 0.5


def leakable_segments(patterns: tuple[str, ...] = LEAKABLE_SEGMENTS) -> set[str]:
    """Paths of the /dev/shm entries a verl job may leave behind."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return set()
    return {os.path.join(SHM_DIR, n) for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)}


def segments_in_use(paths: set[str]) -> set[str]:
    """Those of ``paths`` that a live process maps or holds open (read from /proc; a process whose tables cannot
    be read cannot map our segments either: they are created 0600, for their user only)."""
    in_use: set[str] = set()
    if not paths:
        return in_use
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    fields = line.rstrip("\n").split(maxsplit=5)  # address perms offset dev inode [path]
                    if len(fields) == 6 and fields[5] in paths:
                        in_use.add(fields[5])
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target in paths:
                        in_use.add(target)
        if in_use == paths:
            break
    return in_use


def remove_orphaned_segments(before: set[str], wait_s: float = 10.0) -> list[str]:
    """Remove the segments that appeared since ``before`` (:func:`leakable_segments`) and that no live process maps
    or holds. Ones still in use are waited on for up to ``wait_s`` (a job's processes take a moment to die after
    its driver goes), then left to their holders. Returns the paths removed."""
    deadline = time.monotonic() + wait_s
    removed: list[str] = []
    while True:
        new = leakable_segments() - before
        in_use = segments_in_use(new)
        unheld = new - in_use
        if unheld:
            # an owner closes its segment a moment before it unlinks it (SharedMemory.close, then .unlink): only
            # what is still there, and still unheld, a moment later is an orphan
            time.sleep(ORPHAN_SETTLE_S)
            unheld = (unheld & leakable_segments()) - segments_in_use(unheld)
        for path in sorted(unheld):
            with contextlib.suppress(FileNotFoundError):
                size = os.stat(path).st_size
                os.unlink(path)
                removed.append(path)
                logger.info("removed %s (%.0f MiB): its processes are gone without unlinking it", path, size / 2**20)
        if not in_use or time.monotonic() >= deadline:
            return removed
        time.sleep(0.5)


@contextlib.contextmanager
def removing_orphaned_segments(wait_s: float = 10.0) -> Iterator[None]:
    """Around a whole verl job (a subprocess): once it is over, however it ended, remove the orphans it left."""
    before = leakable_segments()
    try:
        yield
    finally:
        remove_orphaned_segments(before, wait_s)


def remove_orphans_at_exit(wait_s: float = 10.0) -> None:
    """In a job's driver, before its Ray work starts: at interpreter exit, disconnect from Ray (which ends the job's
    actors, as it would a moment later anyway) and remove the orphans the job left.

    Registered after ``import ray``, so it runs before Ray's own exit hook, whose shutdown is then a no-op."""
    before = leakable_segments()

    def at_exit() -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.shutdown()
        removed = remove_orphaned_segments(before, wait_s)
        if removed:
            print(f"verl-pipe: removed {len(removed)} shared-memory segment(s) this run's killed processes left in "
                  f"{SHM_DIR}", flush=True)  # fmt: skip

    atexit.register(at_exit)
