"""Shared fixtures: the tiny model, and one Ray cluster for every end-to-end test in the session.

End-to-end tests run verl's stock entrypoint (``python -m verl.trainer.main_ppo``) as separate Ray *jobs*
against one cluster started here, so each run pays for actor start-up but not for a new cluster; when a job's
driver exits, Ray frees every actor it owned, so named actors never collide between runs.
"""

from __future__ import annotations

import contextlib
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from prerequisites import missing  # noqa: E402
PATCH_COVERAGE_TEST = "test_every_patch_applies_and_runs_in_the_end_to_end_runs"


def pytest_configure(config):
    """Every verl process of the session's runs records the patches it applied and called (the Ray cluster and
    each job inherit this environment); tests/e2e/test_patch_coverage_on_cpu.py reads the ledger at the end."""
    if not os.environ.get("VERL_PIPE_PATCH_LEDGER"):
        import tempfile

        os.environ["VERL_PIPE_PATCH_LEDGER"] = config._verl_pipe_own_ledger = tempfile.mkdtemp(
            prefix="verl_pipe_patch_ledger_"
        )


def pytest_unconfigure(config):
    own_ledger = getattr(config, "_verl_pipe_own_ledger", None)
    if own_ledger:  # made for this session (not handed in by the caller): read by now
        import shutil

        shutil.rmtree(own_ledger, ignore_errors=True)


# A test that asks for one of these runs in the session's Ray cluster (and most launch verl's entry point there):
# it is end to end, marked ``e2e``, and left out of ``make test-fast``. Tests that launch a verl job some other way
# carry the mark themselves.
E2E_FIXTURES = ("ray_cluster", "verl_runner")


def pytest_collection_modifyitems(session, config, items):
    """Mark the end-to-end tests; the patch-coverage test reads what every other run recorded, so it runs last."""
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in E2E_FIXTURES):
            item.add_marker(pytest.mark.e2e)
    last = [item for item in items if item.name == PATCH_COVERAGE_TEST]
    items[:] = [item for item in items if item.name != PATCH_COVERAGE_TEST] + last


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    from verl_pipe.models import build_tiny_qwen2

    return build_tiny_qwen2()


@pytest.fixture(scope="session")
def ray_cluster():
    """Address of a local Ray head with verl-pipe's CPU platform in every worker's environment."""
    from verl_pipe.local_jobs import local_ray_head

    with local_ray_head(num_cpus=16) as address:
        yield address


@pytest.fixture(autouse=True)
def _no_leftovers(request):
    """Around each end-to-end test: it leaves no orphan in /dev/shm."""
    if not any(name in request.fixturenames for name in E2E_FIXTURES):
        yield
        return
    from verl_pipe.shm import leakable_segments, remove_orphaned_segments

    before = leakable_segments()
    yield
    # a job's processes take a moment to go after its driver; what no live process maps or holds by then is an
    # orphan this test's runs left (the driver's own exit clean-up should have removed it)
    orphans = remove_orphaned_segments(before, wait_s=10.0)
    if orphans:
        pytest.fail(f"this test's runs left {len(orphans)} orphaned segment(s) in {_SHM} (removed now): "
                    f"{', '.join(os.path.basename(path) for path in orphans)}", pytrace=False)  # fmt: skip


@pytest.fixture(scope="session")
def verl_runner():
    """The function that runs verl's stock entrypoint as a child process (:func:`verl_pipe.local_jobs.run_verl_job`)."""
    from verl_pipe.local_jobs import run_verl_job

    return run_verl_job


def log_tail(path: str, lines: int = 60) -> str:
    with open(path, errors="replace") as fh:
        return "".join(fh.readlines()[-lines:])


@pytest.fixture(scope="session")
def tail_of():
    return log_tail


@pytest.fixture
def small_disk():
    """``mount(path, size)``: a tmpfs of ``size`` (e.g. ``"2500k"``) at ``path``, for a full disk with real ENOSPC;
    ``resize(path, size)`` grows it (the operator freeing space). Unmounted after the test. Needs root (CI runs as
    root); elsewhere the test is skipped, saying so."""
    from verl_pipe.chaos import mount_small_disk, resize_small_disk, unmount

    mounted: list[str] = []

    def mount(path: str, size: str) -> str:
        try:
            mount_small_disk(path, size)
        except PermissionError as error:
            missing(str(error))
        mounted.append(path)
        return path

    mount.resize = resize_small_disk
    yield mount
    for path in reversed(mounted):
        unmount(path)


# /dev/shm entries that appeared while a test ran, with the first test that saw them; those still there when the
# session ends are listed in its summary (a leak to trace: it outlives every run that could have made it).
_SHM = "/dev/shm"
_shm_first_seen: dict[str, str] = {}


def _shm_names() -> set[str]:
    try:
        return set(os.listdir(_SHM))
    except OSError:
        return set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _shm_names()
    yield
    for name in _shm_names() - before:
        _shm_first_seen.setdefault(name, item.nodeid)


# Figures tests measured, printed together at the end of the session (runs of different modes side by side).
_measured: list[str] = []


@pytest.fixture(scope="session")
def report_measurement():
    """``report_measurement(line)``: a line for the session summary's "measured in this session" section."""
    return _measured.append


_session_orphans: dict[str, str] = {}  # orphaned segment -> the first test after which it was seen


def pytest_sessionfinish(session, exitstatus):
    """An orphan of a verl job still in /dev/shm when the session ends fails the session (then it is removed): the
    per-test check (``_no_leftovers``) cannot see what a module's or the session's shared runs left, as they are
    made before that check's first look."""
    from verl_pipe.shm import leakable_segments, segments_in_use

    seen = {os.path.join(_SHM, name): test for name, test in _shm_first_seen.items()}
    candidates = leakable_segments() & set(seen)
    for path in sorted(candidates - segments_in_use(candidates)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            _session_orphans[os.path.basename(path)] = seen[path]
    if _session_orphans and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _measured:
        terminalreporter.write_sep("-", "measured in this session")
        for line in _measured:
            terminalreporter.write_line(line)
    if _session_orphans:
        terminalreporter.write_sep("!", f"FAILED: orphaned segments left in {_SHM} by this session (removed)")
        for name, test in sorted(_session_orphans.items()):
            terminalreporter.write_line(f"{name}: first seen after {test}")
    left = {name: test for name, test in _shm_first_seen.items() if os.path.exists(os.path.join(_SHM, name))}
    if left:
        terminalreporter.write_sep("-", f"left in {_SHM} by this session (not verl's segments, or still in use)")
        for name, test in sorted(left.items()):
            terminalreporter.write_line(f"{name}: first seen after {test}")


# A failed test is described the moment it fails, with the machine's state, not only in the session's summary: a
# CI run stopped at its time limit prints no summary, and its tail is all that is left to read (2026-12-02: a run
# stopped at 5400 s after ten end-to-end failures in a row, with nothing to say why).
FAILURE_TAIL_LINES = 40
_terminal_reporter = None


def _machine_state() -> str:
    """Memory available, /dev/shm in use and the live Ray workers: what a run of cascading failures points at."""
    parts = []
    try:
        with open("/proc/meminfo") as fh:
            available_kib = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:"))
        parts.append(f"MemAvailable {available_kib // 1024} MiB")
    except (OSError, StopIteration):
        pass
    try:
        shm = os.statvfs(_SHM)
        parts.append(f"{_SHM} used {(shm.f_blocks - shm.f_bfree) * shm.f_frsize // 2**20} MiB")
    except OSError:
        pass
    ray_processes = 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                ray_processes += fh.read(64).startswith(b"ray::")
        except OSError:
            continue
    parts.append(f"{ray_processes} ray:: processes alive")
    return "; ".join(parts)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    if not report.failed:
        return
    reporter = _terminal_reporter
    if reporter is None:
        return
    lines = report.longreprtext.splitlines()[-FAILURE_TAIL_LINES:]
    reporter.write_line("")
    reporter.write_sep("!", f"FAILED ({report.when}, {report.duration:.0f} s) {report.nodeid}")
    for line in lines:
        reporter.write_line(line)
    reporter.write_sep("!", _machine_state())


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    global _terminal_reporter
    _terminal_reporter = session.config.pluginmanager.get_plugin("terminalreporter")
