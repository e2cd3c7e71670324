"""The hf rollout server's timing slot: empty by default, filled by a factory named in the environment.

The benchmark's latency model fills it through ``worker_env_vars``; the server itself never imports the benchmark
(tests/test_layout_on_cpu.py checks the layers; tests/backends/test_hf_server_on_cpu.py times real requests).
"""

from __future__ import annotations

import pytest

from verl_pipe.backends.cpu.generation_timing import GENERATION_TIMING_ENV, RequestTiming, generation_timing
from verl_pipe.bench.latency import LATENCY_MODEL_ENV, LatencyModel, worker_env_vars


def test_the_slot_is_empty_by_default(monkeypatch):
    monkeypatch.delenv(GENERATION_TIMING_ENV, raising=False)
    assert generation_timing() is None


def test_the_latency_model_fills_the_slot(monkeypatch):
    model = LatencyModel(decode_tokens_per_s=100.0, prefill_s=0.5, time_scale=0.1, replica_concurrency=3)
    for name, value in worker_env_vars(model.to_json()).items():
        monkeypatch.setenv(name, value)
    timing = generation_timing()
    assert timing == model and timing.replica_concurrency == 3
    tokens = model.response_tokens([1, 2, 3], 1)
    assert timing.request_timing([1, 2, 3], 1) == RequestTiming(
        model.wall(model.generation_s(tokens)), {"modelled_response_tokens": tokens}
    )
    monkeypatch.delenv(LATENCY_MODEL_ENV)  # the factory may answer "no timing" at any time
    assert generation_timing() is None


def test_a_malformed_name_names_the_variable(monkeypatch):
    monkeypatch.setenv(GENERATION_TIMING_ENV, "verl_pipe.bench.latency")
    with pytest.raises(ValueError, match=GENERATION_TIMING_ENV):
        generation_timing()
