"""Every documented ``make demo`` line builds, in every trainer mode, a run that verl and the mode accept.

The lines are read from the pages (:mod:`readme_demo`) and parsed by ``verl-pipe quickstart``'s own parser, as the
Makefile passes them; a line that names no mode is tried with each ``--mode``. Each config must validate (flags),
select the mode it names, and pass the recipes' dry run: verl's schema and dataclasses, its trainer registry and
the pipelined modes' own start-up checks. That a documented line also starts, validates and trains is shown by
launching the first screen's ``make demo`` in every mode on its default engine (tests/e2e/test_vllm_e2e_on_cpu.py).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_demo import first_screen_demo, readme_demo_commands  # noqa: E402

from verl_pipe import quickstart  # noqa: E402
from verl_pipe.quickstart import TRAINER_MODES, training_overrides  # noqa: E402


def _cases():
    for command in readme_demo_commands():
        config = command.config()
        if any(arg.startswith("--mode") for arg in command.args):  # the line names its mode
            yield pytest.param(command, config.mode, id=f"{command.line} [{config.mode}]")
        else:
            for mode in TRAINER_MODES:
                yield pytest.param(command.with_args(f"--mode={mode}"), mode, id=f"{command.line} [--mode={mode}]")


def test_the_first_screen_has_the_demo_on_its_default_engine():
    command = first_screen_demo()
    assert command.args == () and command.rollout == "vllm", command
    assert len(readme_demo_commands()) >= 4, "the documented demo lines (engines, a mode, hydra overrides) went missing"


@pytest.mark.parametrize("command, mode", list(_cases()))
def test_every_readme_demo_line_composes_in_every_mode(command, mode, monkeypatch):
    from verl_pipe.recipe_check import RecipeContext, dry_run

    # vLLM is in .venv-vllm, not in this suite's venv; that the line runs on it is the vLLM suite's launch
    monkeypatch.setattr(quickstart, "require_vllm", lambda: None)
    config = command.config()
    config.validate()
    assert config.mode == mode, command
    overrides = training_overrides(config, "/models/m", "/d/train.parquet", "/d/val.parquet", "/runs/r")
    summary = dry_run(overrides, RecipeContext(recipe="quickstart_cpu", check_paths=False))
    assert summary.trainer_mode == mode and summary.device == "cpu", summary
