"""The trainer-side half of the latency model (:mod:`verl_pipe.bench.latency`): updates, syncs, the step clock.

The rollout server pads generation itself; these version-guarded patches (declared at the end of this module,
``when="latency model"``) pad what the driver waits for,
in every V1 trainer mode alike (verl's ``sync`` and ``separate_async`` as well as ours), so a benchmark compares
schedules, not implementations:

* ``PPOTrainer._update_actor``: the update and the log-prob passes before it (from the moment the batch leaves
  the sampler, ``_balance_batch``) last ``train_s_per_ktoken`` per thousand modelled response tokens of the
  samples it trains: the CPU's real old-log-prob and update run inside that window, not on top of it;
* ``CheckpointEngineManager.update_weights``: a weight sync lasts ``sync_s``;
* ``CheckpointEngineManager.resume_generation_replicas``: the rollout servers' gate, which verl's sync closes (it
  aborts the running requests and parks new ones) and opens after the transfer, stays closed until that
  ``sync_s`` has passed, as the transfer would hold it on the cluster (padding only after verl's millisecond CPU
  sync had returned let the requests it aborted resume at once and decode through the modelled transfer);
* ``PPOTrainer._balance_batch`` (right after a batch leaves the sampler): marks where the modelled update window
  opens;
* ``PPOTrainer._build_replay_buffer``: verl's 2 s TransferQueue poll is scaled like every other time;
* ``PPOTrainer._compute_metrics``: a wall-clock stamp per step (``bench/step_end_ts``), so a benchmark measures
  the loop's real period, metrics and logging included;
* ``FullyAsyncLLMServerClient.generate``: verl pauses 1 s before it resubmits a request a sync aborted (and
  before it retries an empty load balancer); the pause is scaled like every other time, or each resumed request
  would wait a quarter of a compressed batch;
* ``FullyAsyncLLMServerClient.generate`` again: the client of every separate-pool mode rebuilds each answer's
  extra fields from its version tags alone, dropping the modelled length the server reported, so the update of
  those modes would be timed on the median length instead of the real draw; the length is carried over, and so
  is the version of each token of an answer a sync cut and resumed, and the modelled tokens each piece decoded
  under each version (the token lag every schedule reports, ``bench/token_lag/*``, weighs versions by those).

They are installed only in a process whose environment switches the model on (``VERL_PIPE_LATENCY_MODEL``), so a
normal run is untouched; in a benchmark run they are correctness-critical (a run without them would time the
wrong thing), so a verl that no longer matches them stops the benchmark.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
import types
from typing import Any, Optional

from verl_pipe.bench.latency import LatencyModel, active_model
from verl_pipe.patching import PatchGroup, VerlPatch, fired, is_patched, mark_patched
from verl_pipe.trainers.token_lag import MODELLED_RUNS_KEY, sample_versions, token_lag_metrics

_TRAINER = "verl.trainer.ppo.v1.trainer_base"
_CHECKPOINT = "verl.checkpoint_engine.base"


def real_samples(batch) -> tuple[list[dict], list[dict]]:
    """Tags and extra fields (what the rollout server reported) of the batch's real samples, padding left out."""
    import transfer_queue as tq

    real = [(key, tag) for key, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
    if not real:
        return [], []
    extras = tq.kv_batch_get(keys=[k for k, _ in real], partition_id=batch.partition_id, select_fields=["extra_fields"])
    fields = [extra if isinstance(extra, dict) else {} for extra in extras.pop("extra_fields").tolist()]
    return [tag for _, tag in real], fields


def modelled_tokens(extras: list[dict], model: LatencyModel) -> tuple[list[int], int]:
    """Modelled response lengths of the samples, as their rollout server drew them, and how many samples had none
    and were given the median (none should: ``latency_model_keeps_modelled_length``)."""
    tokens, defaulted = [], 0
    for extra in extras:
        value = extra.get("modelled_response_tokens")
        defaulted += value is None
        tokens.append(int(value) if value is not None else model.median_response_tokens)
    return tokens, defaulted


def _pad_until(started: float, modelled_s: float, model: LatencyModel) -> None:
    time.sleep(max(0.0, started + model.wall(modelled_s) - time.monotonic()))


def _patch_update_actor() -> None:
    module = __import__(_TRAINER, fromlist=["PPOTrainer"])
    original = module.PPOTrainer._update_actor
    if is_patched(original):
        return

    @mark_patched(original)
    @functools.wraps(original)
    def _update_actor(self, batch, metrics):
        fired("latency_model_update_time")
        model = active_model()
        # the modelled update starts where the batch left the sampler (the log-prob passes run inside it)
        started = self.__dict__.pop(_TRAIN_WINDOW_STARTS, None) or time.monotonic()
        result = original(self, batch, metrics)
        if model is not None:
            tags, extras = real_samples(batch)
            tokens, defaulted = modelled_tokens(extras, model)
            metrics["bench/modelled_tokens_defaulted"] = metrics.get("bench/modelled_tokens_defaulted", 0) + defaulted
            # every schedule's token lag, from the versions the modelled replicas tagged each token with
            trained = self.__dict__.setdefault(_STEP_SAMPLES, [])
            trained.extend(sample_versions(tag, extra, modelled=True) for tag, extra in zip(tags, extras))
            modelled = model.wall(model.train_s(sum(tokens)))
            _step_totals(self)["train_modelled_wall_s"] += modelled
            _pad_until(started, model.train_s(sum(tokens)), model)
        return result

    module.PPOTrainer._update_actor = _update_actor


def _patch_balance_batch() -> None:
    module = __import__(_TRAINER, fromlist=["PPOTrainer"])
    original = module.PPOTrainer._balance_batch
    if is_patched(original):
        return

    @mark_patched(original)
    @functools.wraps(original)
    def _balance_batch(self, batch, metrics, *args, **kwargs):
        fired("latency_model_update_window")
        if active_model() is not None:
            self.__dict__[_TRAIN_WINDOW_STARTS] = time.monotonic()  # the modelled update starts here
        return original(self, batch, metrics, *args, **kwargs)

    module.PPOTrainer._balance_batch = _balance_batch


def _patch_replay_buffer_poll() -> None:
    module = __import__(_TRAINER, fromlist=["PPOTrainer"])
    original = module.PPOTrainer._build_replay_buffer
    if is_patched(original):
        return

    @mark_patched(original)
    @functools.wraps(original)
    def _build_replay_buffer(self):
        fired("latency_model_replay_buffer_poll")
        buffer = original(self)
        model = active_model()
        if model is not None:
            # verl polls TransferQueue every 2 s: nothing against a real step of minutes, but a third of a
            # compressed one. Scale it with every other time, so no schedule pays a quantisation the cluster
            # would not (the pipelined modes poll every 0.05 s already).
            buffer.poll_interval = max(0.02, min(float(buffer.poll_interval), model.wall(2.0)))
        return buffer

    module.PPOTrainer._build_replay_buffer = _build_replay_buffer


_STEP_CLOCK_MARK = "__verl_pipe_step_clock__"
_STEP_SAMPLES = "_verl_pipe_bench_step_samples"  # the step's trained samples' versions, on the trainer
_TRAIN_WINDOW_STARTS = "_verl_pipe_bench_train_window_starts"  # monotonic time the batch left the sampler
_STEP_TOTALS = "_verl_pipe_bench_step_totals"
# Wall seconds the trainer's process spent in padded weight syncs since the last step's stamp, and what the model
# priced them at (the manager that runs them knows no trainer; both live in verl's driver-side trainer process).
_SYNC_WALL = {"s": 0.0, "modelled_s": 0.0}


def _step_totals(trainer) -> dict[str, float]:
    return trainer.__dict__.setdefault(_STEP_TOTALS, {"train_modelled_wall_s": 0.0})


def _patch_step_clock() -> None:
    module = __import__(_TRAINER, fromlist=["PPOTrainer"])
    original = module.PPOTrainer._compute_metrics
    if getattr(original, _STEP_CLOCK_MARK, False):  # its own mark: the reward hook also wraps this method
        return

    @functools.wraps(original)
    def _compute_metrics(self, batch, metrics, *args, **kwargs):
        fired("latency_model_step_clock")
        # verl's step timer leaves out what runs between steps (metrics, logging); the time between these
        # stamps is the real period of the training loop, the same measure for every schedule.
        metrics["bench/step_end_ts"] = time.time()
        # what the step spent in modelled phases on the trainer's path, so the report can tell the real work apart
        metrics.update({f"bench/{key}": value for key, value in self.__dict__.pop(_STEP_TOTALS, {}).items()})
        metrics["bench/sync_wall_s"], _SYNC_WALL["s"] = _SYNC_WALL["s"], 0.0
        metrics["bench/sync_modelled_wall_s"], _SYNC_WALL["modelled_s"] = _SYNC_WALL["modelled_s"], 0.0
        samples = self.__dict__.pop(_STEP_SAMPLES, [])
        if samples:
            metrics.update(token_lag_metrics(samples, trainer_version=self.global_steps - 1, prefix="bench"))
        return original(self, batch, metrics, *args, **kwargs)

    setattr(_compute_metrics, _STEP_CLOCK_MARK, True)
    module.PPOTrainer._compute_metrics = _compute_metrics


def _wrap_checkpoint_manager_method(name: str, wrap) -> None:
    """Replace verl's ``CheckpointEngineManager.<name>`` with ``wrap(original)``, once."""
    module = __import__(_CHECKPOINT, fromlist=["CheckpointEngineManager"])
    original = getattr(module.CheckpointEngineManager, name)
    if not is_patched(original):
        setattr(module.CheckpointEngineManager, name, wrap(original))


async def _run_original(original, self, args, kwargs):
    """Call verl's ``@auto_await`` method from async code: it hands back a coroutine there, or its result."""
    result = original(self, *args, **kwargs)
    return await result if inspect.isawaitable(result) else result


def _patch_update_weights() -> None:
    _wrap_checkpoint_manager_method("update_weights", padded_update_weights)


def padded_update_weights(original):
    """``original`` (verl's ``@auto_await`` sync) made to last the model's ``sync_s``, and still ``@auto_await``.

    verl's decorator decides from its *caller's* frame whether to hand back a coroutine: a plain wrapper would be that
    caller, so an override that awaits ``super().update_weights()`` (in_flight_pipeline's manager does) would get
    the finished result instead of a coroutine. This wrapper is a coroutine function under the same decorator, so it
    is run or awaited exactly as verl's method is, and it awaits the original from async code. While it runs, the
    manager carries the modelled transfer's end, for :func:`gated_resume_generation`.
    """
    from verl.utils.ray_utils import auto_await

    @mark_patched(original)
    @functools.wraps(original)
    @auto_await
    async def update_weights(self, *args, **kwargs):
        fired("latency_model_sync_time")
        model = active_model()
        modelled = model.wall(model.sync_s) if model is not None else 0.0
        ends = time.monotonic() + modelled
        self.__dict__[_SYNC_ENDS] = ends
        started = time.monotonic()
        try:
            result = await _run_original(original, self, args, kwargs)
        finally:
            self.__dict__.pop(_SYNC_ENDS, None)
        await asyncio.sleep(max(0.0, ends - time.monotonic()))
        _SYNC_WALL["s"] += time.monotonic() - started
        _SYNC_WALL["modelled_s"] += modelled
        return result

    return update_weights


def gated_resume_generation(original):
    """``original`` (verl's ``@auto_await`` resume after a sync) held until the modelled transfer has ended.

    verl's sync aborts every running request and parks new ones behind the servers' gate, transfers, then opens the
    gate: on the cluster nothing decodes for the transfer's whole duration. The CPU transfer takes milliseconds, so
    without this the aborted requests would resume at once and decode through the modelled ``sync_s`` for free (an
    in-flight load, which aborts nothing, stalls its modelled replica for ``sync_s`` instead). Called outside a
    padded sync (no transfer end on the manager), it resumes at once.
    """
    from verl.utils.ray_utils import auto_await

    @mark_patched(original)
    @functools.wraps(original)
    @auto_await
    async def resume_generation_replicas(self, *args, **kwargs):
        fired("latency_model_sync_holds_the_gate")
        ends = self.__dict__.get(_SYNC_ENDS)
        if ends is not None:
            await asyncio.sleep(max(0.0, ends - time.monotonic()))
        return await _run_original(original, self, args, kwargs)

    return resume_generation_replicas


def _patch_resume_generation() -> None:
    _wrap_checkpoint_manager_method("resume_generation_replicas", gated_resume_generation)


_SYNC_ENDS = "_verl_pipe_modelled_sync_ends"  # on a checkpoint manager during a padded sync: its monotonic end


_LLM_SERVER = "verl.workers.rollout.llm_server"


_SCALED_MARK = "__verl_pipe_scaled_pauses__"


async def _scaled_sleep(delay, result=None):
    model = active_model()
    if model is not None:
        fired("latency_model_partial_rollout_pause")
        delay = max(0.02, min(float(delay), model.wall(float(delay))))  # the floor of the scaled polls
    return await asyncio.sleep(delay, result)


def _patch_partial_rollout_pause() -> None:
    module = __import__(_LLM_SERVER, fromlist=["FullyAsyncLLMServerClient"])
    if getattr(module.asyncio, _SCALED_MARK, False):
        return
    # What verl's llm_server module sees as ``asyncio``: a plain module holding asyncio's names, with ``sleep``
    # scaled (a copy, not a proxy: nothing here may run attribute hooks while the interpreter shuts down).
    scaled = types.ModuleType("asyncio", "asyncio, with its sleep scaled by the benchmark's latency model")
    scaled.__dict__.update({name: value for name, value in vars(asyncio).items() if not name.startswith("__")})
    scaled.sleep = _scaled_sleep
    setattr(scaled, _SCALED_MARK, True)
    module.asyncio = scaled


_MODELLED_KEY = "modelled_response_tokens"


def _patch_keep_modelled_length() -> None:
    module = __import__(_LLM_SERVER, fromlist=["FullyAsyncLLMServerClient"])
    base, full = module.LLMServerClient, module.FullyAsyncLLMServerClient
    if is_patched(full.generate):
        return
    base_generate, full_generate = base.generate, full.generate
    # (client, request_id) -> the modelled length the server reported for the request's latest piece
    reported: dict[tuple[int, Any], int] = {}
    # (client, request_id) -> the version of each token of every piece so far
    versions: dict[tuple[int, Any], list] = {}
    # (client, request_id) -> the modelled [count, version] runs of every piece so far (None: a piece had none)
    runs: dict[tuple[int, Any], Optional[list]] = {}

    @mark_patched(base_generate)
    @functools.wraps(base_generate)
    async def generate_piece(self, request_id, *args, **kwargs):
        output = await base_generate(self, request_id, *args, **kwargs)
        fields = output.extra_fields or {}
        if isinstance(self, full) and _MODELLED_KEY in fields:
            reported[(id(self), request_id)] = fields[_MODELLED_KEY]
            piece = fields.get("token_versions") or [fields.get("global_steps")] * len(output.token_ids)
            versions.setdefault((id(self), request_id), []).extend(piece)
            so_far = runs.setdefault((id(self), request_id), [])
            runs[(id(self), request_id)] = None if so_far is None or MODELLED_RUNS_KEY not in fields else (
                so_far + list(fields[MODELLED_RUNS_KEY])
            )
        return output

    @mark_patched(full_generate)
    @functools.wraps(full_generate)
    async def generate(self, request_id, *args, **kwargs):
        try:
            output = await full_generate(self, request_id, *args, **kwargs)
        finally:
            tokens = reported.pop((id(self), request_id), None)
            token_versions = versions.pop((id(self), request_id), [])
            modelled_runs = runs.pop((id(self), request_id), None)
        if tokens is not None and active_model() is not None:
            fired("latency_model_keeps_modelled_length")
            output.extra_fields.setdefault(_MODELLED_KEY, tokens)
            known = [v for v in token_versions if v is not None]
            if len(known) == len(token_versions) and len(set(known)) > 1:  # a sync cut it: keep each token's version
                output.extra_fields.setdefault("token_versions", known)
            if modelled_runs:  # and the modelled tokens of every piece, which the bench's token lag weighs
                output.extra_fields[MODELLED_RUNS_KEY] = modelled_runs
        return output

    base.generate = generate_piece
    full.generate = generate


LATENCY_MODEL = PatchGroup(
    title="The benchmark's latency model (`make bench` only; critical there)",
    note="These pad verl's trainer to the times of a modelled cluster, so a benchmark compares schedules, not "
    "implementations. They are declared here, not in the product's table, and installed only in a process whose "
    "environment switches the model on (`VERL_PIPE_LATENCY_MODEL`). They are instrumentation, not fixes: "
    "upstream, a timing-hook interface on the trainer would replace them.",
    patches=(
        VerlPatch(
            name="latency_model_update_time",
            target=f"{_TRAINER}:PPOTrainer._update_actor",
            fingerprint="self.actor_rollout_wg.update_actor(batch)",
            why="benchmark only: verl has no hook to model the update's duration",
            upstream="none needed (benchmark instrumentation)",
            apply=_patch_update_actor,
            when="latency model",
            critical_when="latency model",
            consequence="the benchmark would time updates at CPU speed, not the modelled cluster's",
        ),
        VerlPatch(
            name="latency_model_update_window",
            target=f"{_TRAINER}:PPOTrainer._balance_batch",
            fingerprint="upsample_batch_to_divisible_size(batch, batch_multiple",
            why="benchmark only: verl has no hook where a batch leaves the sampler, where the modelled update starts",
            upstream="none needed (benchmark instrumentation)",
            apply=_patch_balance_batch,
            when="latency model",
            critical_when="latency model",
            consequence="the benchmark would start each modelled update late, after the real log-prob passes",
        ),
        VerlPatch(
            name="latency_model_replay_buffer_poll",
            target=f"{_TRAINER}:PPOTrainer._build_replay_buffer",
            fingerprint="return sampler_cls(**replay_buffer_kwargs)",
            why="benchmark only: verl's replay buffer poll interval (2 s) is not configurable",
            upstream="a configurable replay-buffer poll interval",
            apply=_patch_replay_buffer_poll,
            when="latency model",
            critical_when="latency model",
            consequence="the benchmark would add verl's unscaled 2 s polls to modelled times",
        ),
        VerlPatch(
            name="latency_model_step_clock",
            target=f"{_TRAINER}:PPOTrainer._compute_metrics",
            fingerprint='metrics.update({"training/global_step": global_steps',
            why="benchmark only: verl logs no wall-clock time per step",
            upstream="a wall-clock timestamp in each step's metrics",
            apply=_patch_step_clock,
            when="latency model",
            critical_when="latency model",
            consequence="the benchmark could not measure step periods",
        ),
        VerlPatch(
            name="latency_model_sync_time",
            target=f"{_CHECKPOINT}:CheckpointEngineManager.update_weights",
            fingerprint="self.build_process_group(rollout)",
            why="benchmark only: verl has no hook to model the weight sync's duration",
            upstream="none needed (benchmark instrumentation)",
            apply=_patch_update_weights,
            when="latency model",
            critical_when="latency model",
            consequence="the benchmark would time weight syncs at CPU speed, not the modelled cluster's",
        ),
        VerlPatch(
            name="latency_model_sync_holds_the_gate",
            target=f"{_CHECKPOINT}:CheckpointEngineManager.resume_generation_replicas",
            fingerprint="r.resume_generation() for r in self.replicas",
            why="benchmark only: verl's sync opens the rollout servers' gate right after its transfer, which takes "
            "milliseconds on CPU; the modelled transfer must hold the gate as the real one would",
            upstream="none needed (benchmark instrumentation)",
            apply=_patch_resume_generation,
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
            apply=_patch_partial_rollout_pause,
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
            apply=_patch_keep_modelled_length,
            when="latency model",
            critical_when="latency model",
            consequence="the separate-pool schedules' updates would be timed on the median length, not the real draws",
        ),
    ),
)
LATENCY_MODEL_PATCHES: tuple[VerlPatch, ...] = LATENCY_MODEL.patches
