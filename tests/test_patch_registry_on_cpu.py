"""The patch tables: every runtime change to verl is declared in one (the product's registry, or the benchmark's
own), matches the installed verl, and a correctness-critical one that no longer matches stops the run before it
starts (with one line that names the verl version, the patch and the fix)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap

import pytest

from verl_pipe import patching
from verl_pipe.bench.latency_hooks import LATENCY_MODEL_PATCHES
from verl_pipe.compat import SetupError, installed_verl_version
from verl_pipe.import_hooks import when_imported
from verl_pipe.patch_registry import PATCHES
from verl_pipe.patching import STATUS, CriticalPatchMissing, VerlPatch, apply_patches

EVERY_PATCH = PATCHES + LATENCY_MODEL_PATCHES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIRS = ("verl_pipe", "trainers", "reward_score")


def _sources() -> dict[str, str]:
    found = {}
    for folder in SOURCE_DIRS:
        for root, _dirs, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    with open(path, encoding="utf-8") as handle:
                        found[os.path.relpath(path, REPO)] = handle.read()
    return found


@pytest.mark.parametrize("patch", EVERY_PATCH, ids=lambda p: p.name)
def test_every_patch_matches_the_installed_verl_and_explains_itself(patch):
    assert patch.matches(), f"verl changed {patch.target}; re-read it, then update or drop patch {patch.name}"
    assert patch.why and patch.upstream
    assert patch.when in patching.ACTIVE_WHEN
    if patch.critical:
        assert patch.consequence, "a critical patch says what would silently go wrong without it"


def test_names_are_unique_and_every_patch_reports_its_calls():
    names = [patch.name for patch in EVERY_PATCH]
    assert len(names) == len(set(names))
    sources = _sources()
    reported = set()
    for text in sources.values():
        reported |= set(re.findall(r'\bfired\(\s*"([^"]+)"', text))
    assert reported <= set(names), f"fired() names no registered patch: {reported - set(names)}"
    # the tables' own text (a declaration's name= string) does not count as reporting
    code = "\n".join(re.sub(r'name="[^"]+"', "", text) for text in sources.values())
    for patch in EVERY_PATCH:  # the patch's code reports its calls by name (fired(), or through a helper)
        assert f'"{patch.name}"' in code, f"the code of {patch.name} never reports its calls"


def test_no_module_patches_verl_outside_the_tables():
    """Every module that marks a replacement of verl code is the home of some declared patch."""
    homes = {patch.apply_module for patch in EVERY_PATCH}
    for path, text in _sources().items():
        if "mark_patched(" in text and not path.endswith("patching.py"):
            module = path[:-3].replace(os.sep, ".").removesuffix(".__init__")
            module = re.sub(r"^(trainers|reward_score)\.", r"verl_pipe.\1.", module)
            assert module in homes, f"{path} patches verl but no patch table declares it"


def _stale(critical_when: str | None) -> VerlPatch:
    return VerlPatch(
        name="stale_test_patch",
        target=PATCHES[0].target,
        fingerprint="code verl never had",
        why="test",
        upstream="test",
        apply=lambda: pytest.fail("a patch that no longer matches must never be applied"),
        critical_when=critical_when,
        consequence="the test would train the wrong thing",
    )


def test_a_changed_critical_patch_stops_the_process_that_needs_it(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    monkeypatch.delenv("VERL_PIPE_ALLOW_UNPATCHED", raising=False)
    with pytest.raises(CriticalPatchMissing) as caught:
        apply_patches([_stale("cpu platform")])
    message = str(caught.value)
    assert f"verl {installed_verl_version()}" in message and "stale_test_patch" in message
    assert "VERL_PIPE_ALLOW_UNPATCHED=stale_test_patch" in message and "Fix:" in message
    assert STATUS.pop("stale_test_patch").startswith("skipped")


def test_a_changed_patch_only_warns_where_it_is_not_critical(monkeypatch, caplog):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)  # the critical condition does not hold here
    with caplog.at_level("WARNING", logger="verl_pipe"):
        assert apply_patches([_stale("cpu platform")]) == []
        assert apply_patches([_stale(None)]) == []
    assert sum("stale_test_patch" in r.message and "skipped" in r.message for r in caplog.records) == 2
    STATUS.pop("stale_test_patch")


def test_the_user_can_run_anyway_by_naming_the_patch(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    monkeypatch.setenv("VERL_PIPE_ALLOW_UNPATCHED", "other_patch, stale_test_patch")
    assert apply_patches([_stale("cpu platform")]) == []
    STATUS.pop("stale_test_patch")


def test_the_import_hook_lets_a_critical_refusal_through(tmp_path, monkeypatch, caplog):
    (tmp_path / "vp_hook_target_a.py").write_text("X = 1\n")
    (tmp_path / "vp_hook_target_b.py").write_text("X = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def refuse(_module):
        raise CriticalPatchMissing("verl changed under a critical patch")

    def crash(_module):
        raise RuntimeError("an ordinary bug in a hook")

    when_imported("vp_hook_target_a", refuse)
    when_imported("vp_hook_target_b", crash)
    with pytest.raises(SetupError, match="critical patch"):
        __import__("vp_hook_target_a")
    with caplog.at_level("WARNING", logger="verl_pipe"):
        assert __import__("vp_hook_target_b").X == 2  # an ordinary failure never breaks verl's import
    assert any("ordinary bug" in r.message for r in caplog.records)
    sys.modules.pop("vp_hook_target_a", None)
    sys.modules.pop("vp_hook_target_b", None)


def test_grpo_plus_refuses_to_start_when_a_patch_it_needs_changed(monkeypatch):
    import verl  # noqa: F401 - loads the plugin, which installs the registry in this process
    from omegaconf import OmegaConf

    from verl_pipe.algorithms.config import validate_actor_for_grpo_plus

    actor = OmegaConf.create({"loss_agg_mode": "token-mean", "policy_loss": {"loss_mode": "grpo_plus"}})
    validate_actor_for_grpo_plus(actor)  # control: today's verl matches
    name = "grpo_plus_overlong_mask_before_token_count"
    broken = dataclasses.replace(patching.INSTALLED[name], fingerprint="code verl never had")
    monkeypatch.setitem(patching.INSTALLED, name, broken)
    with pytest.raises(CriticalPatchMissing, match=name):
        validate_actor_for_grpo_plus(actor)


def test_the_critical_checks_are_never_vacuous(monkeypatch):
    """A process in which no table was installed cannot vouch for GRPO+'s patches: it refuses, naming the fix."""
    monkeypatch.setattr(patching, "INSTALLED", {})
    with pytest.raises(CriticalPatchMissing, match="no patch for 'grpo_plus' is installed"):
        patching.require_patches("grpo_plus")
    with pytest.raises(CriticalPatchMissing, match="no patch for 'grpo_plus' is installed"):
        patching.refuse_if_skipped("grpo_plus")


def test_the_grpo_plus_loss_refuses_where_its_patch_was_skipped(monkeypatch):
    """The backstop in the worker: a process that skipped a GRPO+ patch never computes a GRPO+ loss."""
    import torch

    from verl_pipe.algorithms.policy_loss import compute_policy_loss_grpo_plus

    monkeypatch.setitem(STATUS, "grpo_plus_rollout_log_probs_to_loss", "skipped: verl's code changed")
    zeros = torch.zeros(1, 3)
    with pytest.raises(CriticalPatchMissing, match="grpo_plus_rollout_log_probs_to_loss"):
        compute_policy_loss_grpo_plus(zeros, zeros, zeros, torch.ones(1, 3), config={"policy_loss": {}})


# Loaded by Python at start-up (sitecustomize on PYTHONPATH), before verl: the stock command line then runs
# against a registry in which one fingerprint no longer matches verl's code, as after a verl upgrade.
BREAK_ONE_FINGERPRINT = textwrap.dedent(
    """
    import dataclasses, os
    import verl_pipe.patch_registry as registry

    registry.PATCHES = tuple(
        dataclasses.replace(p, fingerprint="code verl never had") if p.name == os.environ["BROKEN_PATCH"] else p
        for p in registry.PATCHES
    )
    """
)


@pytest.mark.parametrize(
    "broken,refuses", [("pi_old_snapshot_copies_host_params", True), ("step_metrics@trainer_base", False)]
)
def test_a_verl_run_refuses_to_start_naming_the_patch(tmp_path, broken, refuses):
    """``python -m verl.trainer.main_ppo`` on the CPU backend: a changed critical patch ends the driver at once."""
    (tmp_path / "sitecustomize.py").write_text(BREAK_ONE_FINGERPRINT)
    env = dict(os.environ, VERL_PLATFORM="cpu", BROKEN_PATCH=broken, PYTHONPATH=str(tmp_path))
    env.pop("VERL_PIPE_ALLOW_UNPATCHED", None)
    out = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "--help"], env=env, capture_output=True, text=True, timeout=300
    )
    if refuses:
        assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
        lines = [line for line in out.stderr.splitlines() if line.startswith("verl-pipe:")]
        assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
        assert broken in lines[0] and f"verl {installed_verl_version()}" in lines[0]
        assert "VERL_PIPE_ALLOW_UNPATCHED" in lines[0]
    else:  # a non-critical patch does not stop the run (hydra's --help then exits normally)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "Powered by Hydra" in out.stdout
