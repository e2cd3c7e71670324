"""The modelled GPU replica: load-dependent decode, prefill stalls, queueing, and aborts that resume.

The fluid arithmetic of :class:`ReplicaSim` is checked against a plain step-by-step simulation of the roofline it
states (every decode step costs the weights plus every running request's context, and gives each one token), so
a wrong closed form fails here; the async driver is checked on the wall clock with a fast time scale.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import pytest

from verl_pipe.bench.latency import LatencyModel
from verl_pipe.bench.replica_model import (
    SAMPLER_TRACE_ENV,
    ModelledReplica,
    ModelledRequest,
    ReplicaSim,
    batch_generation_s,
    busy_share,
    load_busy_spans,
)


def _model(**values) -> LatencyModel:
    base = dict(decode_tokens_per_s=100.0, kv_step_s_per_ktoken=2.0, prompt_tokens=50, prefill_tokens_per_s=1000.0,
                replica_concurrency=64, time_scale=1.0)  # fmt: skip
    return LatencyModel(**{**base, **values})


def _stepwise_batch_s(model: LatencyModel, lengths: list[int]) -> float:
    """The roofline one decode step at a time: what ReplicaSim computes in closed form between events."""
    running = sorted(lengths)[: model.replica_concurrency]
    assert len(running) == len(lengths), "this reference has no queue"
    seconds = len(lengths) * model.prompt_tokens / model.prefill_tokens_per_s
    decoded = 0
    while running:
        context = sum(model.prompt_tokens + decoded for _ in running)
        seconds += 1.0 / model.decode_tokens_per_s + model.kv_step_s_per_ktoken * context / 1000.0
        decoded += 1
        running = [length for length in running if length > decoded]
    return seconds


def test_closed_form_matches_a_step_by_step_simulation():
    rng = random.Random(3)
    for _ in range(5):
        lengths = [rng.randint(1, 120) for _ in range(rng.randint(1, 12))]
        model = _model()
        assert batch_generation_s(model, lengths) == pytest.approx(_stepwise_batch_s(model, lengths), rel=1e-9)


def test_advancing_in_pieces_lands_where_one_advance_does():
    """Arrivals and aborts stop the clock at arbitrary times: mid-interval progress must agree with the events'."""
    model = _model()

    def fresh():
        sim = ReplicaSim(model)
        for total in (30, 70, 120):
            sim.admit(ModelledRequest(total=total, decoded=0.0, prefix=model.prompt_tokens))
        return sim

    whole, pieces = fresh(), fresh()
    horizon = 0.9 * batch_generation_s(model, [30, 70, 120])
    whole.advance(horizon)
    rng = random.Random(5)
    left = horizon
    while left > 1e-12:
        step = min(left, rng.uniform(0.0, horizon / 20))
        pieces.advance(step)
        left -= step
    assert [r.decoded for r in pieces.running] == pytest.approx([r.decoded for r in whole.running], rel=1e-6)
    assert len(pieces.running) == len(whole.running) == 1 and 0 < whole.running[0].remaining < 120


def test_decode_slows_with_load_and_the_tail_decodes_faster():
    model = _model()
    alone = batch_generation_s(model, [100])
    crowded = batch_generation_s(model, [100] * 32)
    assert crowded > 1.5 * alone  # the same request, 31 neighbours: their KV cache is streamed every step
    # one long request among short ones: its last tokens (alone) come faster than its first (crowded)
    sim = ReplicaSim(model)
    long_one = ModelledRequest(total=200, decoded=0.0, prefix=model.prompt_tokens)
    sim.admit(long_one)
    for _ in range(31):
        sim.admit(ModelledRequest(total=50, decoded=0.0, prefix=model.prompt_tokens))
    sim.advance(sim._stall_s)  # the prefills
    started = sim.now
    sim.advance(sim.time_to_next_finish())  # 50 steps with everyone running
    middle_per_token = (sim.now - started) / 50
    started = sim.now
    sim.advance(sim.time_to_next_finish())  # the last 150 steps alone
    tail_per_token = (sim.now - started) / 150
    assert long_one.remaining == pytest.approx(0.0) and tail_per_token < 0.6 * middle_per_token


def test_requests_beyond_the_concurrency_queue_and_prefill_stalls_the_replica():
    model = _model(replica_concurrency=2, kv_step_s_per_ktoken=0.0)
    assert batch_generation_s(model, [10, 10, 10]) == pytest.approx(3 * 0.05 + 10 * 0.01 + 10 * 0.01)
    sim = ReplicaSim(model)
    first = ModelledRequest(total=100, decoded=0.0, prefix=50)
    sim.admit(first)
    sim.advance(0.05 + 0.2)  # its prefill, then 20 tokens
    assert first.decoded == pytest.approx(20)
    sim.admit(ModelledRequest(total=100, decoded=0.0, prefix=500))  # a 0.5 s prefill: nobody decodes meanwhile
    sim.advance(0.5)
    assert first.decoded == pytest.approx(20)
    sim.advance(0.1)
    assert first.decoded == pytest.approx(30)


@dataclass
class _Answer:
    token_ids: list[int]
    stop_reason: str = "completed"
    pieces: list[str] = field(default_factory=list)


def _cut(answer: _Answer, share: float) -> _Answer:
    return _Answer(answer.token_ids[: int(share * len(answer.token_ids))], stop_reason="aborted")


def test_an_abort_ends_requests_where_the_replica_is_and_the_resumed_rest_pays_its_prefill_again():
    """verl's sync aborts; the answer keeps the share the modelled request decoded; verl resubmits prompt + those
    tokens, which continues the same modelled request (same length) after re-prefilling the whole prefix."""
    model = _model(time_scale=0.01, kv_step_s_per_ktoken=0.0, decode_tokens_per_s=100.0, prompt_tokens=50,
                   prefill_tokens_per_s=1000.0)  # fmt: skip
    prompt = [7, 8, 9]
    total = model.response_tokens(prompt, 0)
    real = list(range(100, 140))  # the server's real tokens for this request

    async def scenario():
        replica = ModelledReplica(model)
        loop = asyncio.get_running_loop()

        async def generate_full():
            return _Answer(list(real))

        started = loop.time()
        task = asyncio.ensure_future(replica.serve(prompt, generate_full, lambda a: a.stop_reason == "aborted", _cut))
        # abort a third of the way through its modelled decode (0.05 s prefill + total / 100 s), scaled
        await asyncio.sleep(model.wall(0.05 + total / 100.0 / 3))
        replica.abort_all()
        cut, extra = await task
        first_piece_s = (loop.time() - started) / model.time_scale
        kept = len(cut.token_ids)
        assert cut.stop_reason == "aborted" and 0 < kept < len(real) and extra["modelled_response_tokens"] == total

        async def generate_rest():
            return _Answer(real[kept:])

        started = loop.time()
        rest, extra = await replica.serve(prompt + real[:kept], generate_rest, lambda a: a.stop_reason == "aborted", _cut)
        rest_s = (loop.time() - started) / model.time_scale
        return first_piece_s, kept, rest, extra, rest_s

    first_piece_s, kept, rest, extra, rest_s = asyncio.run(scenario())
    assert rest.stop_reason == "completed" and rest.token_ids == real[kept:]
    assert extra["modelled_response_tokens"] == total, "the resumed request continues the same modelled one"
    decoded = (first_piece_s - 0.05) * 100.0
    # what is left to decode, after a prefill of the prompt plus everything decoded before the abort
    expected = (model.prompt_tokens + decoded) / model.prefill_tokens_per_s + (total - decoded) / 100.0
    assert rest_s == pytest.approx(expected, rel=0.1, abs=0.3)
    # the negative control: without the re-prefill the rest would end sooner by more than the tolerance
    assert rest_s - (total - decoded) / 100.0 > 0.5 * (model.prompt_tokens + decoded) / model.prefill_tokens_per_s


def test_answers_are_held_until_their_modelled_end_and_the_replica_is_shared(tmp_path, monkeypatch):
    model = _model(time_scale=0.01, kv_step_s_per_ktoken=0.0, replica_concurrency=1)
    trace = str(tmp_path / "busy.jsonl")
    monkeypatch.setenv(SAMPLER_TRACE_ENV, trace)

    async def scenario():
        replica = ModelledReplica(model)
        loop = asyncio.get_running_loop()

        async def one(prompt):
            async def generate():
                return _Answer([1, 2, 3])

            answer, extra = await replica.serve(prompt, generate, lambda a: a.stop_reason == "aborted", _cut)
            return extra["modelled_response_tokens"], loop.time()

        started = loop.time()
        wall_started = time.time()
        results = await asyncio.gather(one([1]), one([2]))
        await asyncio.sleep(0.3)  # idle: the trace must show the replica idle here
        return [(tokens, end - started) for tokens, end in results], replica, wall_started

    results, replica, wall_started = asyncio.run(scenario())
    (tokens_a, end_a), (tokens_b, end_b) = results
    alone_a = model.wall(model.generation_s(tokens_a))
    assert end_a == pytest.approx(alone_a, rel=0.1, abs=0.05)
    # one slot: the second request starts when the first ends
    assert end_b == pytest.approx(alone_a + model.wall(model.generation_s(tokens_b)), rel=0.1, abs=0.05)
    assert len(replica.busy_intervals) >= 1 and 0.9 < replica.busy_fraction() <= 1.0
    # the sampler lane a benchmark draws: busy from the first arrival to the last end (written in pieces), then idle
    spans = load_busy_spans(trace)
    assert len(spans) == 1, spans
    busy_until = wall_started + end_b
    assert busy_share(spans, wall_started, busy_until) > 0.95
    assert busy_share(spans, busy_until + 0.05, busy_until + 0.3) == 0.0
