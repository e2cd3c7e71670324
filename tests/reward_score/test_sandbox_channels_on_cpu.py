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
import threading
import time

import pytest

from verl_pipe.reward_score.sandbox import SandboxConfig, SandboxSession, seccomp
from verl_pipe.reward_score.sandbox import session as session_module

ABI = seccomp.host_abi()
pytestmark = pytest.mark.skipif(ABI is None, reason=seccomp.filter_status())

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
