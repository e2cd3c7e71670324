"""verl finds everything verl-pipe provides through the ``verl.plugins`` entry point alone.

verl swallows plugin import errors at DEBUG level, so a broken registration would otherwise surface only as
"unknown platform" or "unknown rollout" far from its cause. These tests run fresh interpreters so that the
registration under test is the one ``import verl`` performs, not one a previous test triggered by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from verl_pipe.patch_registry import PATCHES

PROBE = r"""
import json, verl
from verl.plugin.platform.platform_manager import PlatformRegistry
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, get_rollout_class
out = {
    "platforms": list(PlatformRegistry.registered_names()),
    "hf_replica": RolloutReplicaRegistry.get("hf").__name__,
    "hf_adapter": get_rollout_class("hf", "async").__name__,
}
try:
    from verl.workers.engine.base import EngineRegistry
    out["engines"] = {m: sorted(map(str, EngineRegistry._engines[m].get("fsdp2", {}))) for m in ("language_model", "value_model")}
except Exception as e:
    out["engines"] = repr(e)
from verl_pipe.register import REGISTERED
out["registered"] = REGISTERED
print("RESULT" + json.dumps(out))
"""


def _probe(env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def test_entry_point_is_declared():
    names = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert names.get("verl_pipe") == "verl_pipe.register"


def test_import_verl_registers_platform_and_rollout():
    out = _probe({})
    assert "cpu" in out["platforms"]
    assert out["hf_replica"] == "HFReplica"
    assert out["hf_adapter"] == "HFServerAdapter"
    # Without VERL_PLATFORM=cpu no CPU patch is applied: GPU users run verl's CPU-related code as shipped.
    cpu_patches = {p.name for p in PATCHES if p.when == "cpu platform"}
    assert cpu_patches and not cpu_patches & set(out["registered"]["patches"])


def test_cpu_platform_adds_engines_and_patches():
    out = _probe({"VERL_PLATFORM": "cpu"})
    assert "cpu" in out["engines"]["language_model"] and "cpu" in out["engines"]["value_model"]
    cpu_patches = [p.name for p in PATCHES if p.when == "cpu platform"]
    assert set(cpu_patches) <= set(out["registered"]["patches"])


def test_plugin_disabled_by_verl_policy_is_not_loaded():
    """verl's own switch (VERL_USE_EXTERNAL_PLUGINS=none) must still turn us off."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    code = "import sys, verl; print('verl_pipe.register' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_registration_failure_is_reported_at_warning(monkeypatch, caplog):
    """Guards: a failing registration step vanishing silently, as verl's DEBUG-level plugin logging would let it."""
    import verl_pipe.register as register

    monkeypatch.setattr(register, "_DONE", False)

    def boom():
        raise ImportError("simulated missing dependency")

    monkeypatch.setattr(register, "_register_rollout", boom)
    with caplog.at_level("WARNING", logger="verl_pipe"):
        register.register()
    assert any("hf rollout failed" in r.message and "simulated missing dependency" in r.message for r in caplog.records)


@pytest.mark.timeout(300)
def test_plugin_is_loaded_inside_ray_workers(ray_cluster):
    """A Ray worker that only does `import verl` sees our registrations: the entry point alone suffices."""
    import ray

    ray.init(address=ray_cluster, ignore_reinit_error=True, log_to_driver=False)
    try:

        @ray.remote(num_cpus=0)
        def worker_view():
            import os

            import verl  # noqa: F401
            from verl.plugin.platform.platform_manager import PlatformRegistry
            from verl.workers.rollout.replica import RolloutReplicaRegistry

            return os.getpid(), "cpu" in PlatformRegistry.registered_names(), "hf" in RolloutReplicaRegistry._registry

        pid, has_platform, has_rollout = ray.get(worker_view.remote(), timeout=240)
        assert pid != os.getpid() and has_platform and has_rollout
    finally:
        ray.shutdown()
