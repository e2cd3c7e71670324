"""Shared fixtures: the tiny model, and one Ray cluster for every end-to-end test in the session.

End-to-end tests run verl's stock entrypoint (``python -m verl.trainer.main_ppo``) as separate Ray *jobs*
against one cluster started here, so each run pays for actor start-up but not for a new cluster; when a job's
driver exits, Ray frees every actor it owned, so named actors never collide between runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from prerequisites import missing  # noqa: E402
import progress_log  # noqa: E402
PATCH_COVERAGE_TEST = "test_every_patch_applies_and_runs_in_the_end_to_end_runs"


def pytest_configure(config):
    """Every verl process of the session's runs records the patches it applied and called (the Ray cluster and
    each job inherit this environment); tests/e2e/test_patch_coverage_on_cpu.py reads the ledger at the end. Under
    pytest-xdist the controller makes the ledger, and the workers' shared folder, before it starts them."""
    config._verl_pipe_own_dirs = []
    progress_log.pytest_configure(config)  # each test's start and end as they happen, where make test asks for it
    if not os.environ.get("VERL_PIPE_PATCH_LEDGER"):
        os.environ["VERL_PIPE_PATCH_LEDGER"] = tempfile.mkdtemp(prefix="verl_pipe_patch_ledger_")
        config._verl_pipe_own_dirs.append(os.environ["VERL_PIPE_PATCH_LEDGER"])
    if config.pluginmanager.hasplugin("xdist") and config.getvalue("dist") != "no" and not hasattr(config, "workerinput"):
        os.environ[_XDIST_DIR_ENV] = tempfile.mkdtemp(prefix="verl_pipe_xdist_")
        config._verl_pipe_own_dirs.append(os.environ[_XDIST_DIR_ENV])


def pytest_unconfigure(config):
    import shutil

    for folder in getattr(config, "_verl_pipe_own_dirs", ()):  # made for this session (not handed in): read by now
        shutil.rmtree(folder, ignore_errors=True)


# A test that asks for one of these runs in the session's Ray cluster (and most launch verl's entry point there):
# it is end to end, marked ``e2e``, and left out of ``make test-fast``. Tests that launch a verl job some other way
# carry the mark themselves.
E2E_FIXTURES = ("ray_cluster", "verl_runner")


# Under pytest-xdist (`make test` runs the main tier on 2 workers), these run one after another on one worker: the
# end-to-end tests (one Ray cluster, and a verl job already uses both cores), the quiet tests, and the modules that
# plant, inspect or remove segments in /dev/shm, which a concurrent test's leak check would count as its own. The
# unit tests share the other worker, in the CPU a verl job leaves idle.
SERIAL_GROUP = "serial"
SERIAL_MODULES = (
    "tests/test_shm_on_cpu.py",
    "tests/test_leak_checks_on_cpu.py",
    "tests/reward_score/test_scoring_processes_on_cpu.py",
)
# Set by `make bench-smoke`: the tests marked bench_smoke run only then.
BENCH_SMOKE_ENV = "VERL_PIPE_BENCH_SMOKE"
# A folder the controller makes and its workers inherit: the serial tests' ids, the quiet tests' locks.
_XDIST_DIR_ENV = "VERL_PIPE_XDIST_DIR"


@pytest.hookimpl(tryfirst=True)  # under pytest 8, xdist's own hook reads the group marks after this one
def pytest_collection_modifyitems(session, config, items):
    """Mark the end-to-end tests and group what must run serially; the quiet tests run at the end, and the
    patch-coverage test, which reads what every other run recorded, last of all."""
    groups = []
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in E2E_FIXTURES):
            item.add_marker(pytest.mark.e2e)
        module = os.path.relpath(str(item.path), str(config.rootpath))
        if item.get_closest_marker("e2e") or item.get_closest_marker("quiet") or module in SERIAL_MODULES:
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))
        group = item.get_closest_marker("xdist_group")
        if group:
            groups.append(f"{item.nodeid}\t{group.args[0] if group.args else group.kwargs.get('name', 'default')}")
    if not os.environ.get(BENCH_SMOKE_ENV):  # `make bench-smoke` runs these; `make test` keeps a smoke of each
        benchmarks = [item for item in items if item.get_closest_marker("bench_smoke")]
        if benchmarks:
            config.hook.pytest_deselected(items=benchmarks)
            items[:] = [item for item in items if item not in benchmarks]
    # quiet tests late: by then the other worker has usually run out of tests, and none waits for them
    quiet = [item for item in items if item.get_closest_marker("quiet")]
    last = [item for item in items if item.name == PATCH_COVERAGE_TEST]
    items[:] = [item for item in items if item not in quiet and item not in last] + quiet + last
    if hasattr(config, "workerinput") and os.environ.get(_XDIST_DIR_ENV):
        path = os.path.join(os.environ[_XDIST_DIR_ENV], f"groups.{config.workerinput['workerid']}")
        with open(path + ".tmp", "w") as fh:
            fh.write("\n".join(groups))
        os.replace(path + ".tmp", path)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which a bare pytest run may not have
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the groups read from what the workers collected. (xdist 3.8 groups by a suffix it
    appends to ``item._nodeid``, which pytest 9 no longer reads: its own loadgroup runs every test ungrouped.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    folder = os.environ[_XDIST_DIR_ENV]

    class CollectedGroupScheduling(LoadGroupScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if "@" in nodeid:  # a pytest that still reads xdist's suffix
                return super()._split_scope(nodeid)
            if self.groups is None:  # read once every worker has collected (scheduling starts then)
                self.groups = {}
                for name in os.listdir(folder):
                    if name.startswith("groups.") and not name.endswith(".tmp"):
                        with open(os.path.join(folder, name)) as fh:
                            self.groups.update(line.split("\t") for line in fh.read().splitlines())
            return self.groups.get(nodeid, nodeid)

    return CollectedGroupScheduling(config, log)


def _quiet_locks(config) -> tuple[str, str] | None:
    """Under pytest-xdist, the lock files the workers share (none when the session runs in one process)."""
    folder = os.environ.get(_XDIST_DIR_ENV)
    if not hasattr(config, "workerinput") or not folder:
        return None
    return os.path.join(folder, "quiet.turnstile"), os.path.join(folder, "quiet.lock")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked ``quiet`` (it times itself against a model of this machine) runs with nothing beside it: it
    takes the workers' lock exclusively, every other test shares it. The turnstile keeps a stream of short tests
    on the other worker from starving it: once a quiet test waits, no new test starts."""
    locks = _quiet_locks(item.config)
    if locks is None:
        yield
        return
    turnstile, lock = (open(path, "a+") for path in locks)
    try:
        if item.get_closest_marker("quiet"):
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_SH)
        yield
    finally:
        turnstile.close()
        lock.close()


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


# What a test saw travels on its teardown report (user_properties), so that under pytest-xdist the controller, which
# prints the summary and makes the session's last check, has it too.
_SHM_APPEARED, _MEASURED = "verl_pipe_shm_appeared", "verl_pipe_measured"
_shm_before = pytest.StashKey[set]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_shm_before] = _shm_names()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when != "teardown":
        return
    report = outcome.get_result()
    for name in sorted(_shm_names() - item.stash.get(_shm_before, set())):
        report.user_properties.append((_SHM_APPEARED, name))
    while _pending_measurements:
        report.user_properties.append((_MEASURED, _pending_measurements.pop(0)))


# Figures tests measured, printed together at the end of the session (runs of different modes side by side).
_measured: list[str] = []
_pending_measurements: list[str] = []  # this test's, until its teardown report carries them


@pytest.fixture(scope="session")
def report_measurement():
    """``report_measurement(line)``: a line for the session summary's "measured in this session" section."""
    return _pending_measurements.append


_session_orphans: dict[str, str] = {}  # orphaned segment -> the first test after which it was seen


def pytest_sessionfinish(session, exitstatus):
    """An orphan of a verl job still in /dev/shm when the session ends fails the session (then it is removed): the
    per-test check (``_no_leftovers``) cannot see what a module's or the session's shared runs left, as they are
    made before that check's first look."""
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller checks, once every worker is done
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
    for key, value in report.user_properties:
        if key == _SHM_APPEARED:
            _shm_first_seen.setdefault(value, report.nodeid)
        elif key == _MEASURED:
            _measured.append(value)
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
