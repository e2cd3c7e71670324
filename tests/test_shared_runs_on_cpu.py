"""A shared run that fails costs its consumers one failure each and is never re-run (tests/shared_runs.py).

Each case runs an inner pytest session on a fixture file: a session fixture whose run raises (or times out under
pytest-timeout), read by three tests. The control swaps in the old cache, which kept only results: there every
consumer runs the broken run again, and the test sees it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

INNER = """
import os, sys, time
import pytest
sys.path.insert(0, {tests!r})
from shared_runs import SharedRuns

class ResultsOnly:  # the cache before: a failure is not remembered, so each consumer makes the run again
    def __init__(self, name):
        self.results = {{}}
    def get(self, key, make):
        if key not in self.results:
            self.results[key] = make()
        return self.results[key]

STARTS = {starts!r}

@pytest.fixture(scope="session")
def shared_run():
    runs = {cache}("broken")

    def make():
        with open(STARTS, "a") as fh:
            fh.write("started\\n")
        {failure}

    return lambda: runs.get(("sync",), make)

@pytest.mark.timeout(2)
def test_reads_it_first(shared_run):
    shared_run()

@pytest.mark.timeout(2)
def test_reads_it_second(shared_run):
    shared_run()

@pytest.mark.timeout(2)
def test_reads_it_third(shared_run):
    shared_run()
"""

RAISES = "raise RuntimeError('the verl job exited 1')"
HANGS = "time.sleep(30)"


def _run_inner(tmp_path, cache: str, failure: str) -> tuple[int, str, int]:
    """(failed tests, the session's output, runs started)."""
    starts = tmp_path / "starts"
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(textwrap.dedent(INNER.format(tests=TESTS, starts=str(starts), cache=cache, failure=failure)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(test_file), "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    failed = re.search(r"(\d+) failed", done.stdout)
    started = len(starts.read_text().splitlines()) if starts.exists() else 0
    return int(failed.group(1)) if failed else 0, done.stdout, started


@pytest.mark.parametrize("failure", [RAISES, HANGS], ids=["raises", "times_out"])
def test_a_failed_shared_run_fails_each_consumer_once_and_is_not_run_again(tmp_path, failure):
    failed, output, started = _run_inner(tmp_path, "SharedRuns", failure)
    assert failed == 3, output
    assert started == 1, output
    # the later consumers name the run and repeat what the first one saw
    assert output.count("failed earlier in this session and is not run again") >= 2, output
    expected = "the verl job exited 1" if failure == RAISES else "Timeout"
    assert output.count(expected) >= 3, output


def test_control_a_cache_of_results_only_runs_the_broken_run_for_every_consumer(tmp_path):
    failed, output, started = _run_inner(tmp_path, "ResultsOnly", RAISES)
    assert failed == 3, output
    assert started == 3, output  # what the test above rules out
