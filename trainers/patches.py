"""Two verl 0.9.1 bugs on the separate-pool path (trainer and rollout on different workers), patched.

Both sit on the code path of verl's ``separate_async`` mode with ``actor_rollout_ref.hybrid_engine=False``,
which our pipelined trainers build on; the sync and colocated modes never reach them. Each is a
:class:`~verl_pipe.patching.VerlPatch` declared in :mod:`verl_pipe.patch_registry`: fingerprinted against the
verl source it fixes, and covered by a test that fails without the patch. The second is correctness-critical:
on the CPU backend a verl whose code changed under it stops the run at start-up.

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

from verl_pipe.patching import fired, is_patched, mark_patched


# --- 1. logger.info(..., flush=True) --------------------------------------------------------------------------


class _FlushTolerantLogger(logging.LoggerAdapter):
    """The module's logger, minus the ``flush`` keyword that print() takes and logging does not."""

    def process(self, msg, kwargs):
        if "flush" in kwargs:
            fired("separate_async_logger_flush_kwarg")
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
        fired("pi_old_snapshot_copies_host_params")
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
        fired("report_generated_sessions")
        report_generated(self.config, kwargs)
        return await original(self, outputs, kwargs)

    AgentLoopWorker._compute_score = _compute_score
