"""The package layout promised in DESIGN.md: top-level folders installed under our namespace, nothing squatted."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_trainers_and_reward_score_live_under_the_namespace():
    import verl_pipe.reward_score
    import verl_pipe.trainers

    assert verl_pipe.trainers.__file__ == os.path.join(REPO, "trainers", "__init__.py")
    assert verl_pipe.reward_score.__file__ == os.path.join(REPO, "reward_score", "__init__.py")


def test_wheel_installs_only_the_verl_pipe_namespace(tmp_path):
    """What `pip install verl-pipe` puts into site-packages: verl_pipe/ (with trainers and reward_score inside)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), REPO],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("verl_pipe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"verl_pipe"}, top_level
    assert "verl_pipe/trainers/__init__.py" in names and "verl_pipe/reward_score/__init__.py" in names
    assert "verl_pipe/config/verl_pipe/grpo_plus.yaml" in names  # the GRPO+ hydra preset ships in the wheel
    assert "verl_pipe/data/embedded/problems.jsonl" in names
    # Every module of the source tree ships (a subpackage missing from setup.py's list would not).
    for folder, installed_as in (("verl_pipe", "verl_pipe"), ("trainers", "verl_pipe/trainers"),
                                 ("reward_score", "verl_pipe/reward_score")):  # fmt: skip
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if name.endswith(".py"):
                    relative = os.path.relpath(os.path.join(root, name), os.path.join(REPO, folder))
                    assert f"{installed_as}/{relative}" in names, relative
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "verl_pipe = verl_pipe.register" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_this_suite_is_not_shadowed_by_site_packages_tests():
    """TransferQueue's wheel installs a top-level `tests` package; pytest must collect ours (importlib mode)."""
    assert os.path.dirname(os.path.abspath(__file__)) == os.path.join(REPO, "tests")
