"""Which rollout classes a run builds, decided from its config before any worker starts: one answer for the
trainer, the recipes' dry run and the tests.

verl picks a rollout replica by ``actor_rollout_ref.rollout.name`` from its ``RolloutReplicaRegistry``, the weight
sync by ``actor_rollout_ref.rollout.checkpoint_engine.backend``, and a trainer mode picks its checkpoint manager and
its agent loop's server client. A combination that cannot work used to show only once every worker was up (the
in-flight trainer's ``TypeError`` on verl's own ``vLLMReplica``, on every GPU cluster). :func:`compose` decides all
of it from the config and the platform, refuses what would fail after start-up (naming the key and the fix), and
names every class by its import path, so that nothing here imports vLLM or the trainers: a machine without either
(a laptop's dry run) still resolves a GPU run's classes, and :meth:`RolloutComposition.load` imports them where they
exist.

What is decided:

* **replica and server.** ``hf`` is the CPU backend's own server and has no GPU path. ``vllm`` on the CPU backend is
  :class:`~verl_pipe.backends.cpu.vllm_replica.CPUvLLMReplica` (verl-pipe's extension with CPU placement), in every
  mode; on any other platform verl-pipe's modes get :class:`~verl_pipe.rollout.vllm_server.PipevLLMReplica` (verl's
  replica and placement, verl's server with the extension: in-flight loads, per-token versions, prefix salting,
  engine health) and verl's own modes keep verl's ``vLLMReplica`` untouched. Other rollouts are verl's.
  ``in_flight_pipeline`` needs a replica that loads weights in flight: ``vllm`` (or ``hf`` on CPU).
* **checkpoint engine.** Separate pools need one that crosses processes: ``naive`` syncs only a trainer with the
  rollout in its own ranks.
* **checkpoint manager and client.** ``in_flight_pipeline``: verl's manager without the abort
  (:class:`~verl_pipe.trainers.in_flight_sync.InFlightCheckpointManager`) and verl's partial-rollout client that
  keeps every token's version (:class:`~verl_pipe.trainers.in_flight_sync.VersionKeepingClient`); the other
  separate-pool modes verl's manager and partial-rollout client; ``sync`` verl's manager and plain client.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, fields
from typing import Any, Optional

from verl_pipe.trainer_modes import TRAINER_MODES

CPU = "cpu"
ROLLOUT_KEY = "actor_rollout_ref.rollout.name"
BACKEND_KEY = "actor_rollout_ref.rollout.checkpoint_engine.backend"
DISAGGREGATION_KEY = "actor_rollout_ref.rollout.disaggregation.enabled"

_VERL_VLLM = "verl.workers.rollout.vllm_rollout.vllm_async_server"
# verl's own replicas and their server actors, by rollout name (verl.workers.rollout.replica's loaders).
VERL_ROLLOUTS = {
    "vllm": (f"{_VERL_VLLM}:vLLMReplica", f"{_VERL_VLLM}:vLLMHttpServer"),
    "sglang": ("verl.workers.rollout.sglang_rollout.async_sglang_server:SGLangReplica",
               "verl.workers.rollout.sglang_rollout.async_sglang_server:SGLangHttpServer"),
    "trtllm": ("verl.workers.rollout.trtllm_rollout.trtllm_async_server:TRTLLMReplica",
               "verl.workers.rollout.trtllm_rollout.trtllm_async_server:TRTLLMHttpServer"),
}  # fmt: skip
PIPE_VLLM = ("verl_pipe.rollout.vllm_server:PipevLLMReplica", "verl_pipe.rollout.vllm_server:PipevLLMHttpServer")
CPU_VLLM = ("verl_pipe.backends.cpu.vllm_replica:CPUvLLMReplica",
            "verl_pipe.backends.cpu.vllm_replica:CPUvLLMHttpServer")  # fmt: skip
CPU_HF = ("verl_pipe.backends.cpu.hf_replica:HFReplica", "verl_pipe.backends.cpu.hf_server:HFRolloutServer")
# Rollouts whose replicas load weights between decode steps and tag each token with its version.
IN_FLIGHT_ROLLOUTS = ("vllm", "hf")

# verl's checkpoint engines by backend name (verl.checkpoint_engine's modules), and ours. On Ascend verl registers
# its HCCL engine under "nccl".
CHECKPOINT_ENGINES = {
    "naive": "verl.checkpoint_engine.base:ColocatedCheckpointEngine",
    "nccl": "verl.checkpoint_engine.nccl_checkpoint_engine:NCCLCheckpointEngine",
    "nixl": "verl.checkpoint_engine.nixl_checkpoint_engine:NIXLCheckpointEngine",
    "mooncake": "verl.checkpoint_engine.mooncake_checkpoint_engine:MooncakeCheckpointEngine",
    "delta_sharded": "verl.checkpoint_engine.delta_checkpoint_engine:DeltaShardedCheckpointEngine",
    "kimi_ckpt_engine": "verl.checkpoint_engine.kimi_checkpoint_engine:KIMICheckpointEngine",
    "gloo": "verl_pipe.rollout.gloo_checkpoint_engine:GlooCheckpointEngine",
}
NPU_NCCL = "verl.checkpoint_engine.hccl_checkpoint_engine:HCCLCheckpointEngine"
VERL_MANAGER = "verl.checkpoint_engine:CheckpointEngineManager"
IN_FLIGHT_MANAGER = "verl_pipe.trainers.in_flight_sync:InFlightCheckpointManager"
PLAIN_CLIENT = "verl.workers.rollout.llm_server:LLMServerClient"
PARTIAL_ROLLOUT_CLIENT = "verl.workers.rollout.llm_server:FullyAsyncLLMServerClient"
VERSION_KEEPING_CLIENT = "verl_pipe.trainers.in_flight_sync:VersionKeepingClient"


class RolloutCompositionError(ValueError):
    """A rollout combination that would fail once the workers are up; ``key`` is the setting to change."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class RolloutComposition:
    """What a run builds, each class by ``module:Name``."""

    platform: str
    trainer_mode: str
    rollout: str
    separate_pools: bool
    replica: str
    server: str
    checkpoint_engine: str  # the backend's name
    checkpoint_engine_cls: str
    checkpoint_manager: str
    llm_client: str
    in_flight_loads: bool  # the servers are switched to in-flight loads (in_flight_pipeline)

    def load(self, part: str) -> type:
        """Import one of the classes (``"replica"``, ``"server"``, ...)."""
        return load_class(getattr(self, part))

    def describe(self) -> list[tuple[str, str]]:
        """(what, class) rows, as the dry run prints them."""
        loads = " (in-flight loads on)" if self.in_flight_loads else ""
        return [
            ("replica", self.replica),
            ("server", f"{self.server}{loads}"),
            ("checkpoint engine", f"{self.checkpoint_engine}: {self.checkpoint_engine_cls}"),
            ("checkpoint manager", self.checkpoint_manager),
            ("agent-loop client", self.llm_client),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def load_class(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _get(config, key: str, default: Any = None) -> Any:
    node = config
    for part in key.split("."):
        if node is None:
            return default
        try:
            node = node.get(part, None) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:  # noqa: BLE001 - an omegaconf node that cannot be read: the default
            return default
    return default if node is None else node


def platform_of(config) -> str:
    """``cpu`` when the CPU backend is selected (``VERL_PLATFORM=cpu``, or ``trainer.device=cpu``), else verl's
    ``trainer.device`` (``cuda`` by default; ``npu``)."""
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == CPU:
        return CPU
    return str(_get(config, "trainer.device", "cuda")).lower()


def trainer_mode_of(config) -> str:
    if not _get(config, "trainer.use_v1", True):
        return "sync"  # the legacy trainer: colocated, verl's own
    return str(_get(config, "trainer.v1.trainer_mode", "sync"))


def compose(config, platform: Optional[str] = None) -> RolloutComposition:
    """The rollout classes ``config`` builds on ``platform`` (default :func:`platform_of`); raises
    :class:`RolloutCompositionError` for a combination that would fail after start-up."""
    platform = platform or platform_of(config)
    mode_name = trainer_mode_of(config)
    mode = TRAINER_MODES.get(mode_name)
    ours = mode is not None and mode.from_plugin
    separate = not bool(_get(config, "actor_rollout_ref.hybrid_engine", True))
    rollout = str(_get(config, ROLLOUT_KEY, "vllm"))
    in_flight = mode_name == "in_flight_pipeline"

    if rollout == "hf" and platform != CPU:
        raise RolloutCompositionError(
            ROLLOUT_KEY,
            f"{ROLLOUT_KEY}=hf is the CPU backend's own server (transformers' generate, one process a replica) and "
            f"has no {platform} path: set {ROLLOUT_KEY}=vllm (or run on the CPU backend with VERL_PLATFORM=cpu)",
        )
    if in_flight and rollout not in IN_FLIGHT_ROLLOUTS:
        raise RolloutCompositionError(
            ROLLOUT_KEY,
            f"trainer.v1.trainer_mode=in_flight_pipeline loads weights between decode steps and tags each token with "
            f"the version that sampled it, which the {rollout!r} rollout cannot do yet: set {ROLLOUT_KEY}=vllm, or "
            "use trainer.v1.trainer_mode=one_off_pipeline (a sync between batches) with this rollout",
        )
    if in_flight and _get(config, DISAGGREGATION_KEY, False):
        raise RolloutCompositionError(
            DISAGGREGATION_KEY,
            f"trainer.v1.trainer_mode=in_flight_pipeline with {DISAGGREGATION_KEY}=true: verl's prefill/decode "
            "replica (vLLMPDReplica) has no in-flight loads; set it to false",
        )
    if rollout == "hf":
        replica, server = CPU_HF
    elif rollout == "vllm" and platform == CPU:
        replica, server = CPU_VLLM
    elif rollout == "vllm" and ours:
        replica, server = PIPE_VLLM
    elif rollout in VERL_ROLLOUTS:
        replica, server = VERL_ROLLOUTS[rollout]
    else:
        replica = server = f"verl's RolloutReplicaRegistry entry {rollout!r}"

    backend = str(_get(config, BACKEND_KEY, "naive"))
    if separate and backend == "naive":
        fix = "gloo (the CPU backend)" if platform == CPU else "nccl (hccl on Ascend)"
        raise RolloutCompositionError(
            BACKEND_KEY,
            f"{BACKEND_KEY}=naive only syncs a trainer with the rollout in its own ranks; trainer.v1.trainer_mode="
            f"{mode_name} runs separate pools (actor_rollout_ref.hybrid_engine=false): set {BACKEND_KEY}={fix}",
        )
    if in_flight and backend == "delta_sharded":
        raise RolloutCompositionError(
            BACKEND_KEY,
            f"trainer.v1.trainer_mode=in_flight_pipeline with {BACKEND_KEY}=delta_sharded: delta loads go through "
            "vLLM's delta RPC, which the in-flight servers do not count tokens across yet; use nccl",
        )
    engine_cls = NPU_NCCL if (platform, backend) == ("npu", "nccl") else CHECKPOINT_ENGINES.get(
        backend, f"verl's CheckpointEngineRegistry entry {backend!r}")  # fmt: skip

    if in_flight:
        manager, client = IN_FLIGHT_MANAGER, VERSION_KEEPING_CLIENT
    elif separate:
        manager, client = VERL_MANAGER, PARTIAL_ROLLOUT_CLIENT
    else:
        manager, client = VERL_MANAGER, PLAIN_CLIENT
    return RolloutComposition(
        platform=platform,
        trainer_mode=mode_name,
        rollout=rollout,
        separate_pools=separate,
        replica=replica,
        server=server,
        checkpoint_engine=backend,
        checkpoint_engine_cls=engine_cls,
        checkpoint_manager=manager,
        llm_client=client,
        in_flight_loads=in_flight,
    )


def register_replica(composition: RolloutComposition) -> None:
    """Make verl's ``RolloutReplicaRegistry`` build the composition's replica under its rollout name, in this process
    (the TaskRunner, where verl builds the replicas). A no-op where verl's own entry already builds it."""
    if composition.replica not in (PIPE_VLLM[0], CPU_VLLM[0], CPU_HF[0]):
        return
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(composition.rollout, lambda: composition.load("replica"))


def check_built(composition: RolloutComposition, replicas) -> None:
    """After verl built the replicas: each is the composition's (a user's own registration under the same name, or a
    code path that bypasses the registry, would otherwise go unnoticed until its first weight load)."""
    if ":" not in composition.replica:
        return
    expected = composition.load("replica")
    for replica in replicas:
        if not isinstance(replica, expected):
            raise RolloutCompositionError(
                ROLLOUT_KEY,
                f"trainer.v1.trainer_mode={composition.trainer_mode} composed {composition.replica} for "
                f"{ROLLOUT_KEY}={composition.rollout}, but verl built a {type(replica).__module__}."
                f"{type(replica).__name__}: another plugin registered that rollout name after verl-pipe; remove it",
            )
