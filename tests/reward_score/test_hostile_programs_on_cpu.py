"""Hostile programs: each earns 0 and leaves the host as it was (checked after the run).

Every attack is written so that it prints the right answer *only if the attack worked*; a score of 0 is then
proof that it did not, and the host-side checks after the run prove nothing leaked out.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from verl_pipe.reward_score import compute_score
from verl_pipe.reward_score.sandbox import SandboxConfig
from verl_pipe.reward_score.sandbox.isolation import TESTS_UID_OFFSET

# The uids this test process's sandboxes run as (see isolation.sandbox_uid): a block of 64 keyed by our pid.
_BLOCK = SandboxConfig().uid_base + (os.getpid() % (1 << 20)) * 64
SANDBOX_UIDS = {*range(_BLOCK, _BLOCK + 64), *range(_BLOCK + TESTS_UID_OFFSET, _BLOCK + TESTS_UID_OFFSET + 64)}


def fenced(code: str) -> str:
    return "```python\n" + textwrap.dedent(code).strip() + "\n```"


def stdin_tests(expected: str, count: int = 1) -> str:
    return json.dumps([{"input": "", "output": expected, "testtype": "stdin"}] * count)


def processes_of_sandbox_uids() -> list[tuple[int, int]]:
    """(pid, uid) of every host process running as a sandbox uid (only meaningful when we run as root)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as handle:
                uid = int(next(line for line in handle if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration):
            continue
        if uid in SANDBOX_UIDS:
            found.append((int(entry), uid))
    return found


@pytest.fixture
def host_is_clean():
    """After the test: no process of any sandbox uid survives on the host."""
    yield
    if os.geteuid() != 0:
        return  # as a normal user the sandbox runs under our own uid; the pid-namespace test covers it
    deadline = time.monotonic() + 3
    while processes_of_sandbox_uids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of_sandbox_uids() == []


def score(code: str, expected: str, **kwargs) -> dict:
    return compute_score("livecodebench", fenced(code), stdin_tests(expected), **kwargs)


def test_fork_bomb(host_is_clean):
    """Guards against RLIMIT_NPROC not holding (e.g. for uid 0) so a fork bomb takes the machine down."""
    code = """
    import os
    children = 0
    for _ in range(100000):
        try:
            if os.fork() == 0:
                while True:
                    pass
            children += 1
        except OSError:
            break
    print("forked", children)
    """
    result = score(code, "forked 100000", timeout=2)
    assert result["score"] == 0.0 and result["outcome"] in ("wrong_answer", "timeout")


def test_memory_bomb(host_is_clean):
    """Guards against a program allocating the host's memory away (RLIMIT_AS)."""
    code = """
    blocks = []
    for _ in range(64):
        blocks.append(bytearray(1 << 28))
    print("allocated")
    """
    # A 512 MiB cap keeps the memory the bomb touches before the limit stops it (and so the test's time) small.
    result = score(code, "allocated", timeout=6, memory_mb=512)
    assert result["score"] == 0.0 and result["outcome"] == "runtime_error"


def test_a_gigabyte_of_output(host_is_clean):
    """Guards against unbounded output capture filling the host's memory or disk."""
    code = """
    import sys
    chunk = "x" * (1 << 20)
    for _ in range(1024):
        sys.stdout.write(chunk)
    print("done")
    """
    start = time.monotonic()
    result = score(code, "done", timeout=6)
    assert result["score"] == 0.0 and result["outcome"] in ("runtime_error", "wrong_answer")
    assert time.monotonic() - start < 8


def test_infinite_loop_and_ignored_alarm(host_is_clean):
    """Guards against timeouts that rely on signals the program can ignore (SIGALRM, SIGTERM)."""
    code = """
    import signal
    for sig in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT, signal.SIGXCPU):
        signal.signal(sig, signal.SIG_IGN)
    signal.alarm(1)
    while True:
        pass
    """
    start = time.monotonic()
    result = score(code, "never", timeout=1)
    assert result["outcome"] == "timeout" and time.monotonic() - start < 4


def test_sockets_to_loopback_and_outside(host_is_clean):
    """Guards against a sandbox with network access (exfiltration, or fetching answers)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    accepted: list[object] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set() and not accepted:
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

    watcher = threading.Thread(target=accept, daemon=True)
    watcher.start()
    code = f"""
    import socket
    reached = []
    for host, port in (("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)):
        try:
            socket.create_connection((host, port), timeout=1).close()
            reached.append(host)
        except OSError:
            pass
    print("reached", len(reached))
    """
    try:
        result = score(code, "reached 3", timeout=6)
        done.set()
        watcher.join()
    finally:
        listener.close()
    assert result["score"] == 0.0 and result["outcome"] == "wrong_answer"
    assert accepted == []


def test_writes_outside_the_work_dir_and_deleting_a_canary(tmp_path, host_is_clean):
    """Guards against a sandbox that can modify the host file system (checkpoints, datasets, code)."""
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "weights.bin").write_bytes(b"precious")
    targets = [str(tmp_path / "planted.txt"), "/usr/planted.txt", "/root/planted.txt", "/etc/planted.txt",
               os.path.join(os.getcwd(), "planted.txt")]  # fmt: skip
    code = f"""
    import os, shutil
    wins = 0
    for path in {targets!r}:
        try:
            with open(path, "w") as handle:
                handle.write("pwned")
            wins += 1
        except OSError:
            pass
    try:
        shutil.rmtree({str(canary)!r})
        wins += 1
    except OSError:
        pass
    with open("inside-work-dir.txt", "w") as handle:  # the private work dir is writable, and that is fine
        handle.write("ok")
    print("wins", wins)
    """
    result = score(code, f"wins {len(targets) + 1}", timeout=6)
    assert result["score"] == 0.0 and result["outcome"] == "wrong_answer"
    assert (canary / "weights.bin").read_bytes() == b"precious"
    assert not any(os.path.exists(path) for path in targets)


def test_killing_the_parent(host_is_clean):
    """Guards against a program taking the grader down and being scored on partial output."""
    code = """
    import os, signal
    print(42, flush=True)
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(1, signal.SIGKILL)
    """
    result = score(code, "42")
    assert result["score"] == 0.0 and result["outcome"] == "runtime_error"
    assert not result["sandbox_error"]


def test_double_forked_daemon_leaves_nothing_behind(host_is_clean):
    """Guards against a daemon that escapes the process group and outlives its test (stealing CPU, or feeding
    later tests): test 1 plants one, test 2 prints the expected answer only if it is still alive."""
    code = """
    import os, time
    if input() == "plant":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open("daemon.pid", "w") as handle:
                    handle.write(str(os.getpid()))
                time.sleep(120)
            os._exit(0)
        while not os.path.exists("daemon.pid"):
            time.sleep(0.01)
        print("planted")
    else:
        try:
            os.kill(int(open("daemon.pid").read()), 0)
            print("alive")
        except (OSError, ValueError):
            print("gone")
    """
    tests = json.dumps([{"input": "plant\n", "output": "planted", "testtype": "stdin"},
                        {"input": "check\n", "output": "alive", "testtype": "stdin"}])  # fmt: skip
    result = compute_score("livecodebench", fenced(code), tests, timeout=3)
    assert result["score"] == 0.0 and result["outcome"] == "wrong_answer" and result["tests_run"] == 2


def test_environment_is_scrubbed(monkeypatch, host_is_clean):
    """Guards against host secrets (API keys, tokens) being readable by model-written code."""
    secret = "sk-" + secrets.token_hex(12)
    monkeypatch.setenv("VP_TEST_API_KEY", secret)
    code = """
    import os
    print(os.environ.get("VP_TEST_API_KEY", "absent"))
    """
    result = score(code, secret)
    assert result["score"] == 0.0 and result["outcome"] == "wrong_answer"


SEARCH_DISK = """
import os
marker = "ans" + "wer-"  # built at run time so the program does not find its own source
found = None
for root, dirs, files in os.walk(SEARCH_ROOT):
    if root.startswith(("/proc", "/sys", "/dev", "/tmp/work")):
        dirs[:] = []
        continue
    for name in files:
        try:
            with open(os.path.join(root, name), "rb") as handle:
                data = handle.read(1 << 16)
        except OSError:
            continue
        at = data.find(marker.encode())
        if at >= 0:
            found = data[at:at + len(marker) + 32].decode(errors="replace")
            break
    if found:
        break
print(found or "nothing")
"""


def test_searching_the_disk_for_expected_outputs(tmp_path, host_is_clean):
    """Guards against expected outputs being reachable from inside the sandbox (reward hacking by lookup)."""
    answer = "answer-" + secrets.token_hex(16)
    (tmp_path / "expected.json").write_text(json.dumps({"output": answer}))
    # The same search, run on the host over the folder holding the answer, finds it: the program works.
    on_host = subprocess.run([sys.executable, "-c", SEARCH_DISK.replace("SEARCH_ROOT", repr(str(tmp_path)))],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    assert on_host.stdout.strip() == answer
    # The whole walk must finish: it takes 0.5-4 s, and one loaded run failed here at a 6 s limit with the outcome
    # unrecorded (the sandbox cannot see the answer's folder, so most likely the limit). The limit is now the
    # grader's longest, and a failure prints the result.
    result = score(SEARCH_DISK.replace("SEARCH_ROOT", '"/"'), answer, timeout=12)
    assert result["score"] == 0.0 and result["outcome"] == "wrong_answer", result


def test_exit_before_printing(host_is_clean):
    """Guards against os._exit(0) being read as a clean, successful run."""
    result = score("import os\nos._exit(0)\nprint(42)", "42")
    assert result["score"] == 0.0
