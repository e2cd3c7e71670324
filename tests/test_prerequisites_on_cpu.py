"""A missing prerequisite skips on a developer's machine and fails in CI (tests/prerequisites.py), both for a test
and for a whole module (the seccomp tests skip at import). The inner session stands in for a machine without
the piece; the control is the same session without ``VERL_PIPE_CI``, where it must skip."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

INNER = f"""
import sys
sys.path.insert(0, {TESTS!r})
from prerequisites import missing
{{module_level}}
def test_needs_a_piece():
    missing("bwrap cannot make a pid namespace here")
"""


def _outcome(tmp_path, ci: bool, module_level: bool) -> str:
    test_file = tmp_path / "test_inner.py"
    line = 'missing("seccomp: no filter on this kernel", allow_module_level=True)' if module_level else ""
    test_file.write_text(INNER.format(module_level=line))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "VERL_PIPE_CI"}
    if ci:
        env["VERL_PIPE_CI"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(test_file), "-p", "no:cacheprovider", "-q", "-rs", "--rootdir",
         str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize("module_level", [False, True], ids=["test", "module"])
def test_in_ci_a_missing_prerequisite_fails_and_names_it(tmp_path, module_level):
    out = _outcome(tmp_path, ci=True, module_level=module_level)
    assert re.search(r"\b1 (failed|error)\b", out), out
    assert "skipped" not in out, out
    assert "VERL_PIPE_CI=1 and a prerequisite of this test is missing" in out, out
    assert ("seccomp" if module_level else "pid namespace") in out, out


@pytest.mark.parametrize("module_level", [False, True], ids=["test", "module"])
def test_control_elsewhere_it_skips_saying_what_is_missing(tmp_path, module_level):
    out = _outcome(tmp_path, ci=False, module_level=module_level)
    assert re.search(r"\b1 skipped\b", out), out
    assert "failed" not in out and "error" not in out, out
    assert ("seccomp" if module_level else "pid namespace") in out, out
