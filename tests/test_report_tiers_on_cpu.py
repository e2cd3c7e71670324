"""`make test`'s closing summary (tests/report_tiers.py) read from real pytest JUnit reports: counts, times, the
slowest tests across tiers and every failure; a failed tier, or one that left no report, fails the run."""

from __future__ import annotations

import os
import subprocess
import sys

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
