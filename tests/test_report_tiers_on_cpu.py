"""`make test`'s closing summary (tests/report_tiers.py) read from real pytest JUnit reports: counts, times, the
slowest tests across tiers and every failure; a failed tier, or one that left no report, fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)
from report_tiers import main  # noqa: E402

INNER = """
import time, pytest
def test_passes():
    time.sleep(0.3)
def test_fails():
    assert 1 == 2
def test_skips():
    pytest.skip("not here")
"""


def _junit(tmp_path) -> str:
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = str(tmp_path / "inner.xml")
    subprocess.run([sys.executable, "-m", "pytest", "test_inner.py", "-p", "no:cacheprovider", "-q",
                    f"--junitxml={report}"], cwd=tmp_path, capture_output=True, timeout=120)  # fmt: skip
    return report


def test_the_summary_counts_times_and_names_each_failure(tmp_path, capsys):
    report = _junit(tmp_path)
    status = main(["--tier", "main", report, "1", "120", "--tier", "vllm", report, "0", "60"])
    out = capsys.readouterr().out
    assert status == 1  # the main tier failed
    assert "main:   2.0 min  FAILED (exit 1)  1 passed, 1 failed, 1 skipped" in out, out
    assert "vllm:   1.0 min  ok" in out, out
    assert "total:   3.0 min" in out, out
    slowest = out.split("slowest tests")[1].splitlines()[1]
    assert "test_passes" in slowest, out  # 0.3 s: the slowest of the three
    assert "[main] failed: test_inner::test_fails" in out and "[vllm] failed: test_inner::test_fails" in out, out


def test_a_tier_without_a_report_fails_the_run_even_if_its_status_says_0(tmp_path, capsys):
    report = _junit(tmp_path)
    assert main(["--tier", "main", str(tmp_path / "never_written.xml"), "0", "5"]) == 1
    assert "no readable report" in capsys.readouterr().out
    # control: the same tier with its report, status 0, and no failure in it passes
    passing = tmp_path / "passing.xml"
    passing.write_text(open(report).read().split("<testcase")[0] + "</testsuite></testsuites>")
    assert main(["--tier", "main", str(passing), "0", "5"]) == 0


HANGS = """
import time
def test_done():
    pass
def test_hangs():
    time.sleep(600)
"""


def _time_limited_tier(tmp_path, signal: str) -> tuple[int, str]:
    """A tier with a hanging test, run as `make test` runs a tier: on 2 pytest-xdist workers, under `timeout`, with
    the progress log, and the stop line the Makefile appends to it."""
    (tmp_path / "test_hangs.py").write_text(HANGS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = str(tmp_path / f"hangs_{signal}.xml")
    progress = str(tmp_path / f"hangs_{signal}.progress")
    argv = ["timeout", f"--signal={signal}", "--kill-after=60", "8", sys.executable, "-m", "pytest", "test_hangs.py",
            "-p", "no:cacheprovider", "-p", "progress_log", "-q", "-n", "2", f"--junitxml={report}"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=TESTS, VERL_PIPE_TEST_PROGRESS=progress)
    status = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=120).returncode
    with open(progress, "a") as fh:
        fh.write(f"{time.time():.1f}\tstop\t{status}\n")
    return status, report


def test_a_tier_stopped_at_its_time_limit_still_reports_what_ran(tmp_path, capsys):
    """The Makefile's time limit interrupts pytest (SIGINT), which still writes its report: the summary says the tier
    was stopped, counts the test that finished and names the one that had not. Control: killing pytest instead
    (SIGKILL, what a plain `timeout` or CI's limit does) leaves no report to read; the progress log, written as the
    tests go, still names the test that hung."""
    status, report = _time_limited_tier(tmp_path, "INT")
    assert status == 124
    assert main(["--tier", "main", report, str(status), "8"]) == 1
    out = capsys.readouterr().out
    assert "stopped at its time limit" in out and "1 passed" in out, out
    assert "unfinished when it stopped" in out and "test_hangs.py::test_hangs" in out, out
    assert "test_done" not in out.split("test tiers")[1], out  # a finished test is not named unfinished
    assert out.rstrip().splitlines()[-1].startswith(" total:"), out  # the tiers last, where a log's tail shows them
    status, report = _time_limited_tier(tmp_path, "KILL")
    assert status in (137, -9) and not os.path.exists(report)  # (timeout's group signal takes timeout too)
    assert main(["--tier", "main", report, str(status), "8"]) == 1
    out = capsys.readouterr().out
    assert "no readable report" in out and "unfinished when it stopped" in out and "::test_hangs" in out, out


NESTED = """
import os, subprocess, sys
def test_runs_a_session_of_its_own(tmp_path):
    (tmp_path / "test_nested.py").write_text("def test_nested():\\n    pass\\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "test_nested.py", "-p", "progress_log", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
"""


def test_a_session_a_test_starts_writes_nothing_into_the_tiers_progress_log(tmp_path):
    """The log is the tier's: a pytest session one of its tests starts (in its own folder, with the same plugin
    loaded) does not inherit it. (Inheriting it once crashed such inner sessions: the Makefile's path was relative.)"""
    (tmp_path / "test_outer.py").write_text(NESTED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    progress = tmp_path / "tier.progress"
    env = dict(os.environ, PYTHONPATH=TESTS, VERL_PIPE_TEST_PROGRESS=str(progress))
    done = subprocess.run([sys.executable, "-m", "pytest", "test_outer.py", "-p", "progress_log", "-p",
                           "no:cacheprovider", "-q"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    logged = [line.split("\t")[2] for line in progress.read_text().splitlines()]
    assert logged == ["test_outer.py::test_runs_a_session_of_its_own"] * 2, logged
