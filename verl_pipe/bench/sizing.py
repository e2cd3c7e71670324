"""``verl-pipe bench size``: which sampler/trainer split of a GPU cluster the latency model predicts is fastest.

The helper turns a cluster (GPU type and count, model size, batch, response lengths) into the latency model of
:mod:`verl_pipe.bench.latency` for every split, predicts the step time of each schedule, and says which
resource bounds the step. Rough rooflines, stated so they can be checked and changed:

* **decode** is memory-bound: each decode step of a replica (tensor-parallel degree ``tp``) streams the weights
  (``2 * params`` bytes) and the KV cache of every running request, split over its ``tp`` GPUs at
  ``hbm_efficiency`` of their HBM bandwidth, and gives every running request one token. As requests finish the
  steps get cheaper; a replica runs at most ``replica_concurrency`` requests at once (the rest wait), and the
  batch's generation ends with its slowest replica.
* **training** (old log-probs plus forward and backward) costs ``8 * params`` FLOPs per token at ``mfu`` of the
  GPUs' dense bf16 peak.
* **weight sync** moves ``2 * params`` bytes at ``sync_gb_s`` (NCCL between pools).
* **reward** (coding): ``reward_s`` per sample on ``reward_workers`` parallel sandboxes.

One-off pipelining's step is ``max(gen + exposed reward + sync, train + sync)`` on separate pools (the sampler
stops for each sync; rewards stream during generation); verl's ``sync`` mode runs
``gen + reward tail + train + sync`` with every GPU doing both.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Optional

from verl_pipe.bench.latency import LatencyModel


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_tflops: float  # dense peak
    hbm_tb_s: float


# Vendor datasheets: A100 SXM 80GB (312 TFLOPS bf16 dense, 2.0 TB/s), H100 SXM (989 TFLOPS, 3.35 TB/s),
# H200 SXM (989 TFLOPS, 4.8 TB/s).
GPUS = {
    "a100": Gpu("a100", 312.0, 2.0),
    "h100": Gpu("h100", 989.0, 3.35),
    "h200": Gpu("h200", 989.0, 4.8),
}


@dataclass(frozen=True)
class ClusterSpec:
    gpus: int = 32
    gpu: str = "h100"
    params_b: float = 14.0  # model size, billions of parameters
    prompts: int = 64  # per step
    samples: int = 8
    median_response_tokens: int = 7000
    max_response_tokens: int = 16384
    response_sigma: float = 0.6
    tp: int = 2  # rollout tensor parallel degree
    replica_concurrency: int = 256
    reward_s: float = 0.0  # per sample
    reward_workers: int = 64
    prompt_tokens: int = 1000
    # KV cache bytes per token per billion parameters: Qwen2.5-14B (48 layers x 8 KV heads x 128 x K,V x bf16)
    # holds ~196 KB per token, ~14 KB per B; the 1.5B distills ~28 KB per token.
    kv_bytes_per_token_per_b: float = 14_000.0
    mfu: float = 0.4
    hbm_efficiency: float = 0.6
    sync_gb_s: float = 25.0
    seed: int = 0

    def validate(self) -> None:
        if self.gpu not in GPUS:
            raise ValueError(f"gpu={self.gpu!r} is not one of {sorted(GPUS)}")
        if self.gpus < 2 or self.gpus % self.tp:
            raise ValueError(f"gpus={self.gpus} must be >= 2 and a multiple of tp={self.tp}")
        for name in ("params_b", "prompts", "samples", "mfu", "hbm_efficiency", "sync_gb_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def latency_model(spec: ClusterSpec, sampler_gpus: int, trainer_gpus: int) -> LatencyModel:
    """The latency model of one split: sampler and trainer pools of the given sizes (the same GPUs if colocated)."""
    if sampler_gpus < spec.tp or trainer_gpus < 1:
        raise ValueError(f"a split needs >= tp={spec.tp} sampler GPUs and >= 1 trainer GPU, got {sampler_gpus}/{trainer_gpus}")
    gpu = GPUS[spec.gpu]
    params = spec.params_b * 1e9
    # an unloaded replica's speed: one token per pass over the weights; each running request's KV cache on top
    bandwidth = spec.tp * gpu.hbm_tb_s * 1e12 * spec.hbm_efficiency
    step_s = 2 * params / bandwidth
    train_flops_per_s = trainer_gpus * gpu.bf16_tflops * 1e12 * spec.mfu
    return LatencyModel(
        decode_tokens_per_s=1.0 / step_s,
        kv_step_s_per_ktoken=1000 * spec.kv_bytes_per_token_per_b * spec.params_b / bandwidth,
        replica_concurrency=spec.replica_concurrency,
        prompt_tokens=spec.prompt_tokens,
        # prefill is compute-bound: 2 x params FLOPs per token on the replica's GPUs
        prefill_tokens_per_s=spec.tp * gpu.bf16_tflops * 1e12 * spec.mfu / (2 * params),
        median_response_tokens=spec.median_response_tokens,
        response_sigma=spec.response_sigma,
        max_response_tokens=spec.max_response_tokens,
        train_s_per_ktoken=8 * params * 1000 / train_flops_per_s,
        sync_s=2 * params / (spec.sync_gb_s * 1e9),
        reward_s=spec.reward_s,
        reward_workers=spec.reward_workers,
        seed=spec.seed,
    )


@dataclass(frozen=True)
class Phases:
    gen_s: float
    reward_tail_s: float  # streamed reward still running after the last sample is generated
    train_s: float
    sync_s: float


def _draws(spec: ClusterSpec, trials: int) -> list[list[int]]:
    """Response lengths of ``trials`` batches, from the latency model's distribution (the same for every split)."""
    model = LatencyModel(median_response_tokens=spec.median_response_tokens, response_sigma=spec.response_sigma,
                         max_response_tokens=spec.max_response_tokens, seed=spec.seed)  # fmt: skip
    requests = spec.prompts * spec.samples
    return [[model.response_tokens([trial], i) for i in range(requests)] for trial in range(trials)]


def _replica_decode_s(lengths: list[int], spec: ClusterSpec) -> float:
    """Time for one replica to decode its requests: each decode step streams the weights and every running
    request's KV cache, and gives each running request one token; requests beyond the concurrency wait."""
    gpu = GPUS[spec.gpu]
    bandwidth = gpu.hbm_tb_s * 1e12 * spec.hbm_efficiency * spec.tp
    weights = 2 * spec.params_b * 1e9
    kv_per_token = spec.kv_bytes_per_token_per_b * spec.params_b
    total = 0.0
    for wave_start in range(0, len(lengths), spec.replica_concurrency):
        wave = sorted(lengths[wave_start : wave_start + spec.replica_concurrency])
        done = 0
        for i, length in enumerate(wave):  # between consecutive finishes, len(wave) - i requests run
            steps = length - done
            if steps <= 0:
                continue
            running = len(wave) - i
            # KV read per step: every running request's context, prompt plus the tokens so far (mean of the segment)
            context = running * (spec.prompt_tokens + (done + length) / 2)
            total += steps * (weights + kv_per_token * context) / bandwidth
            done = length
    return total


def predict_phases(spec: ClusterSpec, sampler_gpus: int, trainer_gpus: int,
                   draws: Optional[list[list[int]]] = None) -> Phases:  # fmt: skip
    """Expected phase times of one step on this split, averaged over sampled batches."""
    model = latency_model(spec, sampler_gpus, trainer_gpus)
    draws = draws if draws is not None else _draws(spec, trials=20)
    replicas = max(1, sampler_gpus // spec.tp)
    gens = []
    for lengths in draws:
        # verl's load balancer spreads requests evenly: replica r takes every replicas-th request
        gens.append(max(_replica_decode_s(lengths[r::replicas], spec) for r in range(replicas)))
    tokens = statistics.mean(sum(lengths) for lengths in draws)
    return Phases(
        gen_s=statistics.mean(gens), reward_tail_s=model.reward_s, train_s=model.train_s(tokens), sync_s=model.sync_s
    )


@dataclass(frozen=True)
class SplitPrediction:
    sampler_gpus: int
    trainer_gpus: int
    phases: Phases
    step_s: float
    bound_by: str  # "sampler" or "trainer"


def predict_one_off(spec: ClusterSpec, sampler_gpus: int, draws=None) -> SplitPrediction:
    trainer_gpus = spec.gpus - sampler_gpus
    phases = predict_phases(spec, sampler_gpus, trainer_gpus, draws)
    sampler_cycle = phases.gen_s + phases.reward_tail_s + phases.sync_s
    trainer_cycle = phases.train_s + phases.sync_s
    return SplitPrediction(
        sampler_gpus, trainer_gpus, phases, max(sampler_cycle, trainer_cycle),
        "sampler" if sampler_cycle >= trainer_cycle else "trainer",
    )  # fmt: skip


def predict_sync(spec: ClusterSpec, draws=None) -> float:
    """verl's colocated ``sync`` mode: every GPU generates, then every GPU trains."""
    phases = predict_phases(spec, spec.gpus, spec.gpus, draws)
    return phases.gen_s + phases.reward_tail_s + phases.train_s + phases.sync_s


@dataclass(frozen=True)
class SizingReport:
    spec: ClusterSpec
    splits: list[SplitPrediction]
    best: SplitPrediction
    sync_step_s: float

    def format(self) -> str:
        lines = [
            f"{self.spec.params_b:g}B on {self.spec.gpus} x {self.spec.gpu}, {self.spec.prompts} prompts x "
            f"{self.spec.samples} samples, responses median {self.spec.median_response_tokens} / cap "
            f"{self.spec.max_response_tokens} tokens",
            f"  {'sampler':>7s} {'trainer':>7s} {'gen s':>8s} {'train s':>8s} {'sync s':>7s} {'step s':>8s}  bound by",
        ]
        for split in self.splits:
            mark = "  <- best" if split == self.best else ""
            p = split.phases
            lines.append(
                f"  {split.sampler_gpus:7d} {split.trainer_gpus:7d} {p.gen_s:8.1f} {p.train_s:8.1f} {p.sync_s:7.1f} "
                f"{split.step_s:8.1f}  {split.bound_by}{mark}"
            )
        lines.append(
            f"one_off_pipeline with {self.best.sampler_gpus} sampler / {self.best.trainer_gpus} trainer GPUs: "
            f"{self.best.step_s:.1f} s per step, bounded by the {self.best.bound_by}; verl sync on all "
            f"{self.spec.gpus} GPUs: {self.sync_step_s:.1f} s ({self.sync_step_s / self.best.step_s:.2f}x)"
        )
        return "\n".join(lines)


def recommend_split(spec: ClusterSpec, step: Optional[int] = None) -> SizingReport:
    """Every split in multiples of the rollout TP degree (both pools non-empty), and the fastest one."""
    spec.validate()
    step = step or spec.tp
    draws = _draws(spec, trials=20)
    splits = [predict_one_off(spec, s, draws) for s in range(step, spec.gpus, step)]
    best = min(splits, key=lambda split: split.step_s)
    return SizingReport(spec=spec, splits=splits, best=best, sync_step_s=predict_sync(spec, draws))


def with_overrides(spec: ClusterSpec, **values) -> ClusterSpec:
    return replace(spec, **{k: v for k, v in values.items() if v is not None})
