"""The far side of :mod:`.scoring_processes`: one fork server per reward worker, and the scoring processes it forks.

``python -m verl_pipe.reward_manager.scoring_child <control fd>`` imports the reward module once, then waits on its
control socket. Each request there carries one end of a fresh socket pair; the server forks a scoring process that
owns that end, and answers with its pid. A scoring process reads ``(score_fn, kwargs)`` messages and answers
``("ok", result)`` or ``("error", exception)``, one sample at a time, until the manager's end closes. Forking from
here, not from the reward worker: a Ray worker runs many threads, which a fork must not copy; this process runs one.

Standard input is /dev/null and standard output goes to stderr: a score that reads input gets end-of-file, and what
it prints cannot reach the protocol, which has its own socket.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import socket
import sys
import traceback

from verl_pipe.reward_manager.scoring_processes import FORK_REQUEST, PID_BYTES, receive_message, send_message

# What the fork server imports once, so that every scoring process it forks starts with it loaded.
PRELOAD = ("verl_pipe.reward_score",)


def _prefer_as_oom_victim() -> None:
    # The sandbox's runner does the same, but it is a script (it reads its argv on import), not a library.
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass


def _answer(score_fn, kwargs) -> bytes:
    try:
        reply = ("ok", score_fn(**kwargs))
    except BaseException as error:  # noqa: BLE001 - whatever the score raises is the sample's, not this process's
        reply = ("error", error)
    try:
        return pickle.dumps(reply)
    except Exception:  # noqa: BLE001 - an unpicklable result or exception still gets an answer
        return pickle.dumps(("error", RuntimeError(f"the score's {type(reply[1]).__name__} could not be pickled")))


def score_samples(connection: socket.socket) -> None:
    """A scoring process's life: answer every sample that comes, until the manager closes its end."""
    while (request := receive_message(connection)) is not None:
        score_fn, kwargs = pickle.loads(request)
        send_message(connection, _answer(score_fn, kwargs))


def _fork_scoring_process(control: socket.socket, connection_fd: int) -> int:
    pid = os.fork()
    if pid:
        return pid
    status = 0
    try:
        control.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the score waits for its own sandboxes
        score_samples(socket.socket(fileno=connection_fd))
    except BaseException:  # noqa: BLE001 - reported, and the process ends either way
        traceback.print_exc()
        status = 1
    finally:
        os._exit(status)  # never return into the server's loop


def serve_forks(control: socket.socket) -> None:
    """Fork one scoring process per request until the manager's end of ``control`` closes."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the scoring processes; the manager kills them
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, len(FORK_REQUEST), 1)
        except OSError:
            return
        if message != FORK_REQUEST or len(fds) != 1:
            return  # the manager is gone (end of stream)
        pid = _fork_scoring_process(control, fds[0])
        os.close(fds[0])
        try:
            control.sendall(pid.to_bytes(PID_BYTES, "little"))
        except OSError:
            return


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    quiet = os.open(os.devnull, os.O_RDONLY)
    os.dup2(quiet, 0)
    os.dup2(2, 1)
    _prefer_as_oom_victim()
    for module in PRELOAD:
        importlib.import_module(module)
    serve_forks(control)


if __name__ == "__main__":
    main()
