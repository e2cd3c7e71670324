"""No channel between samples through kernel state the namespaces do not separate (the sandbox's seccomp filter).

Payloads written for this file, run in the real sandbox, each with its negative control (the same payload with
``SandboxConfig(seccomp=False)``, where it works):

* a sample leaves the answer in its uid's kernel keyring and a later sample that gets the same uid reads it;
* a sample watches a file every sandbox can read (inotify on the shared, read-only interpreter folder) and learns
  when, and how often, a concurrent sample opens it;
* a sample creates a user namespace, where it holds every capability;
* each denied group (:data:`~verl_pipe.reward_score.sandbox.seccomp.DENIED_GROUPS`) fails with EPERM, while what
  honest programs do (threads, fork, subprocesses, ctypes) still works under the filter.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prerequisites import missing  # noqa: E402

from verl_pipe.reward_score.sandbox import SandboxConfig, SandboxSession, seccomp
from verl_pipe.reward_score.sandbox import session as session_module

ABI = seccomp.host_abi()
if ABI is None:
    missing(f"seccomp: {seccomp.filter_status()}", allow_module_level=True)

SYSCALL_PRELUDE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def syscall(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(number, *args)
    return result, ctypes.get_errno()
"""


def run(program: str, cfg: SandboxConfig, timeout: float = 8.0) -> str:
    with SandboxSession(cfg) as box:
        assert box.load(SYSCALL_PRELUDE + program, mode="stdin") is None
        result = box.run_test(stdin="", timeout=timeout)
    assert result.completed, result.stderr
    return result.stdout.strip()


FILTERED, UNFILTERED = SandboxConfig(), SandboxConfig(seccomp=False)


# --- each group -----------------------------------------------------------------------------------------------------

def test_every_denied_call_fails_with_eperm_inside_the_sandbox():
    # zero arguments: enough for the filter to decide, and harmless should a call get through
    calls = {name: ABI.numbers[name] for group in seccomp.DENIED_GROUPS.values() for name in group
             if name in ABI.numbers}  # fmt: skip
    program = f"for name, number in {sorted(calls.items())!r}:\n    print(name, syscall(number, 0, 0, 0, 0)[1])\n"
    outcomes = dict(line.split() for line in run(program, FILTERED).splitlines())
    assert outcomes == {name: str(errno.EPERM) for name in calls}


CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000


def test_a_new_user_namespace_is_denied():
    """Inside a user namespace of its own a program holds every capability: attack surface none needs."""
    program = f"print(syscall({ABI.numbers['unshare']}, {CLONE_NEWUSER})[1])\n"
    assert run(program, FILTERED) == str(errno.EPERM)
    assert run(program, UNFILTERED) == "0", "the control: without the filter the namespace is created"
    # clone with a namespace flag is denied too, clone3 answers ENOSYS (its flags are out of the filter's sight)
    program = (f"print(syscall({ABI.numbers['clone']}, {CLONE_NEWNET | 17}, 0, 0, 0, 0)[1], "
               f"syscall({ABI.numbers['clone3']}, 0, 0)[1])\n")  # fmt: skip
    assert run(program, FILTERED) == f"{errno.EPERM} {errno.ENOSYS}"


def test_honest_programs_still_run_under_the_filter():
    program = """
import subprocess, sys, threading
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(4) as pool:
    squares = list(pool.map(lambda x: x * x, range(8)))
pid = os.fork()
if pid == 0:
    os._exit(3)
child = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
out = subprocess.run([sys.executable, "-I", "-S", "-c", "print(6 * 7)"], capture_output=True, text=True).stdout
print(sum(squares), child, out.strip())
"""
    assert run(program, FILTERED) == "140 3 42"


# --- channels between samples ---------------------------------------------------------------------------------------

KEY_SPEC_USER_KEYRING = -4
KEYCTL_SEARCH, KEYCTL_READ = 10, 11
LEAVE_THE_ANSWER = f"""
key = syscall({ABI.numbers['add_key']}, b"user", b"vp-answer", b"42", 2, {KEY_SPEC_USER_KEYRING})
print("left" if key[0] > 0 else "denied")
"""
READ_THE_ANSWER = f"""
found, err = syscall({ABI.numbers['keyctl']}, {KEYCTL_SEARCH}, {KEY_SPEC_USER_KEYRING}, b"user", b"vp-answer", 0)
if found > 0:
    buffer = ctypes.create_string_buffer(64)
    size, _ = syscall({ABI.numbers['keyctl']}, {KEYCTL_READ}, found, buffer, 64)
    print("read", buffer.raw[:size].decode())
else:
    print("nothing", err)
"""


def test_a_uids_keyring_carries_no_answer_to_the_next_sample_with_that_uid(monkeypatch):
    """uids come round again (64 slots per reward process); a key left in the user keyring outlives the sandbox."""
    uid = 200_000 + 63 * 64 + 63  # one fixed uid for both samples, as after the slots wrapped
    monkeypatch.setattr(session_module, "sandbox_uid", lambda cfg: uid + (0 if cfg.seccomp else 1))
    assert run(LEAVE_THE_ANSWER, UNFILTERED) == "left"
    assert run(READ_THE_ANSWER, UNFILTERED) == "read 42", "the control: the second sample reads the first's key"
    assert run(LEAVE_THE_ANSWER, FILTERED) == "denied"
    assert run(READ_THE_ANSWER, FILTERED).startswith("nothing")


IN_OPEN, IN_NONBLOCK = 0x20, 0o4000
# Watch a stdlib file every sandbox can read, then report whether another sample opened it within 4 s.
WATCH_A_SHARED_FILE = f"""
import json, select
target = os.path.join(os.path.dirname(json.__file__), "tool.py")
fd, err = syscall({ABI.numbers['inotify_init1']}, {IN_NONBLOCK})
if fd < 0:
    print("denied", err)
else:
    syscall({ABI.numbers['inotify_add_watch']}, fd, target.encode(), {IN_OPEN})
    print("watching", flush=True)
    print("seen" if select.select([fd], [], [], 4.0)[0] else "quiet")
"""
OPEN_THE_SHARED_FILE = """
import json, time
for _ in range(20):
    open(os.path.join(os.path.dirname(json.__file__), "tool.py")).close()
    time.sleep(0.1)
print("opened")
"""


def _watch_while_another_sample_opens(cfg: SandboxConfig) -> str:
    watched: list[str] = []
    watcher = threading.Thread(target=lambda: watched.append(run(WATCH_A_SHARED_FILE, cfg)))
    watcher.start()
    time.sleep(0.5)  # the watcher's sandbox is up and watching (it waits 4 s for an event)
    assert run(OPEN_THE_SHARED_FILE, cfg) == "opened"
    watcher.join(timeout=30)
    return watched[0].splitlines()[-1]


def test_file_activity_of_one_sample_is_not_visible_to_another():
    assert _watch_while_another_sample_opens(UNFILTERED) == "seen", "the control: the watcher sees the other's open"
    assert _watch_while_another_sample_opens(FILTERED) == f"denied {errno.EPERM}"


def test_the_filter_program_refuses_foreign_abis_first():
    """The program's first instructions check the audit arch: a call through another ABI (i386's int 0x80 on
    x86-64) has other numbers, which the list below would not catch."""
    program = seccomp.build_filter(ABI)
    first = [program[i : i + 8] for i in range(0, 24, 8)]
    assert first[0][:2] == (0x20).to_bytes(2, "little")  # load the arch field
    assert int.from_bytes(first[1][4:], "little") == ABI.audit_arch
    assert int.from_bytes(first[2][4:], "little") == 0x00050000 | errno.EPERM  # anything else: EPERM
    assert "\n" not in seccomp.filter_status() and ABI.name in seccomp.filter_status()


# --- kernel objects keyed by a file every sandbox shares, and global counters ------------------------------------
#
# Every sandbox binds the same interpreter tree read-only, so its files are the same inodes everywhere. A receiver
# and a sender run at once in two sandboxes; the receiver says whether it saw the sender. Each is shown working
# without the defence (the control) and refused with it.

SHARED_FILE = "import json, os\nTARGET = os.path.join(os.path.dirname(json.__file__), 'tool.py')\n"
BIG_SHARED_FILE = "import os, pydoc_data\nTARGET = os.path.join(os.path.dirname(pydoc_data.__file__), 'topics.py')\n"

RECORD_LOCK_RECEIVER = SHARED_FILE + """
import fcntl, struct, time
fd = os.open(TARGET, os.O_RDONLY)
probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 4242, 1, 0)  # would a write lock on byte 4242 conflict?
try:
    for _ in range(40):
        if struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, probe))[0] != fcntl.F_UNLCK:
            print("seen"); break
        time.sleep(0.1)
    else:
        print("quiet")
except OSError as error:
    print("denied", error.errno)
"""
RECORD_LOCK_SENDER = SHARED_FILE + """
import fcntl, time
fd = os.open(TARGET, os.O_RDONLY)
try:
    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 4242)  # a read lock on one byte of a read-only file
    time.sleep(3)
    print("sent")
except OSError as error:
    print("denied", error.errno)
"""

NOTIFY_RECEIVER = SHARED_FILE + """
import fcntl, signal, time
seen = []
signal.signal(signal.SIGIO, lambda *_: seen.append(1))
fd = os.open(os.path.dirname(TARGET), os.O_RDONLY)
try:
    fcntl.fcntl(fd, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)
    for _ in range(40):
        if seen:
            break
        time.sleep(0.1)
    print("seen" if seen else "quiet")
except OSError as error:
    print("denied", error.errno)
"""
READ_THE_SHARED_FILE = SHARED_FILE + """
import time
for _ in range(30):
    with open(TARGET, "rb") as handle:
        handle.read()
    time.sleep(0.1)
print("sent")
"""

FUTEX = """
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
address = libc.mmap(None, 4096, 1, 1, os.open(TARGET, os.O_RDONLY), 0)  # PROT_READ, MAP_SHARED
word = ctypes.c_uint32.from_address(address).value
"""
FUTEX_RECEIVER = SHARED_FILE + FUTEX + f"""
timeout = (ctypes.c_long * 2)(4, 0)
result, err = syscall({ABI.numbers['futex']}, ctypes.c_void_p(address), 0, word, timeout)  # FUTEX_WAIT, shared
print("seen" if result == 0 else ("quiet" if err == errno.ETIMEDOUT else f"denied {{err}}"))
"""
FUTEX_SENDER = SHARED_FILE + FUTEX + f"""
import time
for _ in range(30):
    result, err = syscall({ABI.numbers['futex']}, ctypes.c_void_p(address), 1, 1)  # FUTEX_WAKE one, shared
    if result < 0:
        print("denied", err); break
    time.sleep(0.1)
else:
    print("sent")
"""

RESIDENCY_RECEIVER = BIG_SHARED_FILE + f"""
import time
fd = os.open(TARGET, os.O_RDONLY)
size = os.fstat(fd).st_size
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
address = libc.mmap(None, size, 1, 2, fd, 0)  # PROT_READ, MAP_PRIVATE: touched by nobody here
pages = (size + 4095) // 4096
vector = (ctypes.c_ubyte * pages)()
def resident():
    result, err = syscall({ABI.numbers['mincore']}, ctypes.c_void_p(address), size, vector)
    if result < 0:
        raise OSError(err, "mincore")
    return sum(v & 1 for v in vector)
try:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # out of the page cache (nothing maps it)
    print("evicted", resident(), flush=True)
    for _ in range(40):
        if resident() > pages // 2:
            print("seen"); break
        time.sleep(0.1)
    else:
        print("quiet")
except OSError as error:
    print("denied", error.errno)
try:
    os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)  # the other probe: fails at once where not cached
    print("nowait read")
except BlockingIOError:
    print("nowait read")
except OSError as error:
    print("nowait denied", error.errno)
"""
READ_THE_BIG_SHARED_FILE = BIG_SHARED_FILE + """
import time
time.sleep(1.0)  # after the receiver's eviction
for _ in range(20):
    with open(TARGET, "rb") as handle:
        handle.read()
    time.sleep(0.1)
print("sent")
"""

PTY_RECEIVER = """
import time
def count():
    with open("/proc/sys/kernel/pty/nr") as handle:
        return int(handle.read())
try:
    before = count()
    for _ in range(40):
        if count() >= before + 8:
            print("seen"); break
        time.sleep(0.1)
    else:
        print("quiet")
except OSError as error:
    print("hidden", error.errno)
"""
PTY_SENDER = """
import time
try:
    held = [os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY) for _ in range(10)]
    time.sleep(3)
    print("sent")
except OSError as error:
    print("hidden", error.errno)
"""


def _receive_while_another_sends(receiver: str, sender: str, cfg: SandboxConfig) -> tuple[str, str]:
    received: list[str] = []
    listening = threading.Thread(target=lambda: received.append(run(receiver, cfg, timeout=12.0)))
    listening.start()
    time.sleep(0.5)  # the receiver's sandbox is up (it listens for 4 s)
    sent = run(sender, cfg, timeout=12.0)
    listening.join(timeout=30)
    return received[0], sent


CHANNELS = {  # name: (receiver, sender, what the receiver says under the defence)
    "record lock": (RECORD_LOCK_RECEIVER, RECORD_LOCK_SENDER, f"denied {errno.EPERM}"),
    "directory notification": (NOTIFY_RECEIVER, READ_THE_SHARED_FILE, f"denied {errno.EPERM}"),
    "futex in a file mapping": (FUTEX_RECEIVER, FUTEX_SENDER, f"denied {errno.EPERM}"),
    "page-cache residency": (RESIDENCY_RECEIVER, READ_THE_BIG_SHARED_FILE, f"denied {errno.EPERM}"),
    "pty counter": (PTY_RECEIVER, PTY_SENDER, f"hidden {errno.ENOENT}"),
}
# The defence each channel meets: the seccomp filter, or /proc/sys and /dev/pts hidden.
DEFENCE_OFF = {name: SandboxConfig(hide_global_counters=False) if name == "pty counter" else UNFILTERED
               for name in CHANNELS}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CHANNELS))
def test_no_kernel_object_or_global_counter_carries_a_signal_between_concurrent_samples(name):
    receiver, sender, refused = CHANNELS[name]
    received, _ = _receive_while_another_sends(receiver, sender, DEFENCE_OFF[name])
    assert received.splitlines()[-2 if name == "page-cache residency" else -1] == "seen", (
        f"the control: without the defence the receiver sees the sender ({received!r})")  # fmt: skip
    received, sent = _receive_while_another_sends(receiver, sender, FILTERED)
    lines = received.splitlines()
    assert refused in lines, received
    if name == "page-cache residency":
        assert lines[-1] == f"nowait denied {errno.EPERM}", received
    assert sent == "sent" or sent.startswith(("denied", "hidden")), sent
