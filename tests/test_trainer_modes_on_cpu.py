"""The one table of trainer modes (verl_pipe/trainer_modes.py): everything that lists modes reads it, and what the
repo ships beside the code (presets, trainer classes, the recipes' shell) agrees with it."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re

import pytest

from verl_pipe.trainer_modes import TRAINER_MODES, TrainerMode, plugin_modes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_shipped_presets_are_exactly_the_plugins_modes():
    from verl_pipe.trainer_modes import preset_modes

    assert sorted(preset_modes()) == sorted(plugin_modes())


def test_each_plugin_modes_module_defines_its_trainer_under_that_name():
    """Read with ast (no verl import): the module the table names holds a class whose ``MODE`` is the mode."""
    for name in plugin_modes():
        module = TRAINER_MODES[name].module
        path = os.path.join(REPO, "trainers", module.rsplit(".", 1)[1] + ".py")
        tree = ast.parse(open(path, encoding="utf-8").read())
        modes = [node.value.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "MODE" for t in node.targets)
                 and isinstance(node.value, ast.Constant)]  # fmt: skip
        assert name in modes, f"{path} defines no trainer with MODE = {name!r} (found {modes})"


def test_the_recipes_shell_runs_exactly_the_plugins_modes_on_separate_pools():
    shell = open(os.path.join(REPO, "recipes", "common.sh"), encoding="utf-8").read()
    labels = re.findall(r"^\s+([\w |]+)\)\s*$", shell.split('case "$TRAINER_MODE" in', 1)[1], flags=re.M)
    cases = [sorted(label.replace(" ", "").split("|")) for label in labels]
    assert sorted(plugin_modes()) in cases, f"recipes/common.sh's case labels {cases} lack the plugin's modes"


@pytest.fixture
def dummy_mode(monkeypatch):
    """A mode added to the table alone (and given a what-if model, which a new schedule must bring)."""
    from verl_pipe.bench import pipeline

    mode = TrainerMode("dummy_pipeline", summary="a mode added in one place", separate_pools=True,
                       module="verl_pipe.trainers.dummy")  # fmt: skip
    monkeypatch.setitem(TRAINER_MODES, mode.name, mode)
    monkeypatch.setattr(pipeline, "MODELLED_MODES", (*pipeline.MODELLED_MODES, mode.name))
    return mode


def test_a_mode_added_to_the_table_reaches_quickstart_the_cli_and_the_bench(dummy_mode):
    from verl_pipe import cli
    from verl_pipe.bench.pipeline import benchmark_schedules
    from verl_pipe.quickstart import QuickstartConfig

    config = QuickstartConfig(mode="dummy_pipeline", sampler_ranks=2)
    config.validate()
    assert config.trainer_mode is dummy_mode and config.separate_sampler_ranks == 2  # separate pools, from the table
    args = cli.build_parser().parse_args(["quickstart", "--mode", "dummy_pipeline"])
    assert args.mode == "dummy_pipeline"
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        cli.build_parser().parse_args(["quickstart", "--help"])
    assert "dummy_pipeline" in help_text.getvalue() and "a mode added in one place" in help_text.getvalue()
    schedule = benchmark_schedules()["dummy_pipeline"]
    assert schedule.trainer_mode == "dummy_pipeline" and schedule.separate_pools


def test_a_mode_without_a_what_if_model_stays_out_of_the_bench(monkeypatch):
    from verl_pipe.bench.pipeline import benchmark_schedules

    monkeypatch.setitem(TRAINER_MODES, "unmodelled", TrainerMode("unmodelled", summary="", separate_pools=True))
    assert "verl_unmodelled" not in benchmark_schedules() and "verl_sync" in benchmark_schedules()
