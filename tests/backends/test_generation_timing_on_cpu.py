"""The hf rollout server's timing slot: empty by default, filled by a factory named in the environment.

The benchmark's latency model fills it through ``worker_env_vars``; the server itself never imports the benchmark
(tests/test_layout_on_cpu.py checks the layers; tests/backends/test_hf_server_on_cpu.py times real requests;
tests/bench/test_replica_model_on_cpu.py checks the modelled replica).
"""

from __future__ import annotations

import pytest

from verl_pipe.backends.cpu.generation_timing import GENERATION_TIMING_ENV, generation_timing
from verl_pipe.bench.latency import LATENCY_MODEL_ENV, LatencyModel, worker_env_vars
from verl_pipe.bench.replica_model import ModelledReplica


def test_the_slot_is_empty_by_default(monkeypatch):
    monkeypatch.delenv(GENERATION_TIMING_ENV, raising=False)
    assert generation_timing() is None


def test_the_latency_model_fills_the_slot(monkeypatch):
    model = LatencyModel(decode_tokens_per_s=100.0, time_scale=0.1, replica_concurrency=3)
    for name, value in worker_env_vars(model.to_json()).items():
        monkeypatch.setenv(name, value)
    timing = generation_timing()
    assert timing == model
    replica = timing.replica()  # each server gets a modelled replica of its own (tests/bench/test_replica_model)
    assert isinstance(replica, ModelledReplica) and replica.model == model and replica is not timing.replica()
    monkeypatch.delenv(LATENCY_MODEL_ENV)  # the factory may answer "no timing" at any time
    assert generation_timing() is None


def test_a_malformed_name_names_the_variable(monkeypatch):
    monkeypatch.setenv(GENERATION_TIMING_ENV, "verl_pipe.bench.latency")
    with pytest.raises(ValueError, match=GENERATION_TIMING_ENV):
        generation_timing()

