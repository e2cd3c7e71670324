"""Bad setups end with one clear line that names the fix, not a traceback hundreds of lines deep."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from packaging.version import Version

from verl_pipe import cli


def _stderr_lines(text: str) -> list[str]:
    return [
        line for line in text.splitlines() if line.strip() and "Warning" not in line and "warnings.warn" not in line
    ]


def test_gpu_less_machine_without_verl_platform_names_the_variable():
    """verl would otherwise fall back to CUDA and die much later inside NCCL with an unrelated error."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo"], env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode != 0
    # verl's own log line about the fallback may precede ours; no traceback may follow.
    lines = [line for line in _stderr_lines(out.stderr) if not line.startswith(("INFO", "WARNING"))]
    assert len(lines) == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert "VERL_PLATFORM=cpu" in lines[0] and lines[0].startswith("verl-pipe:")


def test_missing_model_path_is_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["quickstart", "--model", str(tmp_path / "no-such-model"), "--out-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-model" in err[0] and "does not exist" in err[0]


def test_unsupported_verl_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("verl_pipe.compat.installed_verl_version", lambda: Version("0.8.0"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["quickstart", "--model", "tiny", "--out-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "verl 0.8.0 is not supported" in err[0] and "pip install" in err[0]


def test_missing_bubblewrap_is_one_line(capsys, monkeypatch, tmp_path):
    """The code reward runs programs in bubblewrap; without it the demo must stop before training starts."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on this PATH
    monkeypatch.delenv("VERL_PIPE_SANDBOX_ALLOW_UNISOLATED", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["quickstart", "--model", "tiny", "--out-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bubblewrap" in err[0] and "apt-get install -y bubblewrap" in err[0]


def test_bad_quickstart_setting_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["quickstart", "--samples-per-prompt", "1"])
    assert "samples_per_prompt" in capsys.readouterr().err


def test_bad_bench_pipeline_setting_is_one_line_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "pipeline", "--profiles", "math", "--max-cpu-share", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-cpu-share" in err[0] and "Traceback" not in err[0]


def test_doctor_reports_registrations(capsys, monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "(supported)" in out and "registered rollout: hf" in out and "bubblewrap: /" in out
