"""The latency model's numbers: deterministic lengths with the documented shape, and the profile calibration."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from verl_pipe.bench.latency import LATENCY_MODEL_ENV, LatencyModel, LatencyModelError, active_model
from verl_pipe.bench.latency_hooks import LATENCY_MODEL_PATCHES
from verl_pipe.bench.replica_model import batch_generation_s


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
    model = LatencyModel(decode_tokens_per_s=100, kv_step_s_per_ktoken=0.0, prompt_tokens=500,
                         prefill_tokens_per_s=250, train_s_per_ktoken=0.5, time_scale=0.1, reward_s=3,
                         reward_workers=4)  # fmt: skip
    # alone on a replica: a 2 s prefill, then 1000 steps of 10 ms (no KV term here)
    assert model.generation_s(1000) == pytest.approx(12.0) and model.train_s(4000) == 2.0 and model.wall(12.0) == pytest.approx(1.2)


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


def test_a_clusters_model_travels_as_json():
    """Every process of a run gets the layout's model from the environment, the pool and multiplicity included."""
    from verl_pipe.bench import cluster as clusters

    named = clusters.CLUSTERS["deepcoder-14b"]
    model = clusters.latency_model(named, clusters.split(named, 24), clusters.engine("today"), 64, time_scale=0.02)
    assert LatencyModel.from_mapping(json.loads(model.to_json())) == model
    assert (model.replicas, model.request_multiplicity) == (12, 4)


def test_trainer_side_patches_still_match_verl():
    patches = LATENCY_MODEL_PATCHES
    assert len(patches) == 8 and all(p.critical_when == p.when == "latency model" for p in patches)
    for patch in patches:
        assert patch.matches(), patch.name


def test_the_benchmarks_patches_are_installed_only_with_its_model_on(monkeypatch):
    """What the plugin installs in a process: the product's table, and the benchmark's patches only with its model
    switched on in the environment (as every process of a benchmark run has it)."""
    from verl_pipe.patch_registry import PATCHES
    from verl_pipe.register import _patches_for_this_process

    monkeypatch.delenv(LATENCY_MODEL_ENV, raising=False)
    assert _patches_for_this_process() == PATCHES
    assert not any(p.when == "latency model" for p in PATCHES)  # the product's table holds none of them
    monkeypatch.setenv(LATENCY_MODEL_ENV, LatencyModel().to_json())
    assert _patches_for_this_process() == PATCHES + LATENCY_MODEL_PATCHES


def test_verls_partial_rollout_pause_is_scaled_with_the_model(monkeypatch):
    """verl's client waits 1 s before resubmitting an aborted request; in a benchmark that pause is modelled time.
    The patch is applied for real to verl's module; without the model its pause stays verl's."""
    import asyncio
    import time

    import verl.workers.rollout.llm_server as llm_server

    from verl_pipe.bench.latency_hooks import _patch_partial_rollout_pause

    _patch_partial_rollout_pause()
    assert llm_server.asyncio.Lock is asyncio.Lock  # everything else is asyncio's own
    monkeypatch.setenv(LATENCY_MODEL_ENV, LatencyModel(time_scale=0.01).to_json())
    started = time.monotonic()
    # 10 modelled seconds at time_scale 0.01: 0.1 s. Unscaled, the pause would run into the 5 s cut-off.
    asyncio.run(asyncio.wait_for(llm_server.asyncio.sleep(10), timeout=5))
    assert time.monotonic() - started >= 0.099  # measured: 0.10 s, idle or under 2 busy loops
    monkeypatch.delenv(LATENCY_MODEL_ENV)
    started = time.monotonic()
    asyncio.run(llm_server.asyncio.sleep(0.3))
    assert time.monotonic() - started >= 0.29  # no model: verl's own pause



def _sync_calls(patch) -> dict:
    """verl's three ways of calling a ``@auto_await`` ``update_weights``, on a class patched by ``patch``: what each
    returned (or the TypeError it raised) and how long it took."""
    import asyncio
    import time

    from verl.utils.ray_utils import auto_await

    class Manager:
        @auto_await
        async def update_weights(self, global_steps=None):
            await asyncio.sleep(0)
            return {"synced": global_steps}

    Manager.update_weights = patch(Manager.__dict__["update_weights"])

    class Overriding(Manager):  # in_flight_pipeline's manager does this
        @auto_await
        async def update_weights(self, global_steps=None):
            return await super().update_weights(global_steps)

    async def awaited(manager):
        return await manager.update_weights(3)

    calls = {
        "outside a loop": lambda: Manager().update_weights(1),
        "awaited": lambda: asyncio.run(awaited(Manager())),
        "awaited by an override": lambda: Overriding().update_weights(2),
    }
    results = {}
    for name, call in calls.items():
        started = time.monotonic()
        try:
            results[name] = call()
        except TypeError as error:  # "object dict can't be used in 'await' expression"
            results[name] = error
        results[name + " s"] = time.monotonic() - started
    return results


@pytest.mark.quiet  # a wall-clock bound: run with no other test beside it
def test_the_sync_time_patch_keeps_verls_calling_conventions(monkeypatch):
    """verl's ``update_weights`` is ``@auto_await``: run to completion when called outside an event loop, a coroutine
    when awaited. The patched method serves all three of verl's callers, in_flight_pipeline's override included,
    and each call lasts the modelled ``sync_s``."""
    from verl_pipe.bench.latency_hooks import padded_update_weights

    model = LatencyModel(time_scale=0.05, sync_s=2.0)
    monkeypatch.setenv(LATENCY_MODEL_ENV, model.to_json())
    results = _sync_calls(padded_update_weights)
    expected = {"outside a loop": {"synced": 1}, "awaited": {"synced": 3}, "awaited by an override": {"synced": 2}}
    for name, value in expected.items():
        assert results[name] == value, results
        assert results[name + " s"] >= 0.95 * model.wall(model.sync_s), results  # 2 modelled seconds: 0.1 s


def test_negative_control_a_plain_wrapper_breaks_the_awaiting_override():
    """The shape the patch had before: a plain function around verl's method. verl's decorator then sees a non-async
    caller and hands the override a finished dict to await (``make bench``'s in_flight_pipeline failed so)."""

    def plain(original):
        def update_weights(self, *args, **kwargs):
            return original(self, *args, **kwargs)

        return update_weights

    results = _sync_calls(plain)
    assert results["outside a loop"] == {"synced": 1}
    assert isinstance(results["awaited by an override"], TypeError), results


def _aborting_sync_timeline(patch_sync, patch_resume) -> dict:
    """verl's sync as its manager runs it (abort and park, transfer, open the gate) on a class patched like verl's:
    when, after the call began, the gate opened and the call returned."""
    import asyncio
    import inspect
    import time

    from verl.checkpoint_engine.base import CheckpointEngineManager
    from verl.utils.ray_utils import auto_await

    # The order this mimics is verl's own: abort first, the transfer, the gate's opening last.
    source = inspect.getsource(CheckpointEngineManager.update_weights)
    assert source.index("abort_replicas()") < source.index("build_process_group") < source.index(
        "resume_generation_replicas()"
    )
    events = {}

    class Manager:
        @auto_await
        async def update_weights(self, global_steps=None):
            events["aborted"] = time.monotonic()
            await asyncio.sleep(0.005)  # the CPU transfer: milliseconds
            await self.resume_generation_replicas()
            return {"synced": global_steps}

        @auto_await
        async def resume_generation_replicas(self):
            events.setdefault("gate opened", time.monotonic())  # the sync's opening, not the standalone one

    Manager.update_weights = patch_sync(Manager.__dict__["update_weights"])
    if patch_resume is not None:
        Manager.resume_generation_replicas = patch_resume(Manager.__dict__["resume_generation_replicas"])
    manager = Manager()
    started = time.monotonic()
    assert manager.update_weights(4) == {"synced": 4}
    returned = time.monotonic()
    # outside a sync, the gate opens at once (verl also resumes generation after validation-time aborts)
    events["standalone resume s"] = -time.monotonic()
    manager.resume_generation_replicas()
    events["standalone resume s"] += time.monotonic()
    return {
        "gate opened s": events["gate opened"] - started,
        "returned s": returned - started,
        "standalone resume s": events["standalone resume s"],
    }


@pytest.mark.quiet  # a wall-clock bound: run with no other test beside it
def test_an_aborting_sync_keeps_the_gate_closed_for_the_modelled_transfer(monkeypatch):
    """verl's sync aborts the running requests and parks new ones until its transfer is done. The modelled transfer
    (``sync_s``) must hold that gate: requests the sync cut resume only after it, as on the cluster, and the call
    still lasts ``sync_s`` in all (the pad is not paid twice)."""
    from verl_pipe.bench.latency_hooks import gated_resume_generation, padded_update_weights

    model = LatencyModel(time_scale=0.05, sync_s=4.0)  # 0.2 wall seconds
    monkeypatch.setenv(LATENCY_MODEL_ENV, model.to_json())
    timeline = _aborting_sync_timeline(padded_update_weights, gated_resume_generation)
    sync_wall = model.wall(model.sync_s)
    assert timeline["gate opened s"] >= 0.95 * sync_wall, timeline
    assert timeline["returned s"] < 1.5 * sync_wall, timeline
    assert timeline["standalone resume s"] < 0.05, timeline


def test_negative_control_padding_after_the_sync_lets_aborted_requests_decode_through_it(monkeypatch):
    """Without the gate patch (the benchmark before 2026-11-26): the call lasts ``sync_s``, but the gate opened
    milliseconds in, so verl's separate_async decoded through every modelled transfer."""
    from verl_pipe.bench.latency_hooks import padded_update_weights

    model = LatencyModel(time_scale=0.05, sync_s=4.0)
    monkeypatch.setenv(LATENCY_MODEL_ENV, model.to_json())
    timeline = _aborting_sync_timeline(padded_update_weights, None)
    assert timeline["returned s"] >= 0.95 * model.wall(model.sync_s), timeline
    assert timeline["gate opened s"] < 0.5 * model.wall(model.sync_s), timeline


def test_the_modelled_update_window_opens_when_the_batch_leaves_the_sampler(monkeypatch):
    """The modelled update is timed from ``_balance_batch`` (the batch has left the sampler), so the CPU's real
    log-prob passes run inside it instead of on top of it. The control: without the latency model nothing is
    marked, and a later ``_update_actor`` would time from its own start."""
    import time
    from types import SimpleNamespace

    import verl.trainer.ppo.v1.trainer_base as trainer_base
    from verl_pipe.bench import latency_hooks

    balanced = []
    monkeypatch.setattr(trainer_base.PPOTrainer, "_balance_batch", lambda self, batch, metrics: balanced.append(batch))
    latency_hooks._patch_balance_batch()  # wraps the stand-in; monkeypatch restores verl's method after the test
    batch = SimpleNamespace(tags=[{}] * 8)
    marked = {}
    for on in (True, False):
        if on:
            monkeypatch.setenv(LATENCY_MODEL_ENV, LatencyModel(time_scale=0.01).to_json())
        else:
            monkeypatch.delenv(LATENCY_MODEL_ENV)
        trainer, started = SimpleNamespace(), time.monotonic()
        trainer_base.PPOTrainer._balance_batch(trainer, batch, {})
        marked[on] = trainer.__dict__.get(latency_hooks._TRAIN_WINDOW_STARTS)
        if on:
            assert marked[on] >= started
    assert marked[False] is None
    assert len(balanced) == 2  # verl's balancing ran both times
