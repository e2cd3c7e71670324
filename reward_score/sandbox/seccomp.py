"""The sandbox's seccomp filter: system calls no graded program needs, denied to every sandboxed process.

Namespaces, a private uid and cgroups keep samples apart in what the kernel namespaces; some kernel state is not
namespaced, and a program that computes nothing could use it to read what another sample left or broadcast:

* **kernel keyrings** (``add_key``, ``request_key``, ``keyctl``): a uid's user and persistent keyrings outlive
  the sandbox that filled them, and a later sandbox that gets the same uid reads them;
* **file-activity notification** (``inotify_*``, ``fanotify_*``): every sandbox shares the read-only /usr and
  interpreter folders, so a watcher sees the files another sample opens there;
* **namespaces** (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag; ``clone3``, whose flags a filter
  cannot read, answers ENOSYS so that the C library falls back to ``clone``): a new user namespace would give the
  program full capabilities inside it, attack surface no program here needs;
* **process inspection** (``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``, ``pidfd_getfd``,
  ``perf_event_open``);
* kernel interfaces that have been the way out of sandboxes before: ``bpf``, ``userfaultfd``, ``io_uring``, the
  mount calls, and file-handle opens (``open_by_handle_at``);
* **kernel objects keyed by a file every sandbox shares** (the interpreter's read-only tree is the same inode
  in every sandbox): record locks, leases and directory notification (``fcntl`` with a lock, lease or notify
  command; ``flock``), futexes other than process-private ones (a futex in a file mapping is keyed by the file),
  and page-cache residency probed without blocking (``mincore``, ``cachestat``, ``fadvise``, ``preadv2`` and
  ``pwritev2`` with ``RWF_NOWAIT``). Each lets one sample signal another, or a later one.

Everything else is allowed; each denied call fails with EPERM, so a program sees an ordinary error. System calls
of another ABI than the host's (i386 ``int 0x80`` on x86-64, x32) are denied as a whole, or the filter could be
walked around by numbers it does not check. bubblewrap loads the filter (``--seccomp FD``) just before it starts
the runner, so it covers the runner, the candidate and the tests alike.

The filter is classic BPF, built here for the architectures whose system-call numbers it knows (x86-64, aarch64).
On any other architecture the sandbox runs without it and says so (:func:`filter_status`), as it does for cgroups.
"""

from __future__ import annotations

import errno
import os
import platform
import struct
from dataclasses import dataclass

# Classic BPF, as the kernel's seccomp reads it (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = 32 bits of struct seccomp_data at offset k
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian hosts here)
_NR_OFFSET, _ARCH_OFFSET, _ARG0_LOW_OFFSET = 0, 4, 16
_ARG_SIZE = 8

# fcntl commands on kernel objects keyed by the file (linux/fcntl.h): F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK,
# F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY. The rest (descriptor flags, F_DUPFD, pipes) pass.
FCNTL_SHARED_OBJECT_CMDS = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)
FUTEX_PRIVATE_FLAG = 128  # a futex op without it is keyed by the mapping's file or by shared memory
RWF_NOWAIT = 0x8  # preadv2/pwritev2: fail rather than block, i.e. tell whether the pages are in the page cache
# Every CLONE_NEW* flag: NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
CLONE_NEW_FLAGS = 0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# What is denied, by the reason it is (docs/reward.md lists the same groups).
DENIED_GROUPS = {
    "kernel keyrings": ("add_key", "request_key", "keyctl"),
    "file-activity notification": ("inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init",
                                   "fanotify_mark"),
    "namespaces": ("unshare", "setns"),
    "process inspection": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
                           "perf_event_open"),
    "objects keyed by shared files": ("flock", "mincore", "fadvise64", "cachestat", "futex_waitv", "futex_wake",
                                      "futex_wait", "futex_requeue"),
    "kernel attack surface": ("bpf", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
                              "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig",
                              "fsmount", "fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at"),
}  # fmt: skip


@dataclass(frozen=True)
class Abi:
    name: str
    audit_arch: int  # AUDIT_ARCH_* of linux/audit.h
    numbers: dict[str, int]  # system-call numbers of this ABI
    x32_bit: int = 0  # x86-64: numbers with this bit set are the x32 ABI, under the same audit arch


# The 64-bit ABI's numbers (x86-64: arch/x86/entry/syscalls/syscall_64.tbl; aarch64: asm-generic/unistd.h).
_SHARED_NEW = {"pidfd_getfd": 438, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
               "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
               "clone3": 435, "mount_setattr": 442, "futex_waitv": 449, "cachestat": 451, "futex_wake": 454,
               "futex_wait": 455, "futex_requeue": 456}  # fmt: skip
ABIS = {
    "x86_64": Abi("x86_64", 0xC000003E, {
        "clone": 56, "ptrace": 101, "pivot_root": 155, "mount": 165, "umount2": 166, "add_key": 248,
        "request_key": 249, "keyctl": 250, "inotify_init": 253, "inotify_add_watch": 254, "unshare": 272,
        "inotify_init1": 294, "perf_event_open": 298, "fanotify_init": 300, "fanotify_mark": 301,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
        "process_vm_writev": 311, "kcmp": 312, "bpf": 321, "userfaultfd": 323, "mincore": 27, "fcntl": 72,
        "flock": 73, "futex": 202, "fadvise64": 221, "preadv2": 327, "pwritev2": 328, **_SHARED_NEW,
    }, x32_bit=0x40000000),
    "aarch64": Abi("aarch64", 0xC00000B7, {
        "inotify_init1": 26, "inotify_add_watch": 27, "umount2": 39, "mount": 40, "pivot_root": 41, "unshare": 97,
        "ptrace": 117, "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "perf_event_open": 241,
        "fanotify_init": 262, "fanotify_mark": 263, "name_to_handle_at": 264, "open_by_handle_at": 265,
        "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "bpf": 280,
        "userfaultfd": 282, "fcntl": 25, "flock": 32, "futex": 98, "fadvise64": 223, "mincore": 232,
        "preadv2": 286, "pwritev2": 287, **_SHARED_NEW,
    }),
}  # fmt: skip
_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def host_abi() -> Abi | None:
    machine = platform.machine().lower()
    return ABIS.get(_MACHINE_ALIASES.get(machine, machine))


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(abi: Abi) -> bytes:
    """The filter program for ``abi``, as the ``struct sock_filter`` array bubblewrap's ``--seccomp`` reads."""
    deny = _insn(_RET_K, _RET_ERRNO | errno.EPERM)
    program = [
        _insn(_LD_W_ABS, _ARCH_OFFSET),
        _insn(_JEQ_K, abi.audit_arch, jt=1),  # the host's ABI: go on; any other ABI: denied
        deny,
        _insn(_LD_W_ABS, _NR_OFFSET),
    ]
    if abi.x32_bit:
        program += [_insn(_JGE_K, abi.x32_bit, jf=1), deny]
    # clone3 passes its flags in memory the filter cannot read: ENOSYS makes the C library fall back to clone.
    program += [_insn(_JEQ_K, abi.numbers["clone3"], jf=1), _insn(_RET_K, _RET_ERRNO | errno.ENOSYS)]
    # clone: allowed unless a flag asks for a new namespace (A holds the call number again on the way past).
    program += [
        _insn(_JEQ_K, abi.numbers["clone"], jf=4),
        _insn(_LD_W_ABS, _ARG0_LOW_OFFSET),
        _insn(_JSET_K, CLONE_NEW_FLAGS, jf=1),
        deny,
        _insn(_RET_K, _RET_ALLOW),
    ]
    for group in DENIED_GROUPS.values():
        for name in group:
            if name in abi.numbers:  # aarch64 has no inotify_init (inotify_init1 covers it)
                program += [_insn(_JEQ_K, abi.numbers[name], jf=1), deny]
    # Calls denied for some arguments only. Each block ends in a return, so A (the call number) is reloaded nowhere.
    allow = _insn(_RET_K, _RET_ALLOW)
    fcntl = [_insn(_LD_W_ABS, _arg(1))]
    for command in FCNTL_SHARED_OBJECT_CMDS:
        fcntl += [_insn(_JEQ_K, command, jf=1), deny]
    program += _for_call(abi.numbers["fcntl"], fcntl + [allow])
    program += _for_call(abi.numbers["futex"],
                         [_insn(_LD_W_ABS, _arg(1)), _insn(_JSET_K, FUTEX_PRIVATE_FLAG, jf=1), allow, deny])
    for name in ("preadv2", "pwritev2"):  # flags are the sixth argument
        program += _for_call(abi.numbers[name], [_insn(_LD_W_ABS, _arg(5)), _insn(_JSET_K, RWF_NOWAIT, jf=1), deny,
                                                 allow])  # fmt: skip
    program.append(allow)
    return b"".join(program)


def _arg(index: int) -> int:
    """Offset of the low 32 bits of system-call argument ``index`` in struct seccomp_data (little-endian)."""
    return _ARG0_LOW_OFFSET + _ARG_SIZE * index


def _for_call(number: int, block: list[bytes]) -> list[bytes]:
    """``block`` for system call ``number`` (A holds the call number); any other call jumps past it."""
    return [_insn(_JEQ_K, number, jf=len(block)), *block]


def filter_fd(abi: Abi) -> int:
    """A fresh descriptor holding the filter program, at offset 0 (bubblewrap reads it to the end)."""
    fd = os.memfd_create("verl-pipe-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, build_filter(abi))
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def filter_status() -> str:
    """One line on what the filter denies here, or what is missing (for ``verl-pipe doctor`` and the warning)."""
    abi = host_abi()
    if abi is None:
        return (f"no seccomp filter: verl-pipe knows the system-call numbers of {', '.join(ABIS)} only, and this "
                f"machine is {platform.machine()!r}; sandboxed programs can use kernel keyrings, inotify/fanotify, "
                "new namespaces and ptrace (channels between samples the namespaces do not close)")  # fmt: skip
    groups = "; ".join(f"{reason}: {', '.join(names)}" for reason, names in DENIED_GROUPS.items())
    return (f"seccomp filter ({abi.name}, loaded by bubblewrap) denies {groups}; clone with CLONE_NEW* flags; "
            "clone3 (ENOSYS, the C library falls back to clone); fcntl's lock, lease and notify commands; futex "
            "operations that are not process-private; preadv2/pwritev2 with RWF_NOWAIT; system calls of any other "
            "ABI")
