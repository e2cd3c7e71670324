"""Two verl 0.9.1 bugs on the separate-pool path (trainer and rollout on different workers), patched.

Both sit on the code path of verl's ``separate_async`` mode with ``actor_rollout_ref.hybrid_engine=False``,
which our pipelined trainers build on; the sync and colocated modes never reach them. Each is a
:class:`~verl_pipe.patching.VerlPatch`: fingerprinted against the verl source it fixes, skipped loudly if
verl changed, and covered by a test that fails without the patch.

1. ``PPOTrainerSeparateAsync._setup`` logs with ``logger.info(..., flush=True)``; ``logging`` rejects the
   keyword, so the mode dies at start-up with a TypeError whenever hybrid replicas are off.
2. ``fsdp2_sharded_save_to_cpu`` snapshots pi_old with ``.detach().cpu()``. When the parameters already live
   in host memory (the CPU backend, or a GPU run with parameter offload) ``.cpu()`` returns the *same*
   storage, so the "saved" pi_old is the live parameter and the optimizer silently overwrites it: every
   minibatch after the first computes its PPO ratio against the current weights instead of pi_old.

One hook verl lacks, applied the same way:

3. ``AgentLoopWorker._compute_score`` is called once per session by V1's post-processing, after the session's
   last turn and before its reward; wrapped, it reports the session to the run's generation counter
   (:mod:`.generation_counter`), which tells ``one_off_pipeline`` when the batch in flight has generated.
"""

from __future__ import annotations

import logging

from verl_pipe.import_hooks import when_imported
from verl_pipe.patching import VerlPatch, apply_patches, is_patched, mark_patched

APPLIED: list[str] = []


# --- 1. logger.info(..., flush=True) --------------------------------------------------------------------------


class _FlushTolerantLogger(logging.LoggerAdapter):
    """The module's logger, minus the ``flush`` keyword that print() takes and logging does not."""

    def process(self, msg, kwargs):
        kwargs.pop("flush", None)
        return msg, kwargs


def _patch_separate_async_logger() -> None:
    from verl.trainer.ppo.v1 import trainer_separate_async

    current = trainer_separate_async.logger
    if isinstance(current, _FlushTolerantLogger):
        return
    trainer_separate_async.logger = _FlushTolerantLogger(current, {})


# --- 2. pi_old snapshot aliases host-resident parameters --------------------------------------------------------


def _shares_memory(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _patch_sharded_save_aliasing() -> None:
    from verl.utils import fsdp_utils

    original = fsdp_utils.fsdp2_sharded_save_to_cpu
    if is_patched(original):
        return

    @mark_patched(original)
    def fsdp2_sharded_save_to_cpu(model):
        state, spec = original(model)
        live = {name: getattr(param, "_local_tensor", param) for name, param in model.named_parameters()}
        for name, (saved, param_spec) in state.items():
            # Only a snapshot that *is* the live storage is copied; on an accelerator .cpu() already copied.
            if name in live and _shares_memory(saved, live[name].detach()):
                state[name] = (saved.clone(), param_spec)
        return state, spec

    # DetachActorWorker imports the helper inside a method, at call time, so the module attribute is enough.
    fsdp_utils.fsdp2_sharded_save_to_cpu = fsdp2_sharded_save_to_cpu


# --- 3. report each session that finished generating --------------------------------------------------------


def _patch_report_generated_sessions() -> None:
    # Not AgentLoopWorkerTQ's own method: Ray ships that @ray.remote class to its workers as pickled when it
    # was decorated, before any import hook could wrap it. Its plain base class is imported by the worker.
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from verl_pipe.trainers.generation_counter import report_generated

    original = AgentLoopWorker._compute_score
    if is_patched(original):
        return

    @mark_patched(original)
    async def _compute_score(self, outputs, kwargs):
        report_generated(self.config, kwargs)
        return await original(self, outputs, kwargs)

    AgentLoopWorker._compute_score = _compute_score


SEPARATE_POOL_PATCHES: tuple[VerlPatch, ...] = (
    VerlPatch(
        name="separate_async_logger_flush_kwarg",
        target="verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync._setup",
        fingerprint="flush=True,",
        upstream="trainer_separate_async.py: drop flush=True from logger.info in the hybrid_engine=False branch",
        apply=_patch_separate_async_logger,
    ),
    VerlPatch(
        name="pi_old_snapshot_copies_host_params",
        target="verl.utils.fsdp_utils:fsdp2_sharded_save_to_cpu",
        fingerprint="local_cpu_tensor = local_gpu_tensor.detach().cpu()",
        upstream="fsdp2_sharded_save_to_cpu should clone when the parameter is already in host memory",
        apply=_patch_sharded_save_aliasing,
    ),
    VerlPatch(
        name="report_generated_sessions",
        # V1's post-processing calls this first, once per session, after generation and before anything else
        # (test_generation_counter_on_cpu checks that order in AgentLoopWorkerTQ._agent_loop_postprocess).
        target="verl.experimental.agent_loop.agent_loop:AgentLoopWorker._compute_score",
        fingerprint="async def _compute_score(self, outputs: list[AgentLoopOutput], kwargs: dict) -> None:",
        upstream="a per-session 'generation finished' event in the V1 agent loop (before the streamed reward)",
        apply=_patch_report_generated_sessions,
    ),
)


def install() -> None:
    """Apply each patch when verl imports the module it fixes (never earlier: importing them costs seconds)."""
    by_module = {
        "verl.trainer.ppo.v1.trainer_separate_async": SEPARATE_POOL_PATCHES[0],
        "verl.utils.fsdp_utils": SEPARATE_POOL_PATCHES[1],
        "verl.experimental.agent_loop.agent_loop": SEPARATE_POOL_PATCHES[2],
    }
    for module_name, patch in by_module.items():
        when_imported(
            module_name,
            lambda _module, patch=patch: APPLIED.extend(apply_patches([patch], group="separate-pool")),
        )
