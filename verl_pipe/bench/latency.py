"""A latency model that makes the CPU backend take the time a GPU cluster would, while the real dataflow runs.

Whether a schedule hides latency is a property of the scheduler, not of the chips. With this model switched
on, the tiny CPU model still produces every token, reward, log-prob and update, but each phase lasts as long as
the modelled cluster needs, so the real trainers' real scheduling is what a benchmark measures. Waiting is done
by sleeping, which costs no CPU, so overlap measured on a 2-core machine is real overlap.

The modelled phases (all in modelled seconds, scaled to wall seconds by ``time_scale``):

* **generation** on a modelled replica (:mod:`verl_pipe.bench.replica_model`): each decode step streams the
  weights and the KV cache of every running request and gives each one token, so a step costs
  ``1 / decode_tokens_per_s + kv_step_s_per_ktoken * context / 1000`` (``context``: the tokens all running
  requests hold) and a request decodes slower the more and the longer its neighbours are; admitting a request
  prefills its prefix at ``prefill_tokens_per_s``, stalling the replica. A replica runs at most
  ``replica_concurrency`` requests at once; the rest queue. A request's response length ``L`` is drawn from a
  long-tailed distribution (log-normal, capped at ``max_response_tokens``) and depends only on the seed, the
  prompt and the sample's index among that prompt's requests, so every schedule sees the same workload. A sync
  that aborts requests ends them where the replica had got to; they resume under the new weights and pay the
  prefill of their whole prefix again.
* **training** (old log-probs plus the actor update): ``train_s_per_ktoken`` per thousand modelled response
  tokens trained.
* **weight sync**: ``sync_s`` per sync. An in-flight load (``in_flight_pipeline``) stalls the replica for it,
  unless the replica stages loads (``staged_loads``): it receives the weights into a second buffer while it
  decodes and swaps them in between two decode steps when the transfer ends. That buffer is memory the KV cache
  no longer has, so a staging replica runs fewer requests at once (the named cluster's calibration,
  :mod:`verl_pipe.bench.cluster`, sets ``replica_concurrency`` for it).
* **reward**: ``reward_s`` per sample (the modelled reward function, :mod:`verl_pipe.bench.modelled_reward`), or
  the real sandbox; every schedule scores each sample as it finishes (verl's V1 trainer streams rule rewards).

A real phase that takes longer than its model is not shortened: the model pads, it never subtracts.

The model reaches every process (driver, rollout servers, reward workers) through the environment variable
``VERL_PIPE_LATENCY_MODEL`` holding its JSON; the ``hf`` rollout servers take their generation times from it
through their timing slot (:mod:`verl_pipe.backends.cpu.generation_timing`), which names :func:`active_model`.
:func:`worker_env_vars` gives both variables (put them in ``ray_kwargs.ray_init.runtime_env.env_vars``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional, Sequence

from verl_pipe.backends.cpu.generation_timing import GENERATION_TIMING_ENV
from verl_pipe.bench.replica_model import ModelledReplica, batch_generation_s

LATENCY_MODEL_ENV = "VERL_PIPE_LATENCY_MODEL"


class LatencyModelError(ValueError):
    """A latency-model setting that cannot work; the message names the field."""


@dataclass(frozen=True)
class LatencyModel:
    # A decode step of a replica streams the weights (1 / decode_tokens_per_s: the speed of a request alone) and
    # the KV cache of every running request (kv_step_s_per_ktoken per thousand tokens held). Defaults: the sizing
    # roofline of a 14B model on a TP-2 H100 replica at 60% of HBM bandwidth (28 GB of bf16 weights -> 7 ms a
    # step, 143 tokens/s alone; Qwen2.5-14B holds 196 KB of KV per token -> 0.049 ms per thousand tokens), so a
    # batch of 32 requests 4K tokens deep decodes at ~71 tokens/s each.
    decode_tokens_per_s: float = 143.0
    kv_step_s_per_ktoken: float = 4.9e-5
    # With many requests running a step becomes compute-bound: this many seconds of matmuls per running request
    # (0: never; the named clusters set it from the measured decode step at batch 256).
    decode_compute_s_per_request: float = 0.0
    # Requests a replica runs at once (the rest queue); KV capacity is what bounds it on a GPU.
    replica_concurrency: int = 256
    # The sampler pool: this many replicas, each request sent to the least loaded (replica_model.PoolSim).
    replicas: int = 1
    # The cluster's requests each real request of the benchmark stands for (same length, same replica): the
    # replicas carry the cluster's load per GPU while the CPU runs a fraction of its requests.
    request_multiplicity: int = 1
    # Prefill: the prompt's modelled length, and the rate a replica prefills at (compute-bound: 2 x 14B FLOPs per
    # token at 40% of two H100s' bf16 peak, ~28K tokens/s). The replica decodes nothing during a prefill.
    prompt_tokens: int = 1000
    prefill_tokens_per_s: float = 28000.0
    # Response lengths: log-normal with this median and log-space sigma, capped. Defaults follow DeepCoder's
    # stage-1 training (16K cap; average response length ~8K early in training: the DeepCoder / rLLM thesis,
    # fig. 4.4); with sigma 0.6 about 8% of responses hit the cap, so nearly every batch of 32 has a straggler at
    # the limit.
    median_response_tokens: int = 7000
    response_sigma: float = 0.6
    max_response_tokens: int = 16384
    train_s_per_ktoken: float = 0.5
    sync_s: float = 10.0
    reward_s: float = 0.0  # modelled reward per sample (0: math-like)
    reward_workers: int = 8  # samples scored at once (set reward.interleaved.concurrency to match)
    # In-flight loads arrive into a second weight buffer beside decoding (no stall; the version switches when the
    # transfer ends); the buffer's room comes out of replica_concurrency (cluster.latency_model sets both).
    staged_loads: bool = False
    time_scale: float = 1.0  # wall seconds per modelled second
    seed: int = 0

    def __post_init__(self):
        positive = ("decode_tokens_per_s", "prefill_tokens_per_s", "median_response_tokens", "max_response_tokens",
                    "time_scale")  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise LatencyModelError(f"latency_model.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("kv_step_s_per_ktoken", "prompt_tokens", "response_sigma", "train_s_per_ktoken", "sync_s",
                     "reward_s", "decode_compute_s_per_request"):  # fmt: skip
            if getattr(self, name) < 0:
                raise LatencyModelError(f"latency_model.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("replica_concurrency", "reward_workers", "replicas", "request_multiplicity"):
            if int(getattr(self, name)) < 1:
                raise LatencyModelError(f"latency_model.{name} must be >= 1, got {getattr(self, name)!r}")

    # --- the modelled quantities --------------------------------------------------------------------------------

    def response_tokens(self, prompt_ids: Sequence[int], sample_index: int) -> int:
        """The modelled response length of the ``sample_index``-th request for this prompt (deterministic)."""
        digest = hashlib.blake2b(
            json.dumps([self.seed, list(map(int, prompt_ids)), int(sample_index)]).encode(), digest_size=16
        ).digest()
        # Two uniforms from the hash -> one standard normal (Box-Muller); no global RNG state involved.
        u1 = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64
        u2 = int.from_bytes(digest[8:], "big") / 2**64
        normal = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        length = self.median_response_tokens * math.exp(self.response_sigma * normal)
        return max(1, min(self.max_response_tokens, int(round(length))))

    def generation_s(self, response_tokens: int) -> float:
        """Modelled seconds for one request alone on a replica: its prefill, then its decode steps."""
        return batch_generation_s(self, [response_tokens])

    def train_s(self, response_tokens: int) -> float:
        return self.train_s_per_ktoken * response_tokens / 1000.0

    def wall(self, modelled_s: float) -> float:
        """Modelled seconds to wall-clock seconds."""
        return modelled_s * self.time_scale

    def replica(self) -> ModelledReplica:
        """The rollout servers' timing slot: a modelled replica per server (the trainer-side hooks read each
        request's modelled length back from its answer, ``modelled_response_tokens``)."""
        return ModelledReplica(self)

    # --- transport ----------------------------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> "LatencyModel":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise LatencyModelError(f"unknown latency_model key(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


_CACHED: tuple[Optional[str], Optional[LatencyModel]] = (None, None)


def active_model() -> Optional[LatencyModel]:
    """The model switched on in this process's environment, or None (the default: no latency is added)."""
    global _CACHED
    raw = os.environ.get(LATENCY_MODEL_ENV) or None
    if raw != _CACHED[0]:
        if raw is None:
            model = None
        else:
            text = open(raw, encoding="utf-8").read() if not raw.lstrip().startswith("{") else raw
            model = LatencyModel.from_mapping(json.loads(text))
        _CACHED = (raw, model)
    return _CACHED[1]


def worker_env_vars(model_json_or_path: str) -> dict[str, str]:
    """The environment that switches the model on in a process: its JSON (or path), and the rollout servers'
    timing slot pointed at :func:`active_model`."""
    return {LATENCY_MODEL_ENV: model_json_or_path, GENERATION_TIMING_ENV: f"{__name__}:active_model"}
