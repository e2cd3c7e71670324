"""Score samples in processes of their own, so a scoring process that dies costs only its own sample.

The host side of one code score is small (a sandbox is its own process tree, with its own limits), but it runs
in the reward worker, a Ray actor: if the kernel's OOM killer (or anything else) took the actor down mid-sample,
verl's agent loop would lose every sample routed to it and the step with them. Here each concurrency slot is a
long-lived child process (:mod:`.scoring_child`) that has the reward module loaded and scores one sample at a time,
sent and answered as length-prefixed pickles over its stdin and stdout. A slot whose process dies is replaced and
the sample is reported as :class:`ScoringProcessDied`; the manager retries it once, then gives it
``internal_error``. A sample that outlives its deadline has its process killed, so a stuck score never holds a
slot.

Plain pipes, not ``multiprocessing``: a pool's queues are named semaphores in /dev/shm, which are left there for
good when Ray SIGKILLs the reward worker (as it does at the end of every job) before anything can unlink them. A
child whose parent dies reads the end of its stdin and exits.

The scoring processes are the first the OOM killer picks (``oom_score_adj`` 1000, like the sandboxes), so under
memory pressure it takes a sample, not the worker. They start with the manager, in the background, so the first
sample does not wait for the reward module's import.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

CHILD_MODULE = "verl_pipe.reward_manager.scoring_child"
HEADER_BYTES = 8  # each message: its length, little-endian, then its pickle


class ScoringProcessDied(RuntimeError):
    """The process scoring this sample died (killed, out of memory); the sample may be tried again."""


def write_message(stream, payload: bytes) -> None:
    stream.write(len(payload).to_bytes(HEADER_BYTES, "little") + payload)
    stream.flush()


def read_message(stream) -> Optional[bytes]:
    """One message; None at the end of the stream (the other side is gone)."""
    header = _read_exactly(stream, HEADER_BYTES)
    if header is None:
        return None
    return _read_exactly(stream, int.from_bytes(header, "little"))


def _read_exactly(stream, size: int) -> Optional[bytes]:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _Child:
    """One scoring process: ``python -m verl_pipe.reward_manager.scoring_child``, seeing this process's imports."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.process = subprocess.Popen([sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env, close_fds=True)  # fmt: skip

    def exchange(self, request: bytes) -> bytes:
        """Send one sample, wait for its answer; raise :class:`ScoringProcessDied` if the process ends first."""
        try:
            write_message(self.process.stdin, request)
            answer = read_message(self.process.stdout)
        except (BrokenPipeError, ValueError, OSError):  # ValueError: a pipe closed by kill() meanwhile
            answer = None
        if answer is None:
            raise ScoringProcessDied("the scoring process died while scoring this sample")
        return answer

    def kill(self) -> None:
        try:
            self.process.kill()
        except OSError:
            pass
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class _Slot:
    """A concurrency slot: its child, replaced when it dies or is killed."""

    def __init__(self):
        self.child: Optional[_Child] = None
        self.lock = threading.Lock()  # the start-up thread and a first sample may both ask for the child

    def ready_child(self) -> _Child:
        with self.lock:
            if self.child is None or self.child.process.poll() is not None:
                if self.child is not None:
                    self.child.kill()
                self.child = _Child()
            return self.child

    def drop_child(self) -> None:
        with self.lock:
            child, self.child = self.child, None
        if child is not None:
            child.kill()


class ScoringProcesses:
    """``slots`` scoring processes; :meth:`score` runs ``score_fn(**kwargs)`` in a free one. ``score_fn`` travels
    by pickle, so it must be importable by name (a module-level function, or a partial of one)."""

    def __init__(self, score_fn: Callable[..., Any], slots: int):
        self.score_fn = score_fn
        self.slots = [_Slot() for _ in range(slots)]
        self.free: asyncio.Queue[_Slot] = asyncio.Queue()
        # One thread per slot waits on its child's pipe, off the worker's event loop.
        self.threads = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="vp-scoring")
        for slot in self.slots:
            self.free.put_nowait(slot)
            self.threads.submit(slot.ready_child)  # start now: the import overlaps the rest of start-up

    async def score(self, kwargs: dict[str, Any]) -> Any:
        request = pickle.dumps((self.score_fn, kwargs))  # before taking a slot: a sample that cannot travel keeps none
        slot = await self.free.get()
        try:
            loop = asyncio.get_running_loop()
            answer = await loop.run_in_executor(self.threads, lambda: slot.ready_child().exchange(request))
        except ScoringProcessDied:
            slot.drop_child()
            raise
        except asyncio.CancelledError:
            # Cancelled at the sample deadline (asyncio.wait_for): the process may still be busy; replace it.
            slot.drop_child()
            raise
        finally:
            self.free.put_nowait(slot)
        status, value = pickle.loads(answer)
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        for slot in self.slots:
            slot.drop_child()
        self.threads.shutdown(wait=False, cancel_futures=True)
