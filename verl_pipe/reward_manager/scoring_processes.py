"""Score samples in processes of their own, so a scoring process that dies costs only its own sample.

The host side of one code score is small (a sandbox is its own process tree, with its own limits), but it runs
in the reward worker, a Ray actor: if the kernel's OOM killer (or anything else) took the actor down mid-sample,
verl's agent loop would lose every sample routed to it and the step with them. Here each concurrency slot has a
scoring process of its own, with the reward module loaded, that scores one sample at a time, sent and answered as
length-prefixed pickles over a socket pair. A slot whose process dies gets a new one and the sample is reported as
:class:`ScoringProcessDied`; the manager retries it once, then gives it ``internal_error``. A sample that outlives
its deadline has its process killed, so a stuck score never holds a slot.

The scoring processes are forked by one fork server per reward worker (:mod:`.scoring_child`), which imports the
reward module once (~5 s: verl's package imports torch) at the manager's start, in the background: a first or
replacement scoring process is a fork, not another import.

Sockets, not ``multiprocessing``: a pool's queues are named semaphores in /dev/shm, which are left there for good
when Ray SIGKILLs the reward worker (as it does at the end of every job) before anything can unlink them. When the
worker dies, its ends of the sockets close: the fork server and every scoring process read the end and exit.

The scoring processes are the first the OOM killer picks (``oom_score_adj`` 1000, like the sandboxes), so under
memory pressure it takes a sample, not the worker.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

CHILD_MODULE = "verl_pipe.reward_manager.scoring_child"
HEADER_BYTES = 8  # each message: its length, little-endian, then its pickle
FORK_REQUEST = b"f"  # to the fork server, with the new scoring process's socket
PID_BYTES = 4  # its answer: the pid, little-endian
KILL_WAIT_S = 10.0


class ScoringProcessDied(RuntimeError):
    """The process scoring this sample died (killed, out of memory); the sample may be tried again."""


def send_message(connection: socket.socket, payload: bytes) -> None:
    connection.sendall(len(payload).to_bytes(HEADER_BYTES, "little") + payload)


def receive_message(connection: socket.socket) -> Optional[bytes]:
    """One message; None at the end of the stream (the other side is gone)."""
    header = receive_exactly(connection, HEADER_BYTES)
    if header is None:
        return None
    return receive_exactly(connection, int.from_bytes(header, "little"))


def receive_exactly(connection: socket.socket, size: int) -> Optional[bytes]:
    chunks, left = [], size
    while left:
        chunk = connection.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _ForkServer:
    """``python -m verl_pipe.reward_manager.scoring_child``: imports the reward module, then forks scoring processes."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.process = subprocess.Popen([sys.executable, "-m", CHILD_MODULE, str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)  # fmt: skip
        theirs.close()
        self.control = ours
        self.lock = threading.Lock()  # one fork request at a time

    def fork(self) -> Optional[_Child]:
        """A new scoring process; None if the server is gone (its first request also waits for its imports)."""
        ours, theirs = socket.socketpair()
        try:
            with self.lock:
                socket.send_fds(self.control, [FORK_REQUEST], [theirs.fileno()])
                answer = receive_exactly(self.control, PID_BYTES)
        except OSError:
            answer = None
        finally:
            theirs.close()
        if answer is None:
            ours.close()
            return None
        return _Child(int.from_bytes(answer, "little"), ours)

    def close(self) -> None:
        self.control.close()  # the server reads the end of its control socket and exits
        try:
            self.process.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Child:
    """One scoring process: a child of the fork server, not of this process, so it is held by a pidfd (opened as
    soon as its pid comes back), which a later reuse of the pid cannot redirect."""

    def __init__(self, pid: int, connection: socket.socket):
        self.pid = pid
        self.connection = connection
        try:
            self.pidfd: Optional[int] = os.pidfd_open(pid)
        except ProcessLookupError:  # it died (and was reaped) already: the first exchange says so
            self.pidfd = None

    def alive(self) -> bool:
        return self.pidfd is not None and not select.select([self.pidfd], [], [], 0)[0]

    def exchange(self, request: bytes) -> bytes:
        """Send one sample, wait for its answer; raise :class:`ScoringProcessDied` if the process ends first."""
        try:
            send_message(self.connection, request)
            answer = receive_message(self.connection)
        except OSError:  # a broken pipe, or a socket closed by kill() meanwhile
            answer = None
        if answer is None:
            raise ScoringProcessDied("the scoring process died while scoring this sample")
        return answer

    def kill(self) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            select.select([self.pidfd], [], [], KILL_WAIT_S)  # readable once it has exited
            os.close(self.pidfd)
            self.pidfd = None
        self.connection.close()


class _Slot:
    """A concurrency slot: its scoring process, replaced when it dies or is killed."""

    def __init__(self, forks: Callable[[], _Child]):
        self.forks = forks
        self.child: Optional[_Child] = None
        self.lock = threading.Lock()  # the start-up thread and a first sample may both ask for the child

    def ready_child(self) -> _Child:
        with self.lock:
            if self.child is None or not self.child.alive():
                if self.child is not None:
                    self.child.kill()
                self.child = self.forks()
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
        self.server = _ForkServer()  # starts importing the reward module now, overlapping the rest of start-up
        self.server_lock = threading.Lock()
        self.slots = [_Slot(self._fork) for _ in range(slots)]
        self.free: asyncio.Queue[_Slot] = asyncio.Queue()
        # One thread per slot waits on its scoring process's socket, off the worker's event loop.
        self.threads = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="vp-scoring")
        for slot in self.slots:
            self.free.put_nowait(slot)
            self.threads.submit(slot.ready_child)

    def _fork(self) -> _Child:
        """A scoring process from the fork server, which is started again if it died (killed, out of memory)."""
        for _ in range(2):
            with self.server_lock:
                server = self.server
                if server.process.poll() is not None:
                    server.close()
                    server = self.server = _ForkServer()
            child = server.fork()
            if child is not None:
                return child
            with self.server_lock:
                if self.server is server:
                    server.process.kill()  # gone or broken: the next try starts another
                    server.process.wait()
        raise ScoringProcessDied("the scoring processes' fork server died twice while starting one")

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
        self.server.close()
