"""The ``hf`` rollout server: a Ray actor that serves verl's token-in/token-out ``generate`` with transformers.

verl 0.9.1 generates only through rollout *servers* (vLLM, SGLang, TensorRT-LLM), none of which runs on CPU.
This server speaks the same protocol (``generate(prompt_ids, sampling_params, request_id) -> TokenOutput`` and
the lifecycle calls the trainers make), so verl's agent loop, load balancer, reward streaming and weight sync
run unchanged on top of it.

Concurrent requests are batched: each ``generate`` call parks its request in a queue, and one decode loop takes
everything queued when it becomes free, so requests that arrive while a batch runs join the next batch. Each
request is answered the moment it finishes, not when its batch does, so verl's streaming reward scores it while
the rest of the batch decodes (as on a GPU server). Weight updates and aborts are serialised against that loop,
never against individual requests: a weight update applies between batches, or, asked for with
``finish_weight_update(between_decode_steps=True)``, at the running batch's next decode step, where every request
keeps its KV cache and decodes on under the new weights (an in-flight update, as in PipelineRL). Each answer
reports the versions that sampled its tokens (``global_steps``, ``min_/max_global_steps``, and ``token_versions``
when they differ).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

import ray
import torch

from verl_pipe.backends.cpu.generation_timing import GenerationTiming, ReplicaTiming, generation_timing
from verl_pipe.backends.cpu.hf_generation import BatchedGenerator, GenerationRequest, GenerationResult
from verl_pipe.rollout.in_flight_loads import version_tags

logger = logging.getLogger("verl_pipe.hf_server")
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))  # verl's own verbosity switch; INFO logs every batch

# When set to a file path, every weight sync appends the log-probs of a fixed probe sequence under the served
# weights before and after the sync: evidence, for tests and debugging, that a sync really changed the policy.
WEIGHT_SYNC_PROBE_ENV = "VERL_PIPE_WEIGHT_SYNC_PROBE"
PROBE_PROMPT_IDS = list(range(10, 18))
PROBE_RESPONSE_IDS = list(range(18, 26))
# Requests of one step arrive staggered (the agent loop tokenizes each before sending). A batch starts once no
# new request has arrived for GATHER_QUIET_S, or GATHER_MAX_S after its first request, so they share the batch
# (and each prompt's prefill) instead of the first ones running alone.
GATHER_QUIET_S = 0.05
GATHER_MAX_S = 0.5


def _resolve(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def server_actor_name(replica_rank: int, is_reward_model: bool = False, name_suffix: str = "") -> str:
    kind = "reward_" if is_reward_model else ""
    return f"verl_pipe_hf_server_{kind}{replica_rank}{name_suffix}"


def _cut_result(result: GenerationResult, share: float) -> GenerationResult:
    """The first ``share`` of an answer's tokens, as an aborted answer (what a sync leaves of a timed request)."""
    keep = int(share * len(result.token_ids))
    return GenerationResult(
        token_ids=result.token_ids[:keep],
        log_probs=result.log_probs[:keep],
        finish_reason="abort",
        token_versions=result.token_versions[:keep],
    )


@dataclass
class _Pending:
    request: GenerationRequest
    future: asyncio.Future


class HFRolloutServer:
    """Serves one rollout replica from a transformers model held in this actor's memory."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0, max_batch_size: int = 64):
        from transformers import AutoModelForCausalLM

        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig, RolloutConfig

        self.config: RolloutConfig = omega_conf_to_dataclass(config, dataclass_type=RolloutConfig)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.max_batch_size = max(1, min(max_batch_size, self.config.max_num_seqs))
        torch.manual_seed(self.config.seed + replica_rank)

        dtype = getattr(torch, str(self.config.dtype)) if self.config.dtype else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path, dtype=dtype, attn_implementation="sdpa"
        ).eval()
        tokenizer = self.model_config.tokenizer
        eos_ids = set()
        gen_eos = getattr(self.model_config.generation_config, "eos_token_id", None)
        for value in (gen_eos, getattr(tokenizer, "eos_token_id", None), self.model.config.eos_token_id):
            if isinstance(value, int):
                eos_ids.add(value)
            elif value:
                eos_ids.update(int(v) for v in value)
        pad_id = getattr(tokenizer, "pad_token_id", None)
        self.generator = BatchedGenerator(self.model, sorted(eos_ids), pad_id if pad_id is not None else min(eos_ids))

        self.global_steps: Optional[float] = None
        self._queue: list[_Pending] = []
        self._queue_event = asyncio.Event()
        self._engine_lock = asyncio.Lock()  # held by a running batch and by weight updates
        self._generation_allowed = asyncio.Event()
        self._generation_allowed.set()
        self._abort_requested = False
        self._rejecting = False
        self._staged_weights: dict[str, torch.Tensor] = {}
        # An update waiting for the running batch's next decode step: (global_steps, its waiter).
        self._in_flight_update: Optional[tuple[Optional[float], asyncio.Future]] = None
        # Where a sync's weights load when its caller does not say: set by a trainer mode that never drains the
        # sampler (``set_in_flight_updates``); verl's adapters call ``finish_weight_update`` without the flag.
        self.in_flight_updates = False
        self._loop_task: Optional[asyncio.Task] = None
        # Generation timing (benchmarks only; :mod:`.generation_timing`): this replica's timing state.
        self._replica_timing: Optional[ReplicaTiming] = None
        self._prompt_requests: dict[bytes, int] = {}  # prompt digest -> requests served (the next sample's index)
        # The actor's own torch threads (its OMP_NUM_THREADS share of the cores); a trainer lends it more while it
        # waits for a validation (``lend_torch_threads``).
        self.own_torch_threads = torch.get_num_threads()
        self.torch_threads = self.own_torch_threads  # what the decode thread runs with (set per forward pass)
        self._batch_threads = 0  # the threads the running batch's last forward pass decoded with
        self.stats = {
            "batches": 0, "requests": 0, "max_batch": 0, "tokens": 0, "weight_updates": 0, "last_batch_threads": 0,
        }  # fmt: skip

    # ---- generation -------------------------------------------------------------------------------------------

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._batch_loop())

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        **kwargs: Any,
    ):
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data or kwargs.get("audio_data"):
            raise NotImplementedError("the hf rollout server serves text-only models")
        while not self._generation_allowed.is_set():
            if self._rejecting:
                return TokenOutput(
                    token_ids=[], stop_reason="aborted", extra_fields={"global_steps": self.global_steps}
                )
            await self._generation_allowed.wait()

        prompt_ids = list(prompt_ids)
        budget = self.config.prompt_length + self.config.response_length - len(prompt_ids)
        max_tokens = min(int(sampling_params.get("max_tokens") or self.config.response_length), budget)
        if self.config.max_model_len:
            max_tokens = min(max_tokens, self.config.max_model_len - len(prompt_ids))
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=max(0, max_tokens),
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=int(sampling_params.get("top_k", -1) or -1),
            seed=self._request_seed(prompt_ids, sampling_params),
        )
        timing = generation_timing()
        if timing is None:
            result: GenerationResult = await self._run(request)
            extra_fields = {}
        else:
            result, extra_fields = await self._run_timed(request, timing)
        want_log_probs = bool(sampling_params.get("logprobs", False))
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs if want_log_probs else None,
            # verl's servers report "completed" for both EOS and length; we keep the detail in extra_fields.
            stop_reason="aborted" if result.finish_reason == "abort" else "completed",
            extra_fields={
                **version_tags(result.token_versions, self.global_steps),
                "finish_reason": result.finish_reason,
                **extra_fields,
            },
        )

    def _request_seed(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> int:
        """The request's own sampling seed: the caller's, or one derived from the rollout seed, this replica, the prompt
        and how many times this server has been asked for it (the i-th sample of a prompt), so a run's samples do not
        depend on how its requests were batched."""
        if sampling_params.get("seed") is not None:
            return int(sampling_params["seed"])
        key = hashlib.blake2b(json.dumps(prompt_ids).encode(), digest_size=16).digest()  # small, for long runs
        index = self._prompt_requests.get(key, 0)
        self._prompt_requests[key] = index + 1
        # The replica's rank too (from replica 1 on; replica 0 keeps a lone server's streams): the samples of one
        # prompt may be spread over replicas, each counting from 0.
        fields = [self.config.seed, index] if self.replica_rank == 0 else [self.config.seed, self.replica_rank, index]
        digest = hashlib.blake2b(json.dumps(fields).encode(), key=key, digest_size=8).digest()
        return int.from_bytes(digest, "big")

    async def _run(self, request: GenerationRequest) -> GenerationResult:
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(request, future))
        self._queue_event.set()
        self._ensure_loop()
        return await future

    async def _run_timed(
        self, request: GenerationRequest, timing: GenerationTiming
    ) -> tuple[GenerationResult, dict[str, Any]]:
        """Generate for real; the answer comes back when the timing's replica says the request ends."""
        if self._replica_timing is None:
            self._replica_timing = timing.replica()
        generated_by: list[Optional[float]] = []

        async def generate() -> GenerationResult:
            result = await self._run(request)
            # The tokens came from the weights loaded now; a sync during the timed wait must not retag them.
            generated_by.append(self.global_steps)
            return result

        result, extra_fields = await self._replica_timing.serve(
            request.prompt_ids, generate, aborted=lambda r: r.finish_reason == "abort", cut=_cut_result
        )
        # A timing that models policy versions (in-flight loads during the modelled decode) reports them itself.
        return result, {"global_steps": generated_by[0], **extra_fields}

    async def _gather(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GATHER_MAX_S
        while len(self._queue) < self.max_batch_size and loop.time() < deadline:
            seen = len(self._queue)
            await asyncio.sleep(GATHER_QUIET_S)
            if len(self._queue) == seen:
                return

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._queue_event.wait()
            await self._generation_allowed.wait()
            await self._gather()
            async with self._engine_lock:
                if not self._generation_allowed.is_set():
                    continue  # an abort slipped in while we waited for the lock
                batch, self._queue = self._queue[: self.max_batch_size], self._queue[self.max_batch_size :]
                if not self._queue:
                    self._queue_event.clear()
                if not batch:
                    continue
                self._batch_threads = 0

                def release(index: int, result: GenerationResult, batch=batch) -> None:
                    # Called from the decode thread; the future belongs to the event loop.
                    loop.call_soon_threadsafe(_resolve, batch[index].future, result)

                def policy_version() -> Optional[float]:
                    # Called from the decode thread before every forward pass: an in-flight update loads here, and
                    # lent threads apply here (torch's thread count is per calling thread once that thread has run).
                    self._take_in_flight_update(loop)
                    if torch.get_num_threads() != self.torch_threads:
                        torch.set_num_threads(self.torch_threads)
                    self._batch_threads = torch.get_num_threads()
                    # here, not only once the batch ends: a request's answer is released from the decode thread
                    # before then, and a caller reading the stats right after it must see its batch's threads
                    self.stats["last_batch_threads"] = self._batch_threads
                    return self.global_steps

                try:
                    results = await asyncio.to_thread(
                        self.generator.generate,
                        [p.request for p in batch],
                        lambda: self._abort_requested,
                        on_finished=release,
                        policy_version=policy_version,
                    )
                except Exception as error:  # surface the failure to every waiting request, never hang them
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(error)
                    continue
                finally:
                    self._take_in_flight_update(loop)  # the batch ended before its next decode step
            tokens = sum(len(r.token_ids) for r in results)
            logger.info(
                "hf rollout %d: batch of %d requests (%d greedy), %d tokens, %d threads",
                self.replica_rank, len(batch), sum(p.request.greedy for p in batch), tokens, self._batch_threads,
            )  # fmt: skip
            self.stats["last_batch_threads"] = self._batch_threads
            self.stats["batches"] += 1
            self.stats["requests"] += len(batch)
            self.stats["max_batch"] = max(self.stats["max_batch"], len(batch))
            self.stats["tokens"] += tokens
            for pending, result in zip(batch, results):  # aborted requests, and any not released yet
                _resolve(pending.future, result)

    # ---- weights ----------------------------------------------------------------------------------------------

    async def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Stage one bucket of full (unsharded) weights; :meth:`finish_weight_update` applies them."""
        for name, tensor in named_tensors:
            self._staged_weights[name] = tensor
        return len(named_tensors)

    async def set_in_flight_updates(self, enabled: bool) -> None:
        """Make every later sync load between decode steps (``finish_weight_update``'s default)."""
        self.in_flight_updates = bool(enabled)

    async def finish_weight_update(
        self, global_steps: Optional[float] = None, between_decode_steps: Optional[bool] = None
    ) -> dict[str, Any]:
        """Apply the staged weights and record the policy version they represent.

        By default between batches (a running batch finishes first). With ``between_decode_steps`` the weights load
        at the running batch's next decode step instead: no request is aborted, each keeps its KV cache and decodes
        its remaining tokens under the new weights, and its tokens record which version sampled them. Left unset,
        the server's ``in_flight_updates`` decides.
        """
        if between_decode_steps is None:
            between_decode_steps = self.in_flight_updates
        timing = generation_timing()
        if timing is not None and global_steps is not None:  # the modelled replica switches version here too
            if self._replica_timing is None:
                self._replica_timing = timing.replica()
            loaded = getattr(self._replica_timing, "weights_loaded", None)
            if loaded is not None:
                loaded(global_steps, in_flight=between_decode_steps)
        loop = asyncio.get_running_loop()
        if between_decode_steps and self._engine_lock.locked():
            applied = loop.create_future()
            self._in_flight_update = (global_steps, applied)

            async def when_the_engine_is_free() -> None:  # the batch ended first (or the lock was not a batch's)
                async with self._engine_lock:
                    self._take_in_flight_update(loop)

            fallback = loop.create_task(when_the_engine_is_free())
            try:
                return await applied  # normally the decode thread applies it at its next step
            finally:
                fallback.cancel()
        async with self._engine_lock:
            return self._apply_staged_weights(global_steps)

    def _apply_staged_weights(self, global_steps: Optional[float]) -> dict[str, Any]:
        """Copy the staged weights into the model (whoever holds the engine: the lock holder or the decode thread)."""
        # state_dict keeps every name of a tied tensor (lm_head.weight and embed_tokens.weight).
        params = self.model.state_dict(keep_vars=True)
        unknown = sorted(set(self._staged_weights) - set(params))
        if unknown:
            self._staged_weights.clear()
            raise KeyError(f"weight sync sent tensors the rollout model does not have: {unknown[:5]}")
        probe_path = os.environ.get(WEIGHT_SYNC_PROBE_ENV)
        before = self.generator.score(PROBE_PROMPT_IDS, PROBE_RESPONSE_IDS) if probe_path else None
        with torch.no_grad():
            for name, tensor in self._staged_weights.items():
                params[name].copy_(tensor.to(params[name].dtype))
        updated = len(self._staged_weights)
        self._staged_weights.clear()
        if probe_path:
            after = self.generator.score(PROBE_PROMPT_IDS, PROBE_RESPONSE_IDS)
            record = {"replica": self.replica_rank, "global_steps": global_steps, "before": before, "after": after}
            with open(probe_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        if global_steps is not None:
            self.global_steps = global_steps
        self.stats["weight_updates"] += 1
        return {"updated_tensors": updated, "global_steps": self.global_steps}

    def _take_in_flight_update(self, loop: asyncio.AbstractEventLoop) -> None:
        """Apply a pending in-flight update now (called where the engine is held) and release its waiter."""
        pending, self._in_flight_update = self._in_flight_update, None
        if pending is None:
            return
        global_steps, applied = pending
        try:
            result = self._apply_staged_weights(global_steps)
        except Exception as error:  # the waiter gets the failure; the batch goes on under the old weights
            loop.call_soon_threadsafe(_fail, applied, error)
            return
        loop.call_soon_threadsafe(_resolve, applied, result)

    async def set_global_steps(self, global_steps: float) -> None:
        self.global_steps = global_steps
        loaded = getattr(self._replica_timing, "weights_loaded", None)
        if loaded is not None:  # the modelled replica's version follows (no load: nothing stalls)
            loaded(global_steps, in_flight=False)

    # ---- cores ------------------------------------------------------------------------------------------------

    async def lend_torch_threads(self, extra: int) -> int:
        """Decode with ``extra`` threads more than this actor's own (0: its own again); returns the count now.

        On CPU the trainer's pool and the sampler's split the cores. While the trainer waits for a validation, which
        runs on the sampler alone, it lends its share here: validation is the sampler's slowest work (greedy
        answers run to their length in static batches). Applies from the running batch's next decode step."""
        self.torch_threads = self.own_torch_threads + max(0, int(extra))
        return self.torch_threads

    # ---- lifecycle calls verl makes on every rollout server ---------------------------------------------------

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Stop the running batch (its tokens so far return as "aborted") and hold new requests until resume."""
        self._generation_allowed.clear()
        self._rejecting = reject_request
        self._abort_requested = True
        if self._replica_timing is not None:  # timed requests end where the modelled replica has got to
            self._replica_timing.abort_all()
        async with self._engine_lock:  # wait for the running batch to notice and return
            queued, self._queue = self._queue, []
            self._queue_event.clear()
            for pending in queued:
                if not pending.future.done():
                    pending.future.set_result(GenerationResult(finish_reason="abort"))
        self._abort_requested = False

    async def resume_generation(self) -> None:
        self._rejecting = False
        self._generation_allowed.set()

    # The model lives in host memory, so sleeping and KV-cache release have nothing to free.
    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    # ---- introspection (tests, the benchmark, debugging) ------------------------------------------------------

    async def get_stats(self) -> dict[str, Any]:
        return dict(self.stats, global_steps=self.global_steps, own_torch_threads=self.own_torch_threads)

    async def score(self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0) -> list[float]:
        """Log-probs of a fixed sequence under the served weights (used to verify weight sync)."""
        async with self._engine_lock:
            return await asyncio.to_thread(self.generator.score, prompt_ids, response_ids, temperature)

    def get_server_address(self) -> tuple[str, int]:
        # There is no HTTP endpoint: verl reaches this server through its actor handle only.
        return ray.util.get_node_ip_address().strip("[]"), 0
