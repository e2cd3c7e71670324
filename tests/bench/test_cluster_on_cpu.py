"""The named clusters' rooflines: the measured H100 figures they come from, worked by hand, and their limits."""

from __future__ import annotations

import math

import pytest

from verl_pipe.bench import cluster as clusters
from verl_pipe.bench.cluster import CLUSTERS, ClusterError, mean_response_tokens


def test_the_14b_rates_follow_the_measured_h100_figures():
    """h100_calibration.md: decode weights at 75% of 3.35 TB/s, KV at 89%, prefill 61% MFU, training 58% x 0.7."""
    roof = CLUSTERS["deepcoder-14b"].roofline()
    weights, streamed = 2 * 14.8e9, 2 * (14.8e9 - 152064 * 5120)  # a decode step looks up, not streams, embeddings
    assert roof.decode_weights_step_s == pytest.approx(streamed / (2 * 3.35e12 * 0.75) + 96 * 15e-6)
    # the calibration's reading of the same: ~5.4 ms at TP-2 plus 1-2 ms of all-reduces, ~7 ms
    assert 6.5e-3 < roof.decode_weights_step_s < 7.5e-3
    # batch 256 on one H100 measured 13.4 ms: the compute floor reproduces it
    one_gpu = clusters.NamedCluster("x", "x", "14b", "h100", 2, 1, CLUSTERS["deepcoder-14b"].workload, 0.9).roofline()
    assert 256 * one_gpu.decode_compute_s_per_request == pytest.approx(13.4e-3 * 28.0 / 26.4, rel=0.02)
    assert roof.kv_step_s_per_ktoken == pytest.approx(1000 * 2 * 48 * 8 * 128 * 2 / (2 * 3.35e12 * 0.89))
    # the calibration's reading: TP-2 at the measured rate is ~0.033 ms per 1K context tokens, prefill 36-40K tok/s
    assert 0.030e-3 < roof.kv_step_s_per_ktoken < 0.036e-3 and 36e3 < roof.prefill_tokens_per_s < 42e3
    assert roof.train_s_per_ktoken(32) == pytest.approx(1000 * 8 * 14.8e9 / (32 * 989e12 * 0.58 * 0.7))
    assert roof.train_s_per_ktoken(8) == pytest.approx(4 * roof.train_s_per_ktoken(32))  # linear in trainer GPUs
    assert roof.broadcast_sync_s == pytest.approx(weights / 25e9)
    assert roof.colocated_sync_s < 0.02 < roof.broadcast_sync_s


def test_kv_room_bounds_the_requests_a_replica_runs_and_a_staged_copy_takes_some():
    roof = CLUSTERS["deepcoder-14b"].roofline()
    usable = 2 * (80 * 0.8 - 4) * 1e9  # TP-2 at the recipe's gpu_memory_utilization, less the activation reserve
    assert roof.kv_token_capacity() == pytest.approx((usable - 2 * 14.8e9) / (2 * 48 * 8 * 128 * 2))
    mean = mean_response_tokens(CLUSTERS["deepcoder-14b"].workload)
    today, staged = roof.replica_concurrency(mean), roof.replica_concurrency(mean, staged=True)
    assert today == int(roof.kv_token_capacity() / (1000 + mean)) and 0 < staged < today
    # a 1.5B replica holds far more than the engine's cap
    small = CLUSTERS["deepscaler-1.5b"].roofline()
    assert small.replica_concurrency(3000) == clusters.MAX_NUM_SEQS


def test_the_mean_response_length_is_the_capped_log_normal_mean():
    from verl_pipe.bench.latency import LatencyModel

    work = CLUSTERS["deepcoder-14b"].workload
    model = LatencyModel(median_response_tokens=work.median_response_tokens, response_sigma=work.response_sigma,
                         max_response_tokens=work.max_response_tokens)  # fmt: skip
    drawn = sum(model.response_tokens([-1], i) for i in range(20_000)) / 20_000
    assert mean_response_tokens(work) == pytest.approx(drawn, rel=0.02)


def test_every_parameter_names_its_source():
    for named in CLUSTERS.values():
        sources = named.roofline().sources()
        assert {name for name, _, _ in sources} >= {"GPU", "decode: weights per step", "decode: KV read", "prefill",
                                                   "training", "weight sync between pools", "KV room"}  # fmt: skip
        assert all(source for _, _, source in sources)
        assert any("measured" in source for _, _, source in sources)


def test_a_layout_takes_the_whole_cluster():
    named = CLUSTERS["deepcoder-14b"]
    assert clusters.colocated(named).gpus == 32
    assert all(clusters.split(named, sampler).gpus == 32 for sampler, _ in named.splits())
    assert [s for s, _ in named.splits()] == list(range(2, 32, 2))  # multiples of TP-2, both pools non-empty


def test_the_latency_model_of_a_layout():
    named = CLUSTERS["deepcoder-14b"]
    today, staged = clusters.engine("today"), clusters.engine("staged")
    model = clusters.latency_model(named, clusters.split(named, 24), today, bench_requests=64)
    assert model.replicas == 12 and model.request_multiplicity == 4  # 256 requests a step, 64 run for real
    assert model.train_s_per_ktoken == pytest.approx(named.roofline().train_s_per_ktoken(8) * 4)
    assert model.sync_s == named.roofline().broadcast_sync_s and not model.staged_loads
    colocated = clusters.latency_model(named, clusters.colocated(named), today, bench_requests=64)
    assert colocated.replicas == 16 and colocated.sync_s == named.roofline().colocated_sync_s
    assert colocated.train_s_per_ktoken == pytest.approx(named.roofline().train_s_per_ktoken(32) * 4)
    copy = clusters.latency_model(named, clusters.split(named, 24), staged, bench_requests=64)
    assert copy.staged_loads and copy.replica_concurrency < model.replica_concurrency


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: clusters.engine("magic"), "engine='magic' is not one of today, staged (--engine)"),
        (lambda: clusters.cluster("moon-7b"), "cluster='moon-7b' is not one of"),
        (lambda: clusters.split(CLUSTERS["deepcoder-14b"], 3), "3 sampler GPUs is not a split of 32 GPUs"),
        (lambda: clusters.split(CLUSTERS["deepcoder-14b"], 32), "leaving a trainer GPU (--sampler-gpus)"),
        (lambda: clusters.request_multiplicity(CLUSTERS["deepcoder-14b"], 48), "not a whole multiple of the benchmark"),
        (lambda: clusters.NamedCluster("x", "x", "14b", "tpu", 8, 2, CLUSTERS["deepcoder-14b"].workload, 0.8),
         "gpu='tpu' is not one of"),
        (lambda: clusters.NamedCluster("x", "x", "14b", "h100", 6, 4, CLUSTERS["deepcoder-14b"].workload, 0.8),
         "gpus=6 must be a multiple of tp=4"),
        (lambda: clusters.NamedCluster("x", "x", "14b", "a100", 8, 2, CLUSTERS["deepcoder-14b"].workload, 0.8),
         "no measured roofline for 14b on a100"),
    ],
)  # fmt: skip
def test_bad_clusters_are_refused_naming_the_setting(build, message):
    with pytest.raises(ClusterError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        build()


def test_weights_that_do_not_fit_are_refused():
    tiny_memory = clusters.NamedCluster("x", "x", "14b", "h100", 8, 1, CLUSTERS["deepcoder-14b"].workload, 0.3)
    with pytest.raises(ClusterError, match="do not fit a TP-1 replica"):
        tiny_memory.roofline().kv_token_capacity()
    assert math.isfinite(CLUSTERS["deepcoder-14b"].roofline().kv_token_capacity(staged=True))
