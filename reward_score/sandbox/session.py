"""Host side of one sandbox: start it, load a program, run tests one at a time, and tear it all down.

One :class:`SandboxSession` is one process tree for one program. The host never trusts the sandbox with the
verdict: it sends inputs, gets back what the program printed or returned, and compares outside. Every wait
has a deadline; on any deadline the whole tree is killed (the bwrap process leads its own session, and its
pid namespace dies with it).
"""

from __future__ import annotations

import json
import marshal
import os
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from .cgroups import SandboxCgroup
from .config import SandboxConfig
from .isolation import (
    SANDBOX_ENV,
    interpreter_reachable_by_others,
    open_seccomp_filter,
    require_isolation,
    runner_argv,
    runner_payload,
    sandbox_uid,
)

# Slack on top of a test's own timeout for fork, reporting and cleanup inside the sandbox.
_REPLY_SLACK_S = 3.0
_TEST_HEADER = ">c4Biid"  # must match runner.TEST_HEADER
_MAX_FRAME = 256 << 20


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, or broke the protocol): not the program's fault."""


class RunnerDied(RuntimeError):
    """The runner vanished while a test ran: the program killed it (or exhausted the sandbox)."""


class DeadlineExceeded(RuntimeError):
    """The host-side deadline passed; the sandbox was killed."""


@dataclass(frozen=True)
class TestRun:
    completed: bool  # the program (or check) ran to its end and reported so on the private channel
    exit_code: int | None
    signal: int | None
    timed_out: bool
    stdout: str
    stdout_truncated: bool
    stderr: str
    result: Any  # functional tests: the JSON-encoded return value, else None
    error_type: str | None  # the exception class that ended the program, when it raised one
    wall_s: float


class SandboxSession:
    """Usage::

    with SandboxSession(cfg) as box:
        error = box.load(program, mode="stdin", prelude=PRELUDE)
        run = box.run_test(stdin="1 2\\n", timeout=6.0)
    """

    def __init__(self, cfg: SandboxConfig | None = None, *, deadline: float | None = None):
        self.cfg = cfg or SandboxConfig()
        self.deadline = deadline  # time.monotonic() value after which everything is killed
        self.isolated = require_isolation(self.cfg)
        self.uid = sandbox_uid(self.cfg)
        self._scratch: str | None = None
        self._proc: subprocess.Popen | None = None
        self._start()

    # -- lifecycle -------------------------------------------------------------------------------------------
    def _start(self) -> None:
        # A cgroup of its own where the host allows it (CPU share and cap, memory incl. kernel memory, pids);
        # the shell wrapper moves the sandbox in before bubblewrap starts. None: rlimits only.
        self._cgroup = None
        try:
            self._cgroup = SandboxCgroup.create(self.cfg)
        except OSError as error:
            raise SandboxError(f"could not create the sandbox's cgroup: {error}") from error
        if not self.isolated:
            # No private tmpfs: a fresh host folder, handed to the uid the runner drops to.
            self._scratch = tempfile.mkdtemp(prefix="vp-sbx-")
            if os.geteuid() == 0 and interpreter_reachable_by_others():
                os.chown(self._scratch, self.uid, self.uid)
            else:
                self.uid = 0  # the dropped uid could not even load the standard library; stay as we are
        seccomp_fd = None
        try:
            seccomp_fd = None if self._scratch else open_seccomp_filter(self.cfg)
            argv = runner_argv(self.cfg, self.uid, self._scratch, seccomp_fd)
            self._proc = subprocess.Popen(
                self._cgroup.wrap(argv) if self._cgroup is not None else argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(SANDBOX_ENV),
                cwd="/",
                start_new_session=True,
                close_fds=True,
                pass_fds=() if seccomp_fd is None else (seccomp_fd,),
            )
        except OSError as error:
            self.close()
            raise SandboxError(f"could not start the sandbox: {error}") from error
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)  # bubblewrap has its own copy
        try:
            self._proc.stdin.write(runner_payload())
            self._proc.stdin.flush()
        except OSError:
            pass  # the sandbox died at once; the greeting read below reports it with bwrap's stderr
        try:
            hello = self._receive(time.monotonic() + self.cfg.startup_timeout_s)
        except (RunnerDied, DeadlineExceeded) as error:
            message = f"sandbox did not start: {error}; stderr: {self._stderr_tail()}"
            self.close()
            raise SandboxError(message) from None
        if hello[:1] != b"R":
            self.close()
            raise SandboxError(f"sandbox sent an unexpected greeting: {hello[:80]!r}")

    def close(self) -> None:
        if self._scratch is not None:
            # Kill first, then delete: nothing may still be writing into the folder.
            scratch, self._scratch = self._scratch, None
            self.close()
            shutil.rmtree(scratch, ignore_errors=True)
            return
        proc = self._proc
        group, self._cgroup = getattr(self, "_cgroup", None), None
        if proc is None:
            if group is not None:
                group.destroy()
            return
        self._proc = None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if group is not None:
            group.kill()  # lifts the CPU cap first: a tree thrashing at its memory limit must not starve its own exit
        proc.wait()
        if group is not None:
            group.destroy()  # whatever left the process group (setsid daemons) is still in the cgroup
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- protocol ---------------------------------------------------------------------------------------------
    def _bounded(self, deadline: float) -> float:
        return deadline if self.deadline is None else min(deadline, self.deadline)

    def _send(self, message: dict[str, Any]) -> None:
        data = marshal.dumps(message)
        try:
            self._proc.stdin.write(struct.pack(">I", len(data)) + data)
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            raise RunnerDied("the sandbox closed its input") from None

    def _read_exact(self, count: int, deadline: float) -> bytes:
        fd = self._proc.stdout.fileno()
        chunks = []
        while count:
            # What is already in the pipe is read even past the deadline: a reply that arrived in time must not
            # be lost because this thread was starved (by a neighbour's sample in the same process) meanwhile.
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                if time.monotonic() >= deadline:
                    self.close()
                    raise DeadlineExceeded("no reply before the deadline")
                continue
            chunk = os.read(fd, min(count, 1 << 20))
            if not chunk:
                raise RunnerDied("the sandbox exited")
            chunks.append(chunk)
            count -= len(chunk)
        return b"".join(chunks)

    def _receive(self, deadline: float) -> bytes:
        deadline = self._bounded(deadline)
        (length,) = struct.unpack(">I", self._read_exact(4, deadline))
        if length > _MAX_FRAME:
            raise SandboxError(f"sandbox sent a {length}-byte frame (limit {_MAX_FRAME})")
        return self._read_exact(length, deadline)

    def _stderr_tail(self) -> str:
        proc = self._proc
        if proc is None or proc.stderr is None:
            return ""
        if proc.poll() is None:
            self.close()
            return ""
        try:
            return proc.stderr.read(8192).decode("utf-8", errors="replace").strip()[-600:]
        except (OSError, ValueError):
            return ""

    # -- API --------------------------------------------------------------------------------------------------
    def load(
        self,
        program: str,
        *,
        mode: str,
        prelude: str = "",
        func_name: str = "",
        timeout: float = 6.0,
    ) -> str | None:
        """Hand the program to the runner; returns None, or the compile error text.

        From here on the program is in the sandbox: a runner that dies now died of the program (RunnerDied).
        """
        if mode not in ("stdin", "functional", "assert"):
            raise ValueError(f"unknown sandbox mode {mode!r}")
        self._send(
            {
                "op": "load",
                "mode": mode,
                "program": program,
                "prelude": prelude,
                "func_name": func_name,
                "limits": self.cfg.child_limits(timeout),
            }
        )
        reply = self._receive(time.monotonic() + self.cfg.startup_timeout_s)
        if reply[:2] == b"L\x01":
            return None
        if reply[:2] == b"L\x00":
            return reply[2:].decode("utf-8", errors="replace") or "could not load the program"
        raise SandboxError(f"sandbox sent an unexpected reply to load: {reply[:80]!r}")

    def run_test(
        self,
        *,
        stdin: str = "",
        args: list[Any] | None = None,
        timeout: float = 6.0,
        output_cap: int | None = None,
        result_cap: int | None = None,
        test_code: str = "",
        entry_point: str = "",
        prompt_code: str = "",
        test_binds: tuple[str, ...] = (),
    ) -> TestRun:
        """Run one test; raises RunnerDied / DeadlineExceeded when the program takes the sandbox down.

        ``output_cap`` bounds the stdout bytes that come back (more is reported truncated), ``result_cap`` the
        bytes of a functional test's encoded return value (more arrives cut short). An assert suite's
        ``test_code`` (and the problem's trusted ``prompt_code``, whose names the tests resolve to its own
        definitions) travels only now, after the candidate's process was forked at load, with the names the test
        code binds (``test_binds``: a star import of the candidate's module leaves them alone).
        """
        args_json = json.dumps(args) if args else ""
        message = {"op": "test", "stdin": stdin, "args_json": args_json, "timeout": float(timeout),
                   "output_cap": int(output_cap or 0), "result_cap": int(result_cap or 0), "test_code": test_code,
                   "entry_point": entry_point, "prompt_code": prompt_code,
                   "test_binds": list(test_binds)}  # fmt: skip
        self._send(message)
        return parse_test_reply(self._receive(time.monotonic() + timeout + _REPLY_SLACK_S))


def parse_test_reply(reply: bytes) -> TestRun:
    """Decode the runner's fixed binary layout (``runner.pack_reply``) with struct alone."""
    try:
        tag, completed, timed_out, truncated, has_exit, exit_code, sig, wall_s = struct.unpack_from(_TEST_HEADER, reply)
        if tag != b"T":
            raise ValueError(f"tag {tag!r}")
        offset, fields = struct.calcsize(_TEST_HEADER), []
        for _ in range(4):
            (length,) = struct.unpack_from(">I", reply, offset)
            offset += 4
            if offset + length > len(reply):
                raise ValueError("truncated field")
            fields.append(reply[offset : offset + length])
            offset += length
    except (struct.error, ValueError) as error:
        raise SandboxError(f"sandbox sent a malformed test reply ({error})") from None
    stdout, stderr, result, error_type = fields
    return TestRun(
        completed=bool(completed),
        exit_code=exit_code if has_exit else None,
        signal=sig or None,
        timed_out=bool(timed_out),
        stdout=stdout.decode("utf-8", errors="replace"),
        stdout_truncated=bool(truncated),
        stderr=stderr.decode("utf-8", errors="replace"),
        result=result.decode("utf-8", errors="replace") if completed and result else None,
        error_type=error_type.decode("ascii", errors="replace") or None,
        wall_s=float(wall_s),
    )
