"""The latency model's numbers: deterministic lengths with the documented shape, and the profile calibration."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from verl_pipe.bench.latency import LATENCY_MODEL_ENV, LatencyModel, LatencyModelError, active_model
from verl_pipe.bench.latency_hooks import batch_reward_s
from verl_pipe.patch_registry import PATCHES
from verl_pipe.bench.pipeline import PROFILES, BenchConfig, calibrate


def test_lengths_are_deterministic_long_tailed_and_capped():
    model = LatencyModel()
    lengths = [model.response_tokens([7, 8, 9], i) for i in range(4000)]
    assert lengths == [LatencyModel().response_tokens([7, 8, 9], i) for i in range(4000)]  # no hidden RNG state
    assert lengths != [LatencyModel(seed=1).response_tokens([7, 8, 9], i) for i in range(4000)]
    assert max(lengths) == model.max_response_tokens and min(lengths) >= 1
    assert abs(statistics.median(lengths) - model.median_response_tokens) < 0.05 * model.median_response_tokens
    capped = sum(length == model.max_response_tokens for length in lengths) / len(lengths)
    # log-normal tail beyond the cap: P(Z > ln(16384 / 7000) / 0.6) = 7.8%
    expected = 0.5 * math.erfc(math.log(model.max_response_tokens / model.median_response_tokens) / 0.6 / math.sqrt(2))
    assert abs(capped - expected) < 0.015
    assert statistics.mean(lengths) > statistics.median(lengths)  # the long tail


def test_phase_times_and_scaling():
    model = LatencyModel(decode_tokens_per_s=100, prefill_s=2, train_s_per_ktoken=0.5, time_scale=0.1,
                         reward_s=3, reward_workers=4)  # fmt: skip
    assert model.generation_s(1000) == 12.0 and model.train_s(4000) == 2.0 and model.wall(12.0) == pytest.approx(1.2)
    assert batch_reward_s(9, model) == 9.0  # three rounds of four workers


def test_bad_settings_name_the_field(monkeypatch):
    with pytest.raises(LatencyModelError, match="latency_model.decode_tokens_per_s"):
        LatencyModel(decode_tokens_per_s=0)
    with pytest.raises(LatencyModelError, match="latency_model.reward_workers"):
        LatencyModel(reward_workers=0)
    with pytest.raises(LatencyModelError, match="unknown latency_model key"):
        LatencyModel.from_mapping({"decode_rate": 3})
    monkeypatch.delenv(LATENCY_MODEL_ENV, raising=False)
    assert active_model() is None  # off by default
    monkeypatch.setenv(LATENCY_MODEL_ENV, LatencyModel(sync_s=3.0).to_json())
    assert active_model() == LatencyModel(sync_s=3.0)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_calibration_follows_the_profile_shares(profile):
    cfg = BenchConfig(unit_s=4.0, prompts=4, samples=8, reward_workers=4)
    model = calibrate(PROFILES[profile], cfg)
    shares = PROFILES[profile]
    requests = cfg.prompts * cfg.samples
    # re-estimate the expected batch: its longest response sets generation, its tokens set training
    longest, tokens = [], []
    for trial in range(400):
        lengths = [model.response_tokens([10_000 + trial], i) for i in range(requests)]
        longest.append(max(lengths))
        tokens.append(sum(lengths))
    gen_s = model.wall(model.generation_s(statistics.mean(longest)))
    assert gen_s == pytest.approx(4.0, rel=1e-6)
    assert model.wall(model.train_s(statistics.mean(tokens))) == pytest.approx(shares.train * 4.0, rel=1e-6)
    assert model.wall(model.sync_s) == pytest.approx(shares.sync * 4.0)
    assert model.wall(batch_reward_s(requests, model)) == pytest.approx(shares.reward * 4.0)
    json.loads(model.to_json())  # travels to every process as JSON


def test_trainer_side_patches_still_match_verl():
    patches = [patch for patch in PATCHES if patch.when == "latency model"]
    assert len(patches) == 5 and all(patch.critical for patch in patches)
    for patch in patches:
        assert patch.matches(), patch.name
