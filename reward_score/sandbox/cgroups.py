"""One cgroup per sandbox: a fair CPU share, a CPU cap, a memory limit that sees everything, and a task limit.

rlimits are per process: RLIMIT_AS does not see memfd or shared-memory pages once they are unmapped, nothing
bounds the kernel memory of a million tmpfs inodes (bubblewrap's ``--size`` caps bytes; it has no
``nr_inodes``), and busy children that each call ``setsid()`` land in scheduler autogroups of their own and
starve every other sample on the machine. A cgroup per sandbox closes all three:

* CPU: every sandbox gets the same weight (v2 ``cpu.weight`` 100, v1 ``cpu.shares`` 1024), however many processes
  it runs, and by default a cap of one core (``cpu.max`` / ``cpu.cfs_quota_us``; ``SandboxConfig.cpu_cap_cores``).
  The sandboxes' common parent weighs as much as ``os.cpu_count()`` ordinary busy processes against the host.
* memory: ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) of ``SandboxConfig.cgroup_memory_bytes``
  (default memory_mb + tmpfs_mb + 256 MiB). The group is charged for anonymous memory, tmpfs and memfd/shmem
  pages and kernel memory (inodes, dentries, page tables): always in v2; in v1 on every kernel since 4.6 unless
  booted with ``cgroup.memory=nokmem`` (an inode flood in a 100 MiB v1 group on kernel 6.18 was OOM-killed at
  ~100k files with ``memory.kmem.usage_in_bytes`` = ``memory.usage_in_bytes``). No swap (``memory.swap.max`` 0
  / ``memory.memsw.limit_in_bytes`` = the limit, where the kernel has them). Over the limit the kernel's OOM
  killer kills inside the group only.
* tasks: ``pids.max`` = ``SandboxConfig.cgroup_pids_max`` (threads count), for every uid in the sandbox together.

Detection, once per process: (1) cgroup v2 with the cpu, memory and pids controllers available to us: our own
cgroup (from /proc/self/cgroup), the hierarchy's root (root user) or our cgroup's parent (a delegated subtree),
the first where we can enable the controllers in ``cgroup.subtree_control`` and create a child; (2) else cgroup
v1 with writable cpu, memory and pids hierarchies (root), nested under our own cgroup in each; (3) else none.
Either way the groups live under a ``verl-pipe`` parent, named ``<pid>-<counter>.ns<pid namespace inode>``; when
a process first sets the parent up it removes the groups of verl-pipe processes that are gone (killing what is
left in them). Detection ends with a real probe: a child group and a shell that moves itself into it.

Placing the sandbox: the command is wrapped as ``/bin/sh -c 'printf 0 > <group>/cgroup.procs ... && exec "$@"'``
(writing 0 moves the writer itself; v1 writes ``tasks``, which moves the shell's only thread without waiting for
an RCU grace period as a ``cgroup.procs`` write does), so the sandbox is in its group before bubblewrap starts
and no ``preexec_fn`` runs in our multithreaded process; it costs about a millisecond. Closing kills every process
still in the group (v2 ``cgroup.kill`` where the kernel has it, else SIGKILL to each pid in ``cgroup.procs``
until it is empty, bounded) and removes the group; a group that cannot be removed yet is retried later.

Fallback: with ``VERL_PIPE_SANDBOX_CGROUPS=0``, ``SandboxConfig.use_cgroups=False``, or a host that allows no
cgroups (not root and no delegated cgroup v2 subtree, a read-only /sys/fs/cgroup in a container, controllers
missing), sandboxes run with rlimits only, exactly as before: namespaces, a private uid, RLIMIT_AS / CPU / NPROC
/ NOFILE / FSIZE and the size-capped tmpfs still hold, but a sample can take more than its share of CPU (and
slow other samples into timeouts), and memfd/shmem pages and tmpfs inodes are bounded only by the host's memory
(the sandbox is the host OOM killer's first victim, oom_score_adj 1000). :func:`describe_isolation` says which
case applies; ``verl-pipe doctor`` prints it.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from .config import CGROUPS_ENV, SandboxConfig

logger = logging.getLogger(__name__)

PARENT_NAME = "verl-pipe"
CONTROLLERS = ("cpu", "memory", "pids")
SHELL = "/bin/sh"
_V1_PERIOD_US = 100_000
_KILL_WAIT_S = 3.0  # how long a close waits for the group's processes to die (then the group is retried later)
_RMDIR_ROUNDS = 20
_NAME = re.compile(r"^(\d+)-(\d+)\.ns(\d+)$")

_counter = itertools.count()
_lock = threading.Lock()
_detected: Detection | None = None
_warned = False
_leftovers: list[SandboxCgroup] = []  # groups that could not be removed yet, retried on the next close


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def cgroups_disabled_by_env() -> bool:
    return os.environ.get(CGROUPS_ENV, "").strip().lower() in ("0", "false", "no", "off")


# -- small file helpers ----------------------------------------------------------------------------------------
def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as handle:
        return handle.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode("ascii"))
    finally:
        os.close(fd)


def _pids_in(directory: str) -> list[int]:
    try:
        return [int(line) for line in _read(os.path.join(directory, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def _rmdir(directory: str) -> bool:
    """True when the group is gone."""
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _pid_namespace() -> str:
    try:
        return re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or "0"
    except OSError:
        return "0"


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _mounts() -> list[tuple[str, str, str, list[str]]]:
    """(fstype, mount root, mount point, super options) of every cgroup file system we can see."""
    found = []
    try:
        lines = _read("/proc/self/mountinfo").splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((tail[0], _unescape(fields[3]), _unescape(fields[4]), tail[2].split(",")))
    return found


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) -> our cgroup's path, from /proc/self/cgroup."""
    own = {}
    try:
        lines = _read("/proc/self/cgroup").splitlines()
    except OSError:
        return own
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "":
            own[""] = parts[2]
        for controller in parts[1].split(","):
            if controller:
                own[controller] = parts[2]
    return own


def _join(mount_root: str, mount_point: str, path: str) -> str | None:
    """The directory of cgroup ``path`` under a mount of the hierarchy rooted at ``mount_root``."""
    root = mount_root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None  # our cgroup is outside what this mount shows
    return os.path.normpath(mount_point + "/" + path[len(root) :].lstrip("/"))


# -- detection --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backend:
    version: int  # 1 or 2
    parents: tuple[str, ...]  # v2: one verl-pipe parent; v1: the cpu, memory and pids parents (distinct dirs)
    cpu_dir: int = 0  # index into parents of the directory that holds each controller (v1)
    memory_dir: int = 0
    pids_dir: int = 0
    features: frozenset[str] = field(default_factory=frozenset)  # control files this kernel has


@dataclass(frozen=True)
class Detection:
    backend: Backend | None
    reason: str  # why there is none (or what was skipped on the way)


def detect() -> Detection:
    """What this host allows, probed once per process (the verl-pipe parent is set up on the way)."""
    global _detected
    with _lock:
        if _detected is None:
            _detected = _detect()
        return _detected


def _detect() -> Detection:
    mounts = _mounts()
    own = _own_cgroups()
    reasons = []
    v2 = [m for m in mounts if m[0] == "cgroup2"]
    for _, mount_root, mount_point, _ in v2:
        if "" not in own:
            break
        backend, reason = _try_v2(mount_root, mount_point, own[""])
        if backend is not None:
            return Detection(backend, "")
        reasons.append(reason)
    if not v2:
        reasons.append("no cgroup v2 mounted")
    backend, reason = _try_v1(mounts, own)
    if backend is not None:
        return Detection(backend, "")
    reasons.append(reason)
    if os.geteuid() != 0:
        reasons.insert(0, "not root")
    return Detection(None, "; ".join(reasons))


def _try_v2(mount_root: str, mount_point: str, own_path: str) -> tuple[Backend | None, str]:
    mine = _join(mount_root, mount_point, own_path)
    candidates = []
    for candidate in (mine, mount_point, os.path.dirname(mine) if mine else None):
        if candidate and candidate.startswith(mount_point) and candidate not in candidates:
            candidates.append(candidate)
    problems = []
    for base in candidates:
        try:
            available = _read(os.path.join(base, "cgroup.controllers")).split()
        except OSError as error:
            problems.append(f"{base}: {error.strerror}")
            continue
        missing = [c for c in CONTROLLERS if c not in available]
        if missing:
            problems.append(f"{base} has no {'/'.join(missing)} controller (bound to cgroup v1, or not delegated)")
            continue
        enable = " ".join("+" + c for c in CONTROLLERS)
        try:
            if any(c not in _read(os.path.join(base, "cgroup.subtree_control")).split() for c in CONTROLLERS):
                _write(os.path.join(base, "cgroup.subtree_control"), enable)
            parent = os.path.join(base, PARENT_NAME)
            os.makedirs(parent, exist_ok=True)
            if any(c not in _read(os.path.join(parent, "cgroup.subtree_control")).split() for c in CONTROLLERS):
                _write(os.path.join(parent, "cgroup.subtree_control"), enable)
        except OSError as error:
            why = "it holds processes" if error.errno == errno.EBUSY else error.strerror
            problems.append(f"cannot enable cpu/memory/pids under {base} ({why})")
            continue
        # The parent is an ordinary group with the controllers on: it has every control file a child will have.
        features = {name for name in ("cgroup.kill", "memory.swap.max", "memory.peak")
                    if os.path.exists(os.path.join(parent, name))}  # fmt: skip
        backend = Backend(2, (parent,), features=frozenset(features))
        try:
            _set_parent_weight(backend)
            _clean_stale(backend)
            _probe(backend)
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            problems.append(f"cgroup v2 under {parent} does not work ({error})")
            continue
        return backend, ""
    return None, "cgroup v2: " + ("; ".join(problems) or "our cgroup is not visible")


def _try_v1(mounts, own: dict[str, str]) -> tuple[Backend | None, str]:
    dirs = {}
    for controller in CONTROLLERS:
        for fstype, mount_root, mount_point, options in mounts:
            if fstype == "cgroup" and controller in options and controller in own:
                path = _join(mount_root, mount_point, own[controller])
                if path is not None:
                    dirs[controller] = path
                    break
        else:
            return None, f"cgroup v1: no {controller} hierarchy of ours is mounted"
    parents: list[str] = []
    index = {}
    for controller in CONTROLLERS:
        parent = os.path.join(dirs[controller], PARENT_NAME)
        if parent not in parents:
            parents.append(parent)
        index[controller] = parents.index(parent)
    try:
        for parent in parents:
            os.makedirs(parent, exist_ok=True)
    except OSError as error:
        return None, f"cgroup v1: cannot create {error.filename} ({error.strerror})"
    memory = parents[index["memory"]]
    features = {name for name in ("memory.memsw.limit_in_bytes", "memory.max_usage_in_bytes")
                if os.path.exists(os.path.join(memory, name))}  # fmt: skip
    backend = Backend(1, tuple(parents), index["cpu"], index["memory"], index["pids"], frozenset(features))
    try:
        _set_parent_weight(backend)
        _clean_stale(backend)
        _probe(backend)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        return None, f"cgroup v1 under {', '.join(parents)} does not work ({error})"
    return backend, ""


def _set_parent_weight(backend: Backend) -> None:
    # All sandboxes together weigh as much as one busy process per core against the rest of the host.
    cores = os.cpu_count() or 1
    cpu_parent = backend.parents[backend.cpu_dir]
    if backend.version == 2:
        _write(os.path.join(cpu_parent, "cpu.weight"), str(min(10_000, 100 * cores)))
    else:
        _write(os.path.join(cpu_parent, "cpu.shares"), str(1024 * cores))


def _clean_stale(backend: Backend) -> None:
    """Remove the groups of verl-pipe processes (of our pid namespace) that are gone, or that had our pid."""
    namespace, me = _pid_namespace(), os.getpid()
    names = set()
    for parent in backend.parents:
        try:
            names.update(os.listdir(parent))
        except OSError:
            continue
    for name in sorted(names):
        match = _NAME.match(name)
        if match is None or match.group(3) != namespace:
            continue
        pid = int(match.group(1))
        if pid != me and os.path.exists(f"/proc/{pid}"):
            continue
        SandboxCgroup(backend, name).destroy()


def _probe(backend: Backend) -> None:
    """Create a real group, move a shell into it and check it arrived; raises when that fails."""
    group = SandboxCgroup.make(backend, SandboxConfig())
    try:
        done = subprocess.run(group.wrap(["cat", "/proc/self/cgroup"]), capture_output=True, text=True,
                              timeout=10, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"a process cannot move into it: {done.stderr.strip()[-200:]}")
        if f"/{PARENT_NAME}/{group.name}" not in done.stdout:
            raise RuntimeError("the shell that wrote 0 into the group did not land in it")
    finally:
        group.destroy()


# -- one sandbox's group ---------------------------------------------------------------------------------------
class SandboxCgroup:
    """One sandbox's cgroup (a directory per hierarchy in v1). Create with :meth:`create`, place the sandbox
    with :meth:`wrap`, end with :meth:`destroy`."""

    def __init__(self, backend: Backend, name: str):
        self.backend = backend
        self.name = name
        self.dirs = tuple(os.path.join(parent, name) for parent in backend.parents)
        self._destroyed = False

    @classmethod
    def create(cls, cfg: SandboxConfig) -> SandboxCgroup | None:
        """A new group for one sandbox, or None where cgroups are off or unavailable (rlimits only)."""
        if not cfg.use_cgroups or cgroups_disabled_by_env():
            return None
        detection = detect()
        if detection.backend is None:
            _warn_once(detection.reason)
            return None
        if _leftovers:
            _retry_leftovers()
        return cls.make(detection.backend, cfg)

    @classmethod
    def make(cls, backend: Backend, cfg: SandboxConfig) -> SandboxCgroup:
        group = cls(backend, f"{os.getpid()}-{next(_counter)}.ns{_pid_namespace()}")
        try:
            group._configure(cfg)
        except OSError:
            group.destroy()
            raise
        return group

    def _dir(self, which: int) -> str:
        return self.dirs[which]

    def _configure(self, cfg: SandboxConfig) -> None:
        for directory in self.dirs:
            os.mkdir(directory)
        memory = cfg.cgroup_memory_bytes
        cpu, mem, pids = (self._dir(self.backend.cpu_dir), self._dir(self.backend.memory_dir),
                          self._dir(self.backend.pids_dir))  # fmt: skip
        if self.backend.version == 2:
            _write(os.path.join(cpu, "cpu.weight"), "100")
            if cfg.cpu_cap_cores is not None:
                _write(os.path.join(cpu, "cpu.max"), f"{max(1000, round(cfg.cpu_cap_cores * 100_000))} 100000")
            _write(os.path.join(mem, "memory.max"), str(memory))
            if "memory.swap.max" in self.backend.features:
                try:
                    _write(os.path.join(mem, "memory.swap.max"), "0")
                except FileNotFoundError:
                    pass  # no swap accounting on this kernel: nothing to limit
        else:
            _write(os.path.join(cpu, "cpu.shares"), "1024")
            if cfg.cpu_cap_cores is not None:
                _write(os.path.join(cpu, "cpu.cfs_period_us"), str(_V1_PERIOD_US))
                quota = max(1000, round(cfg.cpu_cap_cores * _V1_PERIOD_US))
                _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(quota))
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory))
            if "memory.memsw.limit_in_bytes" in self.backend.features:
                _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory))
        _write(os.path.join(pids, "pids.max"), str(cfg.cgroup_pids_max))

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into this group (no preexec_fn in our process).

        v1 moves the shell's one thread through ``tasks``: writing ``cgroup.procs`` takes the threadgroup lock
        for writing, which waits out an RCU grace period (~15 ms here) whenever no migration happened lately.
        """
        target = "tasks" if self.backend.version == 1 else "cgroup.procs"
        moves = " && ".join(f"printf 0 > {shlex.quote(os.path.join(d, target))}" for d in self.dirs)
        return [SHELL, "-c", moves + ' && exec "$@"', "sh", *argv]

    # -- inspection (tests, diagnostics) -------------------------------------------------------------------------
    def pids(self) -> list[int]:
        found: set[int] = set()
        for directory in self.dirs:
            found.update(_pids_in(directory))
        return sorted(found)

    def memory_peak(self) -> int | None:
        """The most memory the group held at once (v2 kernels before 5.19: what it holds now)."""
        mem = self._dir(self.backend.memory_dir)
        names = ("memory.max_usage_in_bytes",) if self.backend.version == 1 else ("memory.peak", "memory.current")
        for name in names:
            try:
                return int(_read(os.path.join(mem, name)).split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return None

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer killed in this group."""
        mem = self._dir(self.backend.memory_dir)
        name = "memory.oom_control" if self.backend.version == 1 else "memory.events"
        try:
            for line in _read(os.path.join(mem, name)).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return None

    # -- teardown ------------------------------------------------------------------------------------------------
    def kill(self) -> bool:
        """SIGKILL everything in the group; True once it is empty (bounded: about _KILL_WAIT_S)."""
        pids = self.pids()
        if not pids:
            return True
        # Dying processes free their memory (a memfd's pages, a flood of inodes) at full speed, not under the cap.
        self._uncap()
        if self.backend.version == 2 and "cgroup.kill" in self.backend.features:
            try:
                _write(os.path.join(self.dirs[0], "cgroup.kill"), "1")
            except OSError:
                pass
        deadline = time.monotonic() + _KILL_WAIT_S
        attempt = 0
        while pids:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if time.monotonic() > deadline:
                break
            attempt += 1
            time.sleep(min(0.05, 0.0005 * attempt))
            pids = self.pids()
        return not pids

    def _uncap(self) -> None:
        cpu = self._dir(self.backend.cpu_dir)
        name, value = ("cpu.max", "max") if self.backend.version == 2 else ("cpu.cfs_quota_us", "-1")
        try:
            _write(os.path.join(cpu, name), value)
        except OSError:
            pass

    def remove(self) -> bool:
        """rmdir every directory of the group (a race with exiting processes is retried); True when gone."""
        remaining = list(self.dirs)
        for attempt in range(_RMDIR_ROUNDS):
            remaining = [d for d in remaining if not _rmdir(d)]
            if not remaining:
                return True
            time.sleep(min(0.05, 0.001 * (attempt + 1)))
        return False

    def destroy(self) -> None:
        """Kill what is left and remove the group; never raises. A group that resists is retried later."""
        if self._destroyed:
            return
        self._destroyed = True
        try:
            self.kill()
            gone = self.remove()
        except OSError:
            gone = False
        if not gone:
            logger.warning("verl-pipe sandbox: cgroup %s could not be removed yet; retrying later", self.dirs[0])
            with _lock:
                _leftovers.append(self)
        elif _leftovers:
            _retry_leftovers()


def _retry_leftovers() -> None:
    with _lock:
        pending = list(_leftovers)
        _leftovers.clear()
    still = []
    for group in pending:
        if not (group.kill() and group.remove()):
            still.append(group)
    if still:
        with _lock:
            _leftovers.extend(still)


def _warn_once(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        logger.warning("verl-pipe sandbox: %s", _none_line(reason))


# -- the one-line summary --------------------------------------------------------------------------------------
def _fix() -> str:
    return (
        "fix: run the reward as root with writable cgroups (cgroup v1 cpu/memory/pids, or v2), or start verl-pipe "
        "in a delegated cgroup v2 subtree with cpu, memory and pids whose processes sit in a leaf (e.g. systemd-run "
        "--user -p Delegate=yes, then move the process into a child group)"
    )


def _none_line(why: str, fix: str | None = None) -> str:
    return (
        f"no cgroups ({why}): rlimits only — a sandbox can use more than its share of CPU and memory (busy setsid "
        f"children slow other samples into timeouts; memfd/shmem pages and tmpfs inodes count against nothing but "
        f"the host); {fix or _fix()}"
    )


def _kernel_charges_v1_kmem() -> bool:
    try:
        if "cgroup.memory=nokmem" in _read("/proc/cmdline"):
            return False
        major, minor = (int(x) for x in re.findall(r"\d+", os.uname().release)[:2])
    except (OSError, ValueError):
        return False
    return (major, minor) >= (4, 6)


def describe_isolation(cfg: SandboxConfig | None = None) -> str:
    """One line: the per-sandbox cgroup limits in force here, or why there are none and what that leaves open."""
    cfg = cfg or SandboxConfig()
    if cgroups_disabled_by_env():
        return _none_line(f"{CGROUPS_ENV}={os.environ[CGROUPS_ENV]}", f"to turn them on: unset {CGROUPS_ENV}")
    if not cfg.use_cgroups:
        return _none_line("sandbox.use_cgroups is false", "to turn them on: sandbox.use_cgroups=true")
    detection = detect()
    backend = detection.backend
    if backend is None:
        return _none_line(detection.reason)
    cpu = "cpu share"
    if cfg.cpu_cap_cores is not None:
        cpu += f" + {cfg.cpu_cap_cores:g}-core cap"
    gib = cfg.cgroup_memory_bytes / (1 << 30)
    if backend.version == 2:
        memory = f"memory.max {gib:.1f} GiB incl. kernel memory, tmpfs and memfd"
        if "memory.swap.max" in backend.features:
            memory += ", no swap"
    else:
        kmem = "incl. kernel memory" if _kernel_charges_v1_kmem() else "kernel memory NOT charged (nokmem/old kernel)"
        memory = f"memory.limit {gib:.1f} GiB {kmem}, tmpfs and memfd"
    where = ", ".join(backend.parents)
    return f"cgroup v{backend.version} per sandbox: {cpu}, {memory}, pids {cfg.cgroup_pids_max} (under {where})"
