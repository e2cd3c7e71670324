"""The CPU monkeypatches: each still matches the verl code it replaces, is version-guarded, and does its job.

If verl changes one of the patched functions, ``test_every_patch_still_matches_verl`` fails here first, and at
run time the patch is skipped with a WARNING instead of being applied blindly (none of these is
correctness-critical: without one, the CPU run fails loudly).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from packaging.version import Version

from verl_pipe.compat import SetupError, check_verl_version
from verl_pipe.patch_registry import PATCHES
from verl_pipe.patching import VerlPatch, apply_patches, is_patched

CPU_PATCHES = tuple(patch for patch in PATCHES if patch.when == "cpu platform")


def apply_cpu_patches() -> list[str]:
    return apply_patches(CPU_PATCHES)


@pytest.mark.parametrize("patch", CPU_PATCHES, ids=lambda p: p.name)
def test_every_patch_still_matches_verl(patch):
    assert patch.matches(), f"verl changed {patch.target}; re-read it and update or drop patch {patch.name}"
    assert patch.upstream, "every patch names the upstream fix it stands in for"


@pytest.mark.parametrize(
    "version,ok", [("0.9.1", True), ("0.9.7", True), ("0.9.0", False), ("0.10.0", False), ("0.8.2", False)]
)
def test_version_range(version, ok):
    if ok:
        assert check_verl_version(Version(version)) == Version(version)
    else:
        with pytest.raises(SetupError, match=r"verl\[verl-core\]>=0.9.1,<0.10"):
            check_verl_version(Version(version))


def test_unsupported_verl_applies_nothing(monkeypatch):
    monkeypatch.setattr("verl_pipe.compat.installed_verl_version", lambda: Version("0.10.2"))
    with pytest.raises(SetupError, match="not supported"):
        apply_cpu_patches()


def test_patches_are_idempotent_and_marked():
    first = apply_cpu_patches()
    second = apply_cpu_patches()
    assert first == second == [p.name for p in CPU_PATCHES]
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.utils import distributed
    from verl.workers import engine_workers

    assert is_patched(ResourcePoolManager._check_resource_available)
    assert is_patched(distributed.initialize_global_process_group_ray)
    # engine_workers imported the function by name; the rebinding must reach it too.
    assert engine_workers.initialize_global_process_group_ray is distributed.initialize_global_process_group_ray


def test_resource_check_counts_cpus(monkeypatch):
    """Guards: verl's check counting only GPUs and rejecting every CPU pool."""
    apply_cpu_patches()
    import ray
    from verl.single_controller.ray.base import ResourcePoolManager

    manager = ResourcePoolManager(resource_pool_spec={"global_pool": [2]}, mapping={})
    monkeypatch.setattr(ray._private.state, "available_resources_per_node", lambda: {"node": {"CPU": 2.0}})
    manager._check_resource_available()
    monkeypatch.setattr(ray._private.state, "available_resources_per_node", lambda: {"node": {"CPU": 1.0}})
    with pytest.raises(ValueError, match="ray_kwargs.ray_init.num_cpus"):
        manager._check_resource_available()


GLOO_INIT = r"""
import os, sys
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
import verl, torch.distributed as dist
from verl.utils.distributed import initialize_global_process_group_ray
try:
    initialize_global_process_group_ray()
    print("BACKEND", dist.get_backend())
except Exception as e:
    print("FAILED", type(e).__name__, e)
"""


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.parametrize("plugins,expect", [("auto", "BACKEND cpu:gloo"), ("none", "FAILED")])
def test_process_group_on_cpu_needs_the_patch(plugins, expect):
    """With the plugin the process group comes up on gloo; without it verl's "cpu:gloo,cpu:gloo" is rejected."""
    env = dict(os.environ, VERL_PLATFORM="cpu", VERL_USE_EXTERNAL_PLUGINS=plugins)
    if plugins == "none":
        # verl alone does not know the cpu platform; register it by hand but leave verl's function unpatched.
        code = GLOO_INIT.replace(
            "import verl,",
            "import verl\nfrom verl_pipe.backends.cpu.platform import register_platform; register_platform()\nimport",
        )
    else:
        code = GLOO_INIT
    out = subprocess.run(
        [sys.executable, "-c", code, _free_port()], env=env, capture_output=True, text=True, timeout=180
    )
    assert expect in out.stdout, out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize("world_size,expect", [("1", "BACKEND cpu:gloo"), ("2", "FAILED DistNetworkError")])
def test_one_rank_group_moves_off_a_taken_port(world_size, expect):
    """Guards: a run dying at start because another process took verl's MASTER_PORT between the driver picking it
    and rank 0 binding it (seen on 2 cores). A one-rank group moves to a free port; a larger one cannot (its peers
    know the port) and still fails, the control that the port really was taken."""
    import socket

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code = GLOO_INIT.replace('WORLD_SIZE="1"', f'WORLD_SIZE="{world_size}"')
        env = dict(os.environ, VERL_PLATFORM="cpu", VERL_USE_EXTERNAL_PLUGINS="auto")
        out = subprocess.run([sys.executable, "-c", code, port], env=env, capture_output=True, text=True, timeout=180)
    assert expect in out.stdout, out.stdout + out.stderr[-2000:]


def test_forward_only_offload_does_not_pin_memory():
    apply_cpu_patches()
    from verl.workers.engine.fsdp import transformer_impl

    assert transformer_impl.CPUOffloadPolicy(pin_memory=True).pin_memory is False


def test_value_head_loads_with_sdpa(tiny_model_path):
    """Guards: the critic loader demanding flash-attention, which does not exist on CPU."""
    apply_cpu_patches()
    from transformers import AutoConfig
    from verl.utils import model as model_utils

    config = AutoConfig.from_pretrained(tiny_model_path, attn_implementation="sdpa")
    config.num_labels = 1
    critic = model_utils.load_valuehead_model(tiny_model_path, None, config, False)
    assert critic.config._attn_implementation == "sdpa"
    assert critic.score.out_features == 1


def test_skipped_patch_warns(monkeypatch, caplog):
    """A patch whose target changed is skipped loudly, never applied to code we have not read."""
    stale = VerlPatch("stale", CPU_PATCHES[0].target, "text verl never had", "n/a", "n/a", apply=lambda: None)
    with caplog.at_level("WARNING", logger="verl_pipe"):
        assert apply_patches((stale,)) == []
    assert any("stale" in r.message and "skipped" in r.message for r in caplog.records)
