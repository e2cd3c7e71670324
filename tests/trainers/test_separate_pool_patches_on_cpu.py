"""The two verl 0.9.1 bugs on the separate-pool path stay fixed, and the fixes stay tied to the code they fix.

* pi_old aliasing: ``fsdp2_sharded_save_to_cpu`` must return a *copy* of host-resident parameters. Without the
  patch the optimizer overwrites the "saved" pi_old and every later minibatch's PPO ratio silently uses the
  current weights. The test runs verl's own helper on a real FSDP2 model (gloo, CPU) and shows both sides.
* ``logger.info(..., flush=True)`` in ``PPOTrainerSeparateAsync._setup`` must not raise.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from verl_pipe.patch_registry import PATCHES

SEPARATE_POOL_PATCHES = tuple(p for p in PATCHES if p.apply.startswith("verl_pipe.trainers.patches:"))

FSDP2_SNAPSHOT = r"""
import os, sys, json, torch, torch.distributed as dist
os.environ.setdefault("VERL_PLATFORM", "cpu")
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
from torch.distributed.fsdp import fully_shard
import verl
from verl.utils import fsdp_utils
from verl_pipe.trainers.patches import _patch_sharded_save_aliasing

model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
fully_shard(model)

def survives(save):
    state, _ = save(model)
    before = {name: tensor.clone() for name, (tensor, _) in state.items()}
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)  # what the optimizer does to the live weights
    return all(torch.equal(state[name][0], before[name]) for name in before)

# The plugin patched the helper when verl imported fsdp_utils; __wrapped__ is verl's own.
current = fsdp_utils.fsdp2_sharded_save_to_cpu
original = getattr(current, "__wrapped__", current)
result = {"original_keeps_pi_old": survives(original), "patched_on_import": current is not original}
_patch_sharded_save_aliasing()  # idempotent
result["patched_keeps_pi_old"] = survives(fsdp_utils.fsdp2_sharded_save_to_cpu)
print("RESULT" + json.dumps(result))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("patch", SEPARATE_POOL_PATCHES, ids=lambda p: p.name)
def test_patch_still_matches_verls_code(patch):
    """Fails when verl changes the code a patch replaces: re-read it before re-fingerprinting."""
    assert patch.matches(), f"{patch.target} changed; upstream fix: {patch.upstream}"


def test_pi_old_snapshot_is_a_copy_on_cpu(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", FSDP2_SNAPSHOT, str(tmp_path / "rendezvous")],
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, VERL_PLATFORM="cpu"),
    )
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, out.stderr[-3000:]
    import json

    result = json.loads(line[len("RESULT") :])
    assert result["original_keeps_pi_old"] is False, "verl's snapshot no longer aliases: drop the patch"
    assert result["patched_keeps_pi_old"] is True
    assert result["patched_on_import"] is True, "the plugin must patch the helper when verl imports it"


def test_separate_async_setup_logger_accepts_flush():
    import verl  # noqa: F401 - the plugin's import hook patches the module as verl imports it
    from verl.trainer.ppo.v1 import trainer_separate_async

    # The exact call verl makes in the hybrid_engine=False branch of _setup.
    trainer_separate_async.logger.info("probe", flush=True)
    assert isinstance(trainer_separate_async.logger, logging.LoggerAdapter)
