"""The suite's own leak checks (tests/conftest.py) fail on a planted leak, and pass a clean test beside it.

An inner pytest session runs with the suite's conftest: an end-to-end test (one that asks for ``verl_runner``)
that leaves an orphaned segment in /dev/shm, as a SIGKILLed weight sender does, fails at teardown and the segment
is removed; a clean one beside it passes. A module-scoped run's orphan, which the per-test check cannot see (the
run is made before its first look), fails the session at its end. The Ray-head check has its own planted actor
in test_local_jobs_on_cpu.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

PER_TEST = """
import os

def test_leaves_an_orphan(verl_runner):
    with open({path!r}, "wb") as fh:  # created, written and closed: no process maps or holds it
        fh.write(b"weights" * 1000)

def test_clean(verl_runner):
    pass
"""

MODULE_RUN = """
import pytest

@pytest.fixture(scope="module")
def shared_run():
    with open({path!r}, "wb") as fh:
        fh.write(b"weights" * 1000)

def test_reads_the_run(shared_run, verl_runner):
    pass
"""


def _inner(tmp_path, body: str, path: str) -> subprocess.CompletedProcess:
    for helper in ("conftest.py", "prerequisites.py", "progress_log.py"):
        shutil.copy(os.path.join(TESTS, helper), tmp_path / helper)
    (tmp_path / "test_inner.py").write_text(body.format(path=path))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    e2e: end to end\n")
    return subprocess.run([sys.executable, "-m", "pytest", "test_inner.py", "-p", "no:cacheprovider", "-q",
                           "--rootdir", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.fixture
def planted():
    """The path of a segment a test will plant in /dev/shm; removed afterwards if the check under test did not."""
    path = os.path.join("/dev/shm", f"psm_vp_planted_{uuid.uuid4().hex[:8]}")
    yield path
    if os.path.exists(path):
        os.unlink(path)


def test_a_test_that_leaves_an_orphan_fails_and_the_orphan_goes(tmp_path, planted):
    done = _inner(tmp_path, PER_TEST, planted)
    # the leaking test's call passed and its teardown errs; the clean one passes
    assert "2 passed" in done.stdout and "1 error" in done.stdout, done.stdout[-3000:]
    assert "ERROR at teardown of test_leaves_an_orphan" in done.stdout, done.stdout[-3000:]
    assert f"left 1 orphaned segment(s) in /dev/shm (removed now): {os.path.basename(planted)}" in done.stdout
    assert not os.path.exists(planted)


def test_a_shared_runs_orphan_fails_the_session(tmp_path, planted):
    done = _inner(tmp_path, MODULE_RUN, planted)
    assert done.returncode == 1 and "1 passed" in done.stdout, done.stdout[-3000:]
    assert "orphaned segments left in /dev/shm by this session (removed)" in done.stdout, done.stdout[-3000:]
    assert f"{os.path.basename(planted)}: first seen after test_inner.py::test_reads_the_run" in done.stdout
    assert not os.path.exists(planted)
