"""The GPU clusters the benchmark models, their rooflines from measured figures, and where each number comes from.

A benchmark that compares schedules is only as honest as the cluster it prices them on. Here a cluster is named
after the recipe it stands for (the model, the GPUs, the batch and response lengths), and every rate of its
latency model comes from a roofline calibrated with one real H100's (and H200's) measurements (decode weight
streaming at 75-79% of HBM peak for 14B and ~46% for 1.5B, KV reads at 87-91%, prefill at 61% / 53% MFU,
training at 58% / 47% on one GPU). Each parameter carries its
source, so a reader can see which numbers are measured, which are datasheet figures and which are assumptions
(:meth:`Roofline.sources`).

Every schedule is priced on the same number of GPUs (:meth:`NamedCluster.split`): verl's colocated ``sync`` uses
all of them to generate and then all of them to train; a separate-pool schedule divides the same GPUs into a
sampler pool (``sampler_gpus / tp`` replicas) and a trainer pool.

The CPU benchmark runs fewer real requests than the cluster's batch: each stands for ``request_multiplicity``
of the cluster's requests with the same length (the replicas see the cluster's load per GPU, the trainer the
cluster's tokens), so the step is the cluster's step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from verl_pipe.bench.latency import LatencyModel


class ClusterError(ValueError):
    """A cluster or split that cannot be modelled; the message names the setting."""


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_tflops: float  # dense peak (datasheet)
    hbm_tb_s: float  # peak (datasheet)
    hbm_gb: float


# Vendor datasheets (SXM parts): dense bf16 peak, HBM bandwidth and capacity.
GPUS = {
    "a100": Gpu("a100", 312.0, 2.0, 80.0),
    "h100": Gpu("h100", 989.0, 3.35, 80.0),
    "h200": Gpu("h200", 989.0, 4.8, 141.0),
}


@dataclass(frozen=True)
class ModelShape:
    name: str
    params_b: float
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.params_b * 1e9  # bf16: what a weight sync moves and a replica holds

    @property
    def decode_bytes(self) -> float:
        """What a decode step streams: every weight but the input embedding (a lookup of one row per token)."""
        return 2.0 * (self.params_b * 1e9 - self.vocab * self.hidden)

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


# The architectures the recipes train (their config.json): DeepCoder-14B is Qwen2.5-14B's, DeepCoder-1.5B and
# DeepScaleR-1.5B are DeepSeek-R1-Distill-Qwen-1.5B's (Qwen2.5-Math-1.5B's shape).
SHAPES = {
    "14b": ModelShape("14b", 14.8, layers=48, kv_heads=8, head_dim=128, hidden=5120, vocab=152064),
    "7b": ModelShape("7b", 7.6, layers=28, kv_heads=4, head_dim=128, hidden=3584, vocab=152064),  # Qwen2.5-7B
    "1.5b": ModelShape("1.5b", 1.78, layers=28, kv_heads=2, head_dim=128, hidden=1536, vocab=151936),
}


@dataclass(frozen=True)
class Measured:
    """One GPU's measured efficiencies for one shape (h100_calibration.md, medians of 5-10 timed repeats)."""

    decode_weights: float  # share of HBM peak a decode step streams its weights at (batch 64, CUDA graph)
    decode_mfu: float  # a decode step's matmuls at batch 256, where the step is no longer flat in the batch
    kv_read: float  # share of HBM peak a decode step reads the KV cache at
    prefill_mfu: float
    train_mfu: float  # forward + backward on one GPU, no FSDP, no recompute


# The KV shares are the measured ms per 1K context tokens set against the bytes a token holds (14B: 0.064-0.068 ms
# for 196 KB on the H100; 7B: 0.019-0.021 ms for 57 KB; 1.5B: 0.0096-0.0123 ms for 28 KB), mid-range. The decode
# MFUs are the measured step at batch 256 (14B H100 13.4 ms, 7B 6.98, 1.5B 2.40; H200 11.7, 5.96, 2.16) read as
# 256 x 2 x (its matmul params) FLOPs.
MEASURED = {
    ("h100", "14b"): Measured(decode_weights=0.75, decode_mfu=0.51, kv_read=0.89, prefill_mfu=0.61, train_mfu=0.58),
    ("h100", "7b"): Measured(decode_weights=0.70, decode_mfu=0.49, kv_read=0.86, prefill_mfu=0.59, train_mfu=0.58),
    ("h100", "1.5b"): Measured(decode_weights=0.46, decode_mfu=0.28, kv_read=0.79, prefill_mfu=0.53, train_mfu=0.47),
    ("h200", "14b"): Measured(decode_weights=0.69, decode_mfu=0.58, kv_read=0.89, prefill_mfu=0.61, train_mfu=0.58),
    ("h200", "7b"): Measured(decode_weights=0.64, decode_mfu=0.57, kv_read=0.86, prefill_mfu=0.60, train_mfu=0.57),
    ("h200", "1.5b"): Measured(decode_weights=0.37, decode_mfu=0.31, kv_read=0.77, prefill_mfu=0.53, train_mfu=0.48),
}
# FSDP's communication and activation recompute, on top of the single-GPU training MFU (the calibration's
# estimate: 58% measured becomes ~40% in real runs).
TRAIN_SCALE_OUT = 0.7
# The two all-reduces per layer of a tensor-parallel decode step (the calibration's estimate: 1-2 ms for 48
# layers at TP-2, ~15 us each); none at TP-1.
TP_ALLREDUCE_S = 15e-6
# What the cluster fabric moves between pools: one NCCL broadcast of the weights from the trainer to every sampler
# replica at this rate (an assumption: one 200 Gb/s link per GPU; pinned host<->device measured 54-55 GB/s).
SYNC_GB_S = 25.0
# A staged copy swapped in on the same GPU (device-to-device, measured 18 ms for 14B's 26 GB: 1.46 TB/s of copy).
DEVICE_COPY_GB_S = 1460.0
# Memory vLLM keeps for activations and CUDA graphs beyond weights and KV cache, per GPU (an assumption).
ACTIVATION_RESERVE_GB = 4.0
# verl's default engine cap on running requests per replica (vLLM max_num_seqs).
MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class Workload:
    prompts: int  # per step
    samples: int  # per prompt
    minibatches: int  # optimizer steps per step (train_batch_size / ppo_mini_batch_size)
    median_response_tokens: int
    response_sigma: float  # log-space spread of response lengths (log-normal, capped)
    max_response_tokens: int
    prompt_tokens: int
    reward_s: float  # scoring one sample (0: math, scored in the reward worker at once)
    reward_workers: int  # samples scored at once, the whole cluster

    @property
    def requests(self) -> int:
        return self.prompts * self.samples


@dataclass(frozen=True)
class NamedCluster:
    name: str
    recipe: str  # what it stands for
    shape: str  # key of SHAPES
    gpu: str  # key of GPUS
    gpus: int
    tp: int  # rollout tensor-parallel degree
    workload: Workload
    gpu_memory_utilization: float  # the recipe's rollout setting: HBM share vLLM takes for weights + KV
    # What-if multipliers of the training time and of the weight sync between pools (the sensitivity table); 1 on
    # every named cluster.
    train_scale: float = 1.0
    sync_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.gpu not in GPUS:
            raise ClusterError(f"gpu={self.gpu!r} is not one of {sorted(GPUS)} (--gpu)")
        if self.shape not in SHAPES:
            raise ClusterError(f"model shape {self.shape!r} is not one of {sorted(SHAPES)}")
        if (self.gpu, self.shape) not in MEASURED:
            raise ClusterError(f"no measured roofline for {self.shape} on {self.gpu}: measured {sorted(MEASURED)}")
        if self.tp < 1 or self.gpus < 2 * self.tp or self.gpus % self.tp:
            raise ClusterError(
                f"gpus={self.gpus} must be a multiple of tp={self.tp} with room for two pools (>= {2 * self.tp}) "
                "(--gpus, --tp)"
            )

    def roofline(self) -> "Roofline":
        return Roofline(self)

    def splits(self) -> list[tuple[int, int]]:
        """Every (sampler GPUs, trainer GPUs) division of the cluster a separate-pool schedule may use."""
        return [(s, self.gpus - s) for s in range(self.tp, self.gpus, self.tp)]


class Roofline:
    """The latency model's rates for one named cluster, from the measured efficiencies."""

    def __init__(self, cluster: NamedCluster):
        self.cluster = cluster
        self.gpu = GPUS[cluster.gpu]
        self.shape = SHAPES[cluster.shape]
        self.measured = MEASURED[(cluster.gpu, cluster.shape)]

    @property
    def decode_weights_step_s(self) -> float:
        """A replica's decode step with nothing running but itself: its share of the weights, plus TP's
        all-reduces."""
        c, m = self.cluster, self.measured
        stream = self.shape.decode_bytes / (c.tp * self.gpu.hbm_tb_s * 1e12 * m.decode_weights)
        return stream + (2 * self.shape.layers * TP_ALLREDUCE_S if c.tp > 1 else 0.0)

    @property
    def decode_compute_s_per_request(self) -> float:
        """A decode step's matmuls per running request, once they outweigh streaming the weights."""
        c, m = self.cluster, self.measured
        return self.shape.decode_bytes / (c.tp * self.gpu.bf16_tflops * 1e12 * m.decode_mfu)  # 2 FLOPs a byte-pair

    @property
    def kv_step_s_per_ktoken(self) -> float:
        c, m = self.cluster, self.measured
        return 1000 * self.shape.kv_bytes_per_token / (c.tp * self.gpu.hbm_tb_s * 1e12 * m.kv_read)

    @property
    def prefill_tokens_per_s(self) -> float:
        c, m = self.cluster, self.measured
        return c.tp * self.gpu.bf16_tflops * 1e12 * m.prefill_mfu / (2 * self.shape.params_b * 1e9)

    def train_s_per_ktoken(self, trainer_gpus: int) -> float:
        """Old log-probs (2 x params FLOPs per token) plus the update (6 x params) on ``trainer_gpus``."""
        flops_per_s = trainer_gpus * self.gpu.bf16_tflops * 1e12 * self.measured.train_mfu * TRAIN_SCALE_OUT
        return self.cluster.train_scale * 1000 * 8 * self.shape.params_b * 1e9 / flops_per_s

    @property
    def broadcast_sync_s(self) -> float:
        """A weight sync between pools: the whole weights over the fabric."""
        return self.cluster.sync_scale * self.shape.weight_bytes / (SYNC_GB_S * 1e9)

    @property
    def colocated_sync_s(self) -> float:
        """A weight sync inside the GPUs that trained (verl's hybrid engine): each GPU's shard copied in place."""
        return self.shape.weight_bytes / self.cluster.tp / (DEVICE_COPY_GB_S * 1e9)

    def kv_token_capacity(self, staged: bool = False) -> float:
        """KV tokens a replica holds: its GPUs' HBM share, less the weights (twice over with a staged copy)."""
        c, s = self.cluster, self.shape
        usable = c.tp * (self.gpu.hbm_gb * c.gpu_memory_utilization - ACTIVATION_RESERVE_GB) * 1e9
        weights = self.shape.weight_bytes * (2 if staged else 1)
        if usable <= weights:
            raise ClusterError(
                f"{c.name}: the {s.params_b:g}B weights{' and their staged copy' if staged else ''} do not fit a "
                f"TP-{c.tp} replica's {usable / 1e9:.0f} GB of {c.gpu} memory: raise --tp or pick a larger --gpu"
            )
        return (usable - weights) / self.shape.kv_bytes_per_token

    def replica_concurrency(self, mean_response_tokens: float, staged: bool = False) -> int:
        """Requests a replica runs at once: what its KV cache holds of requests at their mean length (capped by the
        engine's ``max_num_seqs``)."""
        held = self.kv_token_capacity(staged) / (self.cluster.workload.prompt_tokens + mean_response_tokens)
        return max(1, min(MAX_NUM_SEQS, int(held)))

    def sources(self) -> list[tuple[str, str, str]]:
        """(parameter, value, where it comes from), for the report."""
        c, m, g, s = self.cluster, self.measured, self.gpu, self.shape
        return [
            ("GPU", f"{c.gpus} x {g.name} ({g.bf16_tflops:g} TFLOPS bf16, {g.hbm_tb_s:g} TB/s, {g.hbm_gb:g} GB)",
             "vendor datasheet"),
            ("model", f"{s.params_b:g}B, {s.layers} layers, {s.kv_heads} KV heads of {s.head_dim}: "
                      f"{s.kv_bytes_per_token / 1e3:.0f} KB KV per token", "the model's config.json"),
            ("decode: weights per step", f"{1e3 * self.decode_weights_step_s:.2f} ms at TP-{c.tp}",
             f"measured {m.decode_weights:.0%} of HBM peak (1 GPU, batch 64)"
             + (f" + {2 * s.layers} all-reduces of {TP_ALLREDUCE_S * 1e6:.0f} us (estimate)" if c.tp > 1 else "")),
            ("decode: compute", f"{1e6 * self.decode_compute_s_per_request:.1f} us per running request per step",
             f"measured step at batch 256 ({m.decode_mfu:.0%} MFU): the step's floor beyond ~"
             f"{self.decode_weights_step_s / self.decode_compute_s_per_request:.0f} requests"),
            ("decode: KV read", f"{1e3 * self.kv_step_s_per_ktoken:.4f} ms per 1K context tokens per step",
             f"measured {m.kv_read:.0%} of HBM peak"),
            ("prefill", f"{self.prefill_tokens_per_s / 1e3:.1f}K tokens/s per replica",
             f"measured {m.prefill_mfu:.0%} MFU"),
            ("training", f"{m.train_mfu * TRAIN_SCALE_OUT:.0%} MFU on 8 x params FLOPs per token",
             f"measured {m.train_mfu:.0%} on 1 GPU x {TRAIN_SCALE_OUT} for FSDP and recompute (estimate)"),
            ("weight sync between pools", f"{self.broadcast_sync_s:.2f} s", f"{SYNC_GB_S:g} GB/s (assumption)"),
            ("weight sync colocated", f"{1e3 * self.colocated_sync_s:.1f} ms",
             f"device copy at {DEVICE_COPY_GB_S / 1e3:.2f} TB/s (measured)"),
            ("KV room", f"{self.kv_token_capacity() / 1e3:.0f}K tokens per replica "
                        f"({self.kv_token_capacity(staged=True) / 1e3:.0f}K with a staged copy)",
             f"gpu_memory_utilization {c.gpu_memory_utilization} (recipe) less {ACTIVATION_RESERVE_GB:g} GB "
             "per GPU (assumption)"),
            ("responses", f"median {c.workload.median_response_tokens}, sigma {c.workload.response_sigma}, "
                          f"cap {c.workload.max_response_tokens}", "assumption (the sensitivity table varies sigma)"),
            ("reward", f"{c.workload.reward_s:g} s per sample on {c.workload.reward_workers} workers",
             "assumption" if c.workload.reward_s else "math: scored at once"),
        ]  # fmt: skip


# The headline clusters: the recipes' own settings (recipes/*.sh) on the GPUs they were written for.
CLUSTERS = {
    "deepcoder-14b": NamedCluster(
        name="deepcoder-14b", recipe="DeepCoder-14B stage 1 (recipes/deepcoder_14b.sh), coding", shape="14b",
        gpu="h100", gpus=32, tp=2, gpu_memory_utilization=0.8,
        workload=Workload(prompts=32, samples=8, minibatches=2, median_response_tokens=7000, response_sigma=0.6,
                          max_response_tokens=16384, prompt_tokens=1000, reward_s=2.0, reward_workers=128),
    ),
    "deepscaler-1.5b": NamedCluster(
        name="deepscaler-1.5b", recipe="DeepScaleR-1.5B stage 1 (recipes/deepscaler_1.5b.sh), math", shape="1.5b",
        gpu="h100", gpus=8, tp=1, gpu_memory_utilization=0.85,
        workload=Workload(prompts=128, samples=8, minibatches=2, median_response_tokens=3000, response_sigma=0.6,
                          max_response_tokens=8192, prompt_tokens=500, reward_s=0.0, reward_workers=1024),
    ),
    "deepcoder-1.5b": NamedCluster(
        name="deepcoder-1.5b", recipe="DeepCoder-1.5B (recipes/deepcoder_1.5b.sh), coding", shape="1.5b",
        gpu="h100", gpus=8, tp=1, gpu_memory_utilization=0.8,
        workload=Workload(prompts=64, samples=8, minibatches=2, median_response_tokens=9000, response_sigma=0.6,
                          max_response_tokens=32768, prompt_tokens=1000, reward_s=2.0, reward_workers=64),
    ),
}  # fmt: skip


def with_workload(cluster: NamedCluster, **changes) -> NamedCluster:
    """The cluster with some workload fields changed (the sensitivity table, the planner's flags)."""
    return replace(cluster, workload=replace(cluster.workload, **changes))


def mean_response_tokens(workload: Workload) -> float:
    """The mean of the capped log-normal response length."""
    from statistics import NormalDist

    mu, sigma, cap = math.log(workload.median_response_tokens), workload.response_sigma, workload.max_response_tokens
    if sigma == 0:
        return float(min(cap, workload.median_response_tokens))
    z = (math.log(cap) - mu) / sigma
    normal = NormalDist()
    uncapped_part = math.exp(mu + sigma * sigma / 2) * normal.cdf(z - sigma)
    return uncapped_part + cap * (1 - normal.cdf(z))


@dataclass(frozen=True)
class Engine:
    """How a rollout engine receives new weights; a property of the modelled engine, the same for every schedule.

    ``today``: a load pauses decoding for the transfer (vLLM's weight RPC and ``pause_generation``, SGLang's pause);
    requests keep their KV cache unless the trainer aborts them (verl's ``separate_async`` does, and then every
    aborted request pays its prefill again). ``staged``: the weights arrive into a second copy beside decoding and
    swap in between two decode steps (no engine does this today; a labelled what-if): no stall, but the copy takes
    KV room, so each replica runs fewer requests at once.
    """

    name: str
    staged: bool
    summary: str


ENGINES = {
    "today": Engine("today", staged=False,
                    summary="a load pauses decoding for the transfer, as vLLM and SGLang do today"),
    "staged": Engine("staged", staged=True,
                     summary="what-if: loads arrive beside decoding, the second weight copy taken from KV room"),
}  # fmt: skip


def engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ClusterError(f"engine={name!r} is not one of {', '.join(ENGINES)} (--engine)")
    return ENGINES[name]


def cluster(name: str) -> NamedCluster:
    if name not in CLUSTERS:
        raise ClusterError(f"cluster={name!r} is not one of {', '.join(CLUSTERS)} (--clusters)")
    return CLUSTERS[name]


def request_multiplicity(cluster: NamedCluster, bench_requests: int) -> int:
    """How many of the cluster's requests each of the benchmark's real requests stands for."""
    total = cluster.workload.requests
    if bench_requests < 1 or total % bench_requests:
        raise ClusterError(
            f"{cluster.name}: its {total} requests per step are not a whole multiple of the benchmark's "
            f"{bench_requests} (--prompts x --samples)"
        )
    return total // bench_requests


@dataclass(frozen=True)
class Layout:
    """Where a schedule runs on the cluster: ``sync`` generates and trains on all GPUs in turn (colocated); a
    separate-pool schedule splits them."""

    sampler_gpus: int
    trainer_gpus: int
    colocated: bool

    @property
    def gpus(self) -> int:
        return self.sampler_gpus if self.colocated else self.sampler_gpus + self.trainer_gpus

    def describe(self) -> str:
        return f"{self.gpus} colocated" if self.colocated else f"{self.sampler_gpus} sampler + {self.trainer_gpus} trainer"


def colocated(cluster: NamedCluster) -> Layout:
    return Layout(cluster.gpus, cluster.gpus, colocated=True)


def split(cluster: NamedCluster, sampler_gpus: int) -> Layout:
    if (sampler_gpus, cluster.gpus - sampler_gpus) not in cluster.splits():
        raise ClusterError(
            f"{cluster.name}: {sampler_gpus} sampler GPUs is not a split of {cluster.gpus} GPUs in multiples of "
            f"tp={cluster.tp} leaving a trainer GPU (--sampler-gpus)"
        )
    return Layout(sampler_gpus, cluster.gpus - sampler_gpus, colocated=False)


def latency_model(cluster: NamedCluster, layout: Layout, engine: Engine, bench_requests: int, seed: int = 0,
                  time_scale: float = 1.0) -> LatencyModel:  # fmt: skip
    """The latency model of one schedule's layout on the cluster, for a benchmark that runs ``bench_requests`` real
    requests a step (each standing for ``request_multiplicity`` of the cluster's)."""
    roof, work = cluster.roofline(), cluster.workload
    multiplicity = request_multiplicity(cluster, bench_requests)
    return LatencyModel(
        decode_tokens_per_s=1.0 / roof.decode_weights_step_s,
        decode_compute_s_per_request=roof.decode_compute_s_per_request,
        kv_step_s_per_ktoken=roof.kv_step_s_per_ktoken,
        replica_concurrency=roof.replica_concurrency(mean_response_tokens(work), staged=engine.staged),
        replicas=layout.sampler_gpus // cluster.tp,
        request_multiplicity=multiplicity,
        prompt_tokens=work.prompt_tokens,
        prefill_tokens_per_s=roof.prefill_tokens_per_s,
        median_response_tokens=work.median_response_tokens,
        response_sigma=work.response_sigma,
        max_response_tokens=work.max_response_tokens,
        # per thousand of the benchmark's modelled tokens: each stands for `multiplicity` of the cluster's
        train_s_per_ktoken=roof.train_s_per_ktoken(layout.trainer_gpus) * multiplicity,
        sync_s=roof.colocated_sync_s if layout.colocated else roof.broadcast_sync_s,
        reward_s=work.reward_s,
        reward_workers=max(1, work.reward_workers // multiplicity),
        staged_loads=engine.staged,
        time_scale=time_scale,
        seed=seed,
    )
