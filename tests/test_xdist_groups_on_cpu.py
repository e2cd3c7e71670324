"""`make test` runs the main tier on 2 pytest-xdist workers (tests/conftest.py): the end-to-end tests one after
another on one worker, the unit tests on the other, and a ``quiet`` test with nothing beside it.

An inner session with the suite's conftest, on 2 workers, logs when and where each test ran. Controls: without
the conftest's scheduler, xdist 3.8's own ``loadgroup`` spreads the end-to-end tests over both workers (it groups
by a nodeid suffix pytest 9 no longer reads); with the quiet test taking the workers' lock shared, as every other
test does, it overlaps the unit tests still running on the other worker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))

INNER = """
import os, time
import pytest

def _ran(name, seconds):
    start = time.time()
    time.sleep(seconds)
    with open({log!r}, "a") as fh:
        fh.write(f"{{name}} {{os.environ['PYTEST_XDIST_WORKER']}} {{start}} {{time.time()}}\\n")

@pytest.mark.parametrize("i", range(4))
def test_end_to_end(i, verl_runner):
    _ran(f"e2e{{i}}", 0.5)

@pytest.mark.parametrize("i", range(8))
def test_unit(i):
    _ran(f"unit{{i}}", 0.5)

@pytest.mark.quiet
def test_timed():
    _ran("timed", 1.5)
"""


def _inner(tmp_path, name: str, scheduler: bool = True, exclusive: bool = True) -> dict[str, tuple[str, float, float]]:
    """Each test's (worker, start, end) in an inner session on 2 workers."""
    folder = tmp_path / name
    folder.mkdir()
    conftest = open(os.path.join(TESTS, "conftest.py")).read()
    if not scheduler:
        conftest = conftest.replace("def pytest_xdist_make_scheduler(", "def _not_a_hook(")
    if not exclusive:
        assert conftest.count("fcntl.LOCK_EX") == 2
        conftest = conftest.replace("fcntl.LOCK_EX", "fcntl.LOCK_SH")
    (folder / "conftest.py").write_text(conftest)
    for helper in ("prerequisites.py", "progress_log.py"):  # what conftest imports
        shutil.copy(os.path.join(TESTS, helper), folder / helper)
    log = str(folder / "ran.log")
    (folder / "test_inner.py").write_text(INNER.format(log=log))
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    e2e: end to end\n    quiet: alone\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_inner.py", "-p", "no:cacheprovider", "-q", "-n", "2",
                           "--dist", "loadgroup", "--rootdir", str(folder)], cwd=folder, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = {}
    for line in open(log):
        test, worker, start, end = line.split()
        ran[test] = (worker, float(start), float(end))
    return ran


def _overlaps(ran, test: str) -> list[str]:
    _, start, end = ran[test]
    return [other for other, (_, s, e) in ran.items() if other != test and s < end and e > start]


def test_end_to_end_tests_share_one_worker_and_a_quiet_test_runs_alone(tmp_path):
    ran = _inner(tmp_path, "grouped")
    e2e = sorted(name for name in ran if name.startswith("e2e"))
    assert len({ran[name][0] for name in e2e}) == 1, ran  # one worker, one test at a time...
    assert not [other for name in e2e for other in _overlaps(ran, name) if other.startswith("e2e")], ran
    assert [other for name in e2e for other in _overlaps(ran, name) if other.startswith("unit")], ran  # ...beside the unit tests
    assert _overlaps(ran, "timed") == [], ran

    spread = _inner(tmp_path, "xdist_loadgroup", scheduler=False)
    assert len({spread[name][0] for name in e2e}) == 2, spread
    beside = _inner(tmp_path, "shared_lock", exclusive=False)
    assert _overlaps(beside, "timed"), beside
