"""Run one untrusted Python program in a fresh, resource-limited subprocess.

By default the program runs under bubblewrap (``bwrap``): no network, a read-only view of the host file
system, a private /tmp, /proc and PID namespace, and only its own working folder writable. Inside that,
rlimits and a parent-enforced wall clock stop the common accidents (infinite loops, memory blow-ups, giant
outputs, leaked children) that would otherwise stall or poison an RL run. ``VERL_PIPE_SANDBOX=none`` drops the
namespace layer (rlimits only) for machines without bubblewrap; the reward issue hardens this further
(seccomp, an unprivileged uid).

Design choices:
* stdin and stdout/stderr go through files rather than pipes, so a chatty program can never deadlock
  against a parent that is busy waiting, and the parent never buffers more than ``output_limit`` bytes.
* The child leads its own session/process group; the wall-clock deadline is enforced by the parent, which
  kills the whole group, so grandchildren spawned by the program die too.
* The parent waits for exit *without reaping* (pidfd or ``waitid(WNOWAIT)``) and kills the group before
  reaping, so the group id cannot be recycled between the kill and the reap and no zombie is left behind.
"""

from __future__ import annotations

import math
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

OUTPUT_LIMIT_BYTES = 1 << 20
MEMORY_LIMIT_BYTES = 1 << 30
FILE_SIZE_LIMIT_BYTES = 16 << 20
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
PROGRAM_NAME = "main.py"
# Where the program's working folder appears inside the bubblewrap sandbox.
SANDBOX_WORKDIR = "/tmp/work"
SANDBOX_MODE_ENV = "VERL_PIPE_SANDBOX"
MISSING_BWRAP = (
    "bubblewrap (bwrap) is not installed, and the code reward runs programs inside it: run `make install` "
    "(or `apt-get install -y bubblewrap`), or set VERL_PIPE_SANDBOX=none to run without namespace isolation."
)


def sandbox_mode() -> str:
    mode = os.environ.get(SANDBOX_MODE_ENV, "bwrap").strip().lower()
    if mode not in ("bwrap", "none"):
        raise ValueError(f"{SANDBOX_MODE_ENV} must be 'bwrap' or 'none', got {mode!r}")
    return mode


def require_bwrap() -> str:
    """Path of the bwrap binary, or a SetupError naming the fix."""
    path = shutil.which("bwrap")
    if path is None:
        from verl_pipe.compat import SetupError

        raise SetupError(MISSING_BWRAP)
    return path


def _interpreter() -> str:
    """The real interpreter behind ``sys.executable`` (a venv's python is a symlink; never run through a shim)."""
    return os.path.realpath(sys.executable)


def _command(workdir: str) -> tuple[list[str], str]:
    """The argv that runs the program, and the cwd to start it in."""
    python = [_interpreter(), "-I", "-S", PROGRAM_NAME]
    if sandbox_mode() == "none":
        return python, workdir
    # No --new-session: the sandboxed program must stay in the process group the parent kills on timeout.
    bwrap = [
        require_bwrap(),
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
    ]  # fmt: skip
    # The private /tmp hides anything the host keeps there; an interpreter installed under /tmp must stay visible.
    for path in sorted({os.path.realpath(sys.base_prefix), os.path.dirname(_interpreter())}):
        if path == "/tmp" or path.startswith("/tmp/"):
            bwrap += ["--ro-bind", path, path]
    bwrap += ["--bind", workdir, SANDBOX_WORKDIR, "--chdir", SANDBOX_WORKDIR]
    return bwrap + python, workdir


@dataclass(frozen=True)
class ExecResult:
    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    wall_s: float


def _limits(cpu_seconds: int, memory_bytes: int):
    # Returned closure runs in the forked child before exec; it must not import or take locks, which is
    # why `resource` is imported at module level and the closure only makes syscalls.
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        # Soft limit sends SIGXCPU (reported as a timeout); the hard limit one second later is a SIGKILL.
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT_BYTES, FILE_SIZE_LIMIT_BYTES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _wait_exit_unreaped(pid: int, timeout: float) -> bool:
    """Block until ``pid`` has exited (leaving it a zombie) or ``timeout`` passes; True if it exited."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(max(0.0, timeout) * 1000.0))
        finally:
            os.close(fd)
    # Fallback for kernels without pidfd: poll with WNOWAIT so the zombie stays in place.
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(path: str, limit: int) -> str:
    with open(path, "rb") as handle:
        data = handle.read(limit)
    return data.decode("utf-8", errors="replace")


def run_program(
    source: str,
    stdin: str = "",
    timeout: float = 6.0,
    *,
    files: Mapping[str, str] | None = None,
    memory_bytes: int = MEMORY_LIMIT_BYTES,
    output_limit: int = OUTPUT_LIMIT_BYTES,
) -> ExecResult:
    """Run ``source`` as ``python -I -S main.py`` with ``stdin`` and return what happened.

    ``files`` are extra text files written next to the program (relative names only), e.g. a solution
    module or a test payload. ``timeout`` is wall-clock seconds; CPU time is capped one second above it.
    """
    root = tempfile.mkdtemp(prefix="vp-sbx-")
    try:
        workdir = os.path.join(root, "work")
        os.mkdir(workdir)
        for name, text in {PROGRAM_NAME: source, **(files or {})}.items():
            if os.path.isabs(name) or ".." in name.split("/"):
                raise ValueError(f"sandbox file names must be relative: {name!r}")
            with open(os.path.join(workdir, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        # I/O files live outside the child's cwd so the program does not see them in os.listdir(".").
        in_path, out_path, err_path = (os.path.join(root, n) for n in ("stdin", "stdout", "stderr"))
        with open(in_path, "w", encoding="utf-8") as handle:
            handle.write(stdin)
        return _spawn_and_wait(workdir, in_path, out_path, err_path, timeout, memory_bytes, output_limit)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _spawn_and_wait(
    workdir: str,
    in_path: str,
    out_path: str,
    err_path: str,
    timeout: float,
    memory_bytes: int,
    output_limit: int,
) -> ExecResult:
    cpu_seconds = int(math.ceil(timeout)) + 1
    with open(in_path, "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
        argv, cwd = _command(workdir)
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=fin,
            stdout=fout,
            stderr=ferr,
            cwd=cwd,
            env=dict(SANDBOX_ENV),
            preexec_fn=_limits(cpu_seconds, memory_bytes),
            start_new_session=True,
            close_fds=True,
        )
        timed_out = False
        try:
            exited = _wait_exit_unreaped(proc.pid, timeout)
            timed_out = not exited
        finally:
            # Always kill the group: on timeout to stop the program, on normal exit to stop any children it
            # left running. The leader is still unreaped here, so its pgid cannot belong to anyone else.
            _kill_group(proc.pid)
            proc.wait()
        wall_s = time.monotonic() - start
    returncode = proc.returncode
    if returncode == -signal.SIGXCPU:
        timed_out = True
    return ExecResult(
        stdout=_read_capped(out_path, output_limit),
        stderr=_read_capped(err_path, output_limit),
        returncode=returncode,
        timed_out=timed_out,
        wall_s=wall_s,
    )
