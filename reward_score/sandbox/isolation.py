"""How a sandbox is started: the bubblewrap command line, and the check that bubblewrap works here.

The sandbox sees a file system built from an allow-list, not the host's root: /usr and the /bin, /lib*
links, the interpreter's own prefix, a fresh /proc and /dev, and a size-capped private tmpfs on /tmp that holds
the work dir. Home directories, /etc, /work, /data and the host /tmp never appear, so a program searching the
disk for datasets or expected outputs finds nothing. No network, its own pid/ipc/uts namespaces, a new
session (no terminal injection), death with its parent, and a seccomp filter against the kernel state that the
namespaces do not separate (:mod:`.seccomp`).

Privileges: run by a normal user, bubblewrap makes a user namespace, and RLIMIT_NPROC set inside it counts
only that namespace's processes (kernel >= 5.14 ucounts). Run by root, a user namespace would keep the
kernel uid 0, for which RLIMIT_NPROC is ignored; so as root bubblewrap runs without one and the runner drops
to a uid of its own before any candidate code exists.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import marshal
import os
import shutil
import subprocess
import sys
import threading

from verl_pipe.compat import SetupError

from . import seccomp
from .config import ALLOW_UNISOLATED_ENV, SandboxConfig

logger = logging.getLogger(__name__)

RUNNER_PATH = os.path.join(os.path.dirname(__file__), "runner.py")
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_HOST_LINK_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_uid_slots = itertools.count()
_probe_lock = threading.Lock()
_probe_result: dict[str, str | None] = {}


class SandboxUnavailable(SetupError):
    """bubblewrap is missing or cannot create namespaces here; the message names the fix."""


def interpreter() -> str:
    """The real interpreter (a venv's python is a symlink; the sandbox never runs through a shim)."""
    return os.path.realpath(sys.executable)


def _interpreter_roots() -> list[str]:
    roots = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(interpreter()))}
    return sorted(r for r in roots if r != "/usr" and not r.startswith("/usr/"))


def interpreter_reachable_by_others() -> bool:
    """Whether another uid could traverse to the interpreter's files on the host (without our bind mounts)."""
    for root in _interpreter_roots():
        for path in [*_ancestors(root), root]:
            if not os.stat(path).st_mode & 0o001:
                return False
    return True


# The interpreter's -c program: read one length-prefixed, marshalled code object (the runner) from stdin and run
# it. Compiling the runner's source in every sandbox would cost ~2.5 ms per program; the host compiles it once.
BOOTSTRAP = (
    "import os,marshal\n"
    "def _r(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c:raise SystemExit(3)\n"
    "  b+=c\n"
    " return b\n"
    "exec(marshal.loads(_r(int.from_bytes(_r(4),'big'))))\n"
)


@functools.lru_cache(maxsize=1)
def runner_payload() -> bytes:
    """The runner compiled by this interpreter (the same one the sandbox runs), framed for BOOTSTRAP."""
    with open(RUNNER_PATH, encoding="utf-8") as handle:
        code = compile(handle.read(), RUNNER_PATH, "exec", dont_inherit=True)
    data = marshal.dumps(code)
    return len(data).to_bytes(4, "big") + data


# An assert suite's tests run as the candidate's uid plus this: a range of their own above the candidates'.
TESTS_UID_OFFSET = 1 << 26


def sandbox_uid(cfg: SandboxConfig) -> int:
    # Unique among live sandboxes: this process's pid picks a block of 64, a counter a slot in it.
    return cfg.uid_base + (os.getpid() % (1 << 20)) * 64 + next(_uid_slots) % 64


def _ancestors(path: str) -> list[str]:
    parts, found = path.strip("/").split("/"), []
    for depth in range(1, len(parts)):
        found.append("/" + "/".join(parts[:depth]))
    return found


def bwrap_argv(cfg: SandboxConfig, bwrap: str, seccomp_fd: int | None = None) -> list[str]:
    """bubblewrap's part of the command; ``seccomp_fd`` holds the filter it loads before the runner starts."""
    if os.geteuid() == 0:
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    else:
        namespaces = ["--unshare-all"]
    argv = [bwrap, *namespaces, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for path in _HOST_LINK_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if cfg.hide_global_counters:  # empty in their place: no pty to open, no system-wide counter to read
        argv += ["--tmpfs", "/dev/pts", "--tmpfs", "/proc/sys"]
    argv += ["--perms", "1777", "--size", str(cfg.tmpfs_mb << 20), "--tmpfs", "/tmp"]
    made: set[str] = set()
    for root in _interpreter_roots():
        # Parents are created world-traversable: a prefix under a mode-700 home stays usable by the dropped uid.
        for parent in _ancestors(root):
            if parent not in made and parent not in _HOST_LINK_DIRS:
                argv += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        argv += ["--ro-bind", root, root]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv + ["--remount-ro", "/", "--chdir", "/tmp"]


@functools.lru_cache(maxsize=1)
def _missing_filter_warned() -> bool:
    logger.warning("verl-pipe sandbox: %s", seccomp.filter_status())
    return True


def open_seccomp_filter(cfg: SandboxConfig) -> int | None:
    """A descriptor with the sandbox's seccomp filter for bubblewrap, or None: switched off in the config, or no
    filter for this machine's architecture (logged once, naming what is then not denied)."""
    if not cfg.seccomp:
        return None
    abi = seccomp.host_abi()
    if abi is None:
        _missing_filter_warned()
        return None
    return seccomp.filter_fd(abi)


def runner_argv(cfg: SandboxConfig, uid: int, scratch: str | None = None, seccomp_fd: int | None = None
                ) -> list[str]:  # fmt: skip
    """The command: [bwrap ...] python -I -S -c <runner> <uid> <nproc> <isolated|unisolated> <scratch dir>
    <tests uid>.

    ``scratch`` is None for the isolated sandbox (its private /tmp); an unisolated runner gets a host folder.
    The tests uid runs an assert suite's test code, apart from the candidate's uid (used when run as root).
    """
    python = [interpreter(), "-I", "-S", "-c", BOOTSTRAP]
    tail = [str(uid), str(cfg.max_processes), "unisolated" if scratch else "isolated", scratch or "/tmp",
            str(uid + TESTS_UID_OFFSET)]  # fmt: skip
    if scratch:
        return python + tail
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(_fix_message("bubblewrap (bwrap) is not installed"))
    return bwrap_argv(cfg, bwrap, seccomp_fd) + python + tail


def _fix_message(problem: str) -> str:
    return (
        f"{problem}, and the code reward runs every program inside it. Fix: run `make install` (it runs "
        "`apt-get install -y bubblewrap`) and make sure unprivileged user namespaces are allowed "
        "(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0). Only if you accept running "
        f"model-written code without namespace isolation: set {ALLOW_UNISOLATED_ENV}=1 or "
        "reward_kwargs.allow_unisolated=true."
    )


def probe_bwrap() -> str | None:
    """None when bubblewrap can build the sandbox here, else the reason (cached per process and bwrap path)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    with _probe_lock:
        if bwrap in _probe_result:
            return _probe_result[bwrap]
        cfg = SandboxConfig()
        seccomp_fd = open_seccomp_filter(cfg)  # the probe runs under the filter every sandbox gets
        argv = bwrap_argv(cfg, bwrap, seccomp_fd) + [interpreter(), "-I", "-S", "-c", "print(6 * 7)"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=dict(SANDBOX_ENV),
                                  pass_fds=() if seccomp_fd is None else (seccomp_fd,))  # fmt: skip
            ok = done.returncode == 0 and done.stdout.strip() == "42"
            reason = None if ok else f"bubblewrap failed to start a sandbox here ({done.stderr.strip()[-300:]})"
        except (OSError, subprocess.TimeoutExpired) as error:
            reason = f"bubblewrap failed to start a sandbox here ({error})"
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        _probe_result[bwrap] = reason
        return reason


def require_isolation(cfg: SandboxConfig) -> bool:
    """True to run isolated; False only when isolation is impossible and the config explicitly allows that."""
    reason = probe_bwrap()
    if reason is None:
        return True
    if not cfg.allow_unisolated:
        raise SandboxUnavailable(_fix_message(reason))
    logger.warning(
        "verl-pipe sandbox: %s; running model-written code WITHOUT namespace isolation or seccomp filter "
        "(rlimits and a private uid only) because allow_unisolated is set",
        reason,
    )
    return False


# One call of each denied group, made inside a sandbox: (group, call, arguments). Unfiltered, each succeeds.
_FILTER_PROBES = (
    ("kernel keyrings", "keyctl", (0, -4, 0)),  # KEYCTL_GET_KEYRING_ID of the user keyring, creating it
    ("file-activity notification", "inotify_init1", (0,)),
    ("namespaces", "unshare", (0x10000000,)),  # CLONE_NEWUSER
    ("process inspection", "kcmp", (1, 1, 0, 0, 0)),  # KCMP_FILE of init's fd 0 with itself
    ("objects keyed by shared files", "flock", (0, 6)),  # LOCK_EX | LOCK_NB on stdin
)


def check_seccomp_filter() -> str:
    """Whether a sandboxed program here is really denied what the filter lists: one call per group, run inside a
    sandbox with the filter (``verl-pipe doctor``). Returns a line for the report."""
    abi = seccomp.host_abi()
    if abi is None or probe_bwrap() is not None:
        return seccomp.filter_status()
    calls = [(group, abi.numbers[name], args) for group, name, args in _FILTER_PROBES]
    program = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"for group, number, args in {calls!r}:\n"
        "    ctypes.set_errno(0)\n"
        "    print(group, libc.syscall(number, *args), ctypes.get_errno(), sep='|')\n"
    )
    seccomp_fd = open_seccomp_filter(SandboxConfig())
    argv = bwrap_argv(SandboxConfig(), shutil.which("bwrap"), seccomp_fd) + [interpreter(), "-I", "-S", "-c", program]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=dict(SANDBOX_ENV),
                              pass_fds=(seccomp_fd,))  # fmt: skip
    finally:
        os.close(seccomp_fd)
    outcomes = dict(line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)
    allowed = [group for group, _, _ in _FILTER_PROBES if outcomes.get(group) != f"-1|{errno.EPERM}"]
    if allowed:
        return f"{seccomp.filter_status()}; BUT a sandboxed program was not denied: {', '.join(allowed)} ({outcomes})"
    return f"{seccomp.filter_status()}; checked: a sandboxed program got EPERM for {', '.join(outcomes)}"
