"""Which version sampled each token when vLLM loads weights while requests run (:mod:`in_flight_loads`).

The worker reports, at each load, the tokens each request had sampled; the server replays the loads that fell
inside an answer. These are the cases a replay can get wrong; the engine end to end is in the vLLM e2e tests.
"""

from __future__ import annotations

import asyncio

import pytest

from verl_pipe.rollout.in_flight_loads import (
    InFlightLoads,
    WeightLoad,
    caller_request_id,
    salt_prefills_by_weights,
    salted_prompt,
    token_versions,
    version_tags,
)


def test_a_load_inside_an_answer_splits_it_where_the_worker_counted():
    loads = [WeightLoad(2, {"a": 3}), WeightLoad(3, {"a": 6})]
    assert token_versions("a", 8, 1, loads) == [1, 1, 1, 2, 2, 2, 3, 3]


def test_a_request_still_queued_at_a_load_samples_everything_after_it():
    assert token_versions("queued", 4, 1, [WeightLoad(2, {"other": 5})]) == [2, 2, 2, 2]


def test_a_load_after_an_answer_ended_changes_nothing_of_it():
    """Guards: reading "absent from a load" as "still queued" also for a request that had run and ended (it was
    counted by an earlier load, and its answer reached the server after the later load): that would retag every
    token of a finished answer with a version that never touched it."""
    loads = [WeightLoad(2, {"a": 2, "b": 1}), WeightLoad(3, {"b": 4})]
    assert token_versions("a", 5, 1, loads) == [1, 1, 2, 2, 2]
    assert token_versions("a", 5, 1, loads[:1]) == token_versions("a", 5, 1, loads)


def test_counts_at_the_answers_end_leave_it_to_the_old_version():
    assert token_versions("a", 4, 1, [WeightLoad(2, {"a": 4})]) == [1, 1, 1, 1]


def test_engine_ids_map_back_to_the_callers():
    assert caller_request_id("f3c1e2a0-9b7d-4c1e-8a2b-5d6e7f8091a2-1a2b3c4d") == "f3c1e2a0-9b7d-4c1e-8a2b-5d6e7f8091a2"


def test_version_tags_name_the_range_and_keep_token_versions_only_when_mixed():
    assert version_tags([1, 1, 2], current=2) == {
        "global_steps": 2, "min_global_steps": 1, "max_global_steps": 2, "token_versions": [1, 1, 2],
    }  # fmt: skip
    assert version_tags([2, 2], current=3) == {"global_steps": 2, "min_global_steps": 2, "max_global_steps": 2}
    assert version_tags([], current=3) == {"global_steps": 3}


def test_an_answer_that_ends_during_a_load_waits_for_its_record():
    """Guards: vLLM resolves the load's RPC and the requests' outputs on different paths, so an answer sampled
    partly after a load can come back before the server has recorded that load; it must not be tagged without it."""

    async def scenario() -> list:
        loads = InFlightLoads(version=1)
        mark = loads.mark()
        loads.expected = 2
        release = asyncio.Event()

        async def load() -> None:
            async with loads.loading():
                await release.wait()
                loads.record({"a-1a2b3c4d": 2})

        loading = asyncio.create_task(load())
        await asyncio.sleep(0)
        answer = asyncio.create_task(loads.versions("a", 4, mark))
        await asyncio.sleep(0.01)
        assert not answer.done(), "the answer was tagged before the load it spans was recorded"
        release.set()
        await loading
        return await answer

    assert asyncio.run(scenario()) == [1, 1, 2, 2]


def test_a_load_whose_version_nobody_announced_is_refused():
    async def scenario() -> None:
        async with InFlightLoads(version=1).loading():
            pass

    with pytest.raises(RuntimeError, match="expect_weights"):
        asyncio.run(scenario())


class _Engine:
    """vLLM's AsyncLLM as verl's server calls it: ``generate(prompt=..., sampling_params=..., request_id=...)``."""

    def __init__(self):
        self.prompts = []

    def generate(self, prompt, sampling_params=None, request_id=None):
        self.prompts.append(prompt)
        return request_id


def test_a_request_sent_after_a_load_began_shares_no_prefix_cache_with_those_before():
    """Guards: vLLM refuses verl's prefix-cache reset while requests run (always, under in-flight loads), so without
    a salt a request after a load reuses prompt KV the old weights computed. The salt changes when the load's RPC is
    sent (a request sent meanwhile reaches the engine after the load), not when it is recorded."""

    async def scenario() -> list:
        loads = InFlightLoads(version=1)
        engine = _Engine()
        salt_prefills_by_weights(engine, loads)
        salt_prefills_by_weights(engine, loads)  # a second call (every generate makes one) wraps nothing twice
        prompt = {"prompt_token_ids": [1, 2, 3]}
        assert engine.generate(prompt=prompt, sampling_params=None, request_id="a") == "a"
        engine.generate(dict(prompt), None, "b")  # the prompt positionally, as vLLM's signature allows
        loads.expected = 2
        async with loads.loading():
            engine.generate(prompt=dict(prompt), request_id="during")
            loads.record({})
        engine.generate(prompt=dict(prompt), request_id="after")
        assert "cache_salt" not in prompt  # the caller's dict is not changed
        return [p["cache_salt"] for p in engine.prompts]

    before, same, during, after = asyncio.run(scenario())
    assert before == same  # one version's requests still share their prompt's blocks
    assert during != before and during == after


def test_a_callers_salt_is_kept_and_a_prompt_that_is_not_vllms_dict_is_refused():
    salted = salted_prompt({"prompt_token_ids": [1], "cache_salt": "tenant"}, 3)
    assert salted["cache_salt"] == "tenant|verl-pipe-weights-3"
    with pytest.raises(TypeError, match="salt vLLM's prompt dict"):
        salted_prompt([1, 2, 3], 0)
