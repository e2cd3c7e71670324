"""The modelled GPU replica: load-dependent decode, prefill stalls, queueing, aborts that resume, and in-flight
weight loads that stall the replica and switch the version of the tokens decoded after them.

The fluid arithmetic of :class:`ReplicaSim` is checked against a plain step-by-step simulation of the roofline it
states (every decode step costs the weights plus every running request's context, and gives each one token), so
a wrong closed form fails here; the async driver is checked on the wall clock with a fast time scale.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import pytest

from verl_pipe.bench.latency import LatencyModel
from verl_pipe.bench.replica_model import ModelledReplica, ModelledRequest, PoolSim, ReplicaSim, batch_generation_s
from verl_pipe.bench.sampler_trace import SAMPLER_TRACE_ENV, busy_share, load_busy_spans


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


def test_a_load_stops_decoding_and_is_not_busy_time():
    model = _model(kv_step_s_per_ktoken=0.0)
    sim = ReplicaSim(model)
    request = ModelledRequest(total=100, decoded=0.0, prefix=50)
    sim.admit(request)
    sim.advance(0.05 + 0.2)  # its prefill, then 20 tokens
    sim.stall(0.5)
    assert sim.time_to_next_finish() == pytest.approx(0.5 + 0.8)
    sim.advance(0.5)
    assert request.decoded == pytest.approx(20) and sim.busy_s == pytest.approx(0.25)  # prefill and decode only
    sim.advance(0.1)
    assert request.decoded == pytest.approx(30)
    # on an idle replica the stall still passes (a request arriving during it waits only for the rest), not busy
    idle = ReplicaSim(model)
    idle.stall(0.5)
    idle.advance(0.3)
    assert idle.busy_s == 0.0 and idle.now == pytest.approx(0.3)
    late = ModelledRequest(total=100, decoded=0.0, prefix=50)
    idle.admit(late)
    idle.advance(0.2 + 0.05)  # the rest of the stall, then its prefill
    assert late.decoded == pytest.approx(0.0, abs=1e-9)
    idle.advance(0.1)
    assert late.decoded == pytest.approx(10) and idle.busy_s == pytest.approx(0.15)


@dataclass
class _Answer:
    token_ids: list[int]
    stop_reason: str = "completed"
    pieces: list[str] = field(default_factory=list)


def _cut(answer: _Answer, share: float) -> _Answer:
    return _Answer(answer.token_ids[: int(share * len(answer.token_ids))], stop_reason="aborted")


def test_a_pool_sends_a_new_request_to_the_least_loaded_replica_and_an_aborted_one_back_to_its_own():
    """verl's load balancer keeps a request on its server: the partial-rollout client resubmits an aborted request
    under the same id. The control: a request never seen goes to the emptier replica."""
    pool = PoolSim(_model(replicas=2))
    crowded, empty = pool.replicas
    requests = [ModelledRequest(total=100, decoded=0.0, prefix=50) for _ in range(3)]
    for request in requests:  # 0 and 2 to one replica, 1 to the other
        pool.admit(request)
    pool.advance(1.0)
    pool.remove(requests[1])
    assert (len(crowded.running), len(empty.running)) == (2, 0)
    for request in pool.take_all():  # an aborting sync, then every request resubmitted
        pool.admit(request)
    assert (len(crowded.running), len(empty.running)) == (2, 0)
    newcomer = ModelledRequest(total=100, decoded=0.0, prefix=50)
    pool.admit(newcomer)
    assert empty.running == [newcomer]


def test_an_abort_ends_requests_where_the_replica_is_and_the_resumed_rest_pays_its_prefill_again(tmp_path, monkeypatch):
    """verl's sync aborts; the answer keeps the share the modelled request decoded; verl resubmits prompt + those
    tokens, which continues the same modelled request (same length) after re-prefilling the whole prefix."""
    # A slow prefill (100 tokens/s) makes the re-prefill about a third of the resumed piece (24 of 71 modelled s), so
    # the tolerance below cannot absorb it: with the re-prefill dropped (prefix = 0 on resume) it measures 47 s.
    prefill_rate, decode_rate = 100.0, 100.0
    model = _model(time_scale=0.01, kv_step_s_per_ktoken=0.0, decode_tokens_per_s=decode_rate, prompt_tokens=50,
                   prefill_tokens_per_s=prefill_rate)  # fmt: skip
    first_prefill_s = model.prompt_tokens / prefill_rate
    trace = str(tmp_path / "sampler_busy.jsonl")
    monkeypatch.setenv(SAMPLER_TRACE_ENV, trace)
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
        # abort a third of the way through its modelled decode, scaled
        await asyncio.sleep(model.wall(first_prefill_s + total / decode_rate / 3))
        replica.abort_all()
        cut, extra = await task
        first_piece_s = (loop.time() - started) / model.time_scale
        kept = len(cut.token_ids)
        assert cut.stop_reason == "aborted" and 0 < kept < len(real)
        assert extra == {"modelled_response_tokens": total}, "no version was ever set: no version tags"

        async def generate_rest():
            return _Answer(real[kept:])

        started = loop.time()
        rest, extra = await replica.serve(prompt + real[:kept], generate_rest, lambda a: a.stop_reason == "aborted", _cut)
        rest_s = (loop.time() - started) / model.time_scale
        return first_piece_s, kept, rest, extra, rest_s

    first_piece_s, kept, rest, extra, rest_s = asyncio.run(scenario())
    assert rest.stop_reason == "completed" and rest.token_ids == real[kept:]
    assert extra == {"modelled_response_tokens": total}, "the resumed request continues the same modelled one"
    decoded = (first_piece_s - first_prefill_s) * decode_rate
    re_prefill_s = (model.prompt_tokens + decoded) / prefill_rate
    decode_rest_s = (total - decoded) / decode_rate
    assert re_prefill_s > 0.2 * (re_prefill_s + decode_rest_s), "the set-up no longer makes the re-prefill count"
    # what is left to decode, after a prefill of the prompt plus everything decoded before the abort; the tolerance
    # (5%, about 35 ms of wall at this scale) is well under the re-prefill
    assert rest_s == pytest.approx(re_prefill_s + decode_rest_s, rel=0.05, abs=0.1)
    # the trace the benchmark reads the sampler's idle from: the new request, the abort with the model's hold for
    # the transfer, the resumed rest
    events = [r for r in map(json.loads, open(trace, encoding="utf-8")) if "event" in r]
    assert [e["event"] for e in events] == ["admit", "abort", "resume"]
    assert events[1]["hold_s"] == pytest.approx(model.wall(model.sync_s))


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
            assert set(extra) == {"modelled_response_tokens"}  # no version was ever set: no version tags
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


def _versioned_model(**values) -> LatencyModel:
    """Every request 1000 modelled tokens (10 s alone), a 4 s load; 0.05 wall seconds per modelled second."""
    base = dict(time_scale=0.05, kv_step_s_per_ktoken=0.0, median_response_tokens=1000, response_sigma=0.0,
                sync_s=4.0, replica_concurrency=1)  # fmt: skip
    return _model(**{**base, **values})


_REAL = list(range(100, 140))  # the server's real tokens for each request (generated at once)
_LOAD_AT_S = 0.05 + 4.0  # modelled: the prefill, then 400 of the 1000 tokens


async def _serve_timed(replica: ModelledReplica, prompt: list[int], real: list[int] = _REAL):
    """Serve one request; its answer, extra fields, and wall seconds until it came back."""
    loop = asyncio.get_running_loop()

    async def generate():
        return _Answer(list(real))

    started = loop.time()
    answer, extra = await replica.serve(prompt, generate, lambda a: a.stop_reason == "aborted", _cut)
    return answer, extra, loop.time() - started


def _in_flight_failures(model: LatencyModel, answer: _Answer, end_s: float, unloaded_end_s: float) -> list[str]:
    """What an in-flight load must do: keep the whole answer, and end it later by the load's stall."""
    failures = []
    if answer.stop_reason == "aborted" or answer.token_ids != _REAL:
        failures.append("cut")
    if end_s - unloaded_end_s < 0.5 * model.wall(model.sync_s):
        failures.append("no stall")
    return failures


def test_an_in_flight_load_stalls_the_replica_and_the_rest_of_each_request_decodes_under_the_new_version():
    model = _versioned_model()

    async def scenario():
        loop = asyncio.get_running_loop()
        replicas = {name: ModelledReplica(_versioned_model(sync_s=0.0) if name == "no_stall" else model)
                    for name in ("in_flight", "unloaded", "aborting", "no_stall")}  # fmt: skip
        for replica in replicas.values():
            replica.weights_loaded(3, in_flight=False)
        started = loop.time()
        # one slot per replica: the in-flight replica's second request waits, and has decoded nothing at the load
        tasks = {name: asyncio.ensure_future(_serve_timed(replica, [1])) for name, replica in replicas.items()}
        waiting = asyncio.ensure_future(_serve_timed(replicas["in_flight"], [2]))
        await asyncio.sleep(model.wall(_LOAD_AT_S))
        load_s = (loop.time() - started) / model.time_scale
        replicas["in_flight"].weights_loaded(4, in_flight=True)
        replicas["no_stall"].weights_loaded(4, in_flight=True)
        replicas["aborting"].abort_all()  # verl's sync: abort, then load
        replicas["aborting"].weights_loaded(4, in_flight=False)
        results = {name: await task for name, task in tasks.items()}
        return results, await waiting, load_s

    results, waiting, load_s = asyncio.run(scenario())
    answer, extra, end_s = results["in_flight"]
    unloaded_end_s = results["unloaded"][2]
    assert results["unloaded"][1] == {"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3,
                                      "modelled_response_tokens": 1000,
                                      "modelled_token_versions": [[pytest.approx(1000), 3]]}  # fmt: skip
    # the answer is whole, and ends later by the load's stall (sync_s, scaled)
    assert answer.stop_reason == "completed" and answer.token_ids == _REAL
    assert end_s - unloaded_end_s == pytest.approx(model.wall(model.sync_s), abs=0.06)
    # its real tokens, spread over the modelled ones: those before the load's share decoded under 3, the rest 4
    share = (load_s - 0.05) * model.decode_tokens_per_s / 1000
    old = extra["token_versions"].count(3)
    assert extra["token_versions"] == [3] * old + [4] * (len(_REAL) - old)
    assert old == pytest.approx(share * len(_REAL), abs=1.5) and 0 < old < len(_REAL)
    assert (extra["min_global_steps"], extra["max_global_steps"], extra["global_steps"]) == (3, 4, 4)
    assert extra["modelled_response_tokens"] == 1000
    # and the modelled tokens themselves, which the benchmark's token lag weighs: the load's share under 3
    (old_tokens, old_version), (new_tokens, new_version) = extra["modelled_token_versions"]
    assert (old_version, new_version) == (3, 4) and old_tokens + new_tokens == pytest.approx(1000)
    assert old_tokens == pytest.approx(share * 1000, abs=15)
    # the waiting request starts under the new version, after the first request (the stall included)
    answer, extra, waiting_end_s = waiting
    assert answer.token_ids == _REAL and "token_versions" not in extra
    assert (extra["min_global_steps"], extra["max_global_steps"], extra["global_steps"]) == (4, 4, 4)
    assert waiting_end_s - end_s == pytest.approx(model.wall(0.05 + 10.0), abs=0.06)
    # the negative controls: a load that cuts the requests, or one that does not stall, fails these checks
    assert _in_flight_failures(model, results["in_flight"][0], end_s, unloaded_end_s) == []
    assert "cut" in _in_flight_failures(model, results["aborting"][0], results["aborting"][2], unloaded_end_s)
    assert _in_flight_failures(model, results["no_stall"][0], results["no_stall"][2], unloaded_end_s) == ["no stall"]


def test_after_an_aborting_sync_the_resumed_piece_is_tagged_with_the_new_version():
    model = _versioned_model()

    async def scenario():
        replica = ModelledReplica(model)
        replica.weights_loaded(3, in_flight=False)
        task = asyncio.ensure_future(_serve_timed(replica, [1]))
        await asyncio.sleep(model.wall(_LOAD_AT_S))
        replica.abort_all()
        replica.weights_loaded(4, in_flight=False)
        cut, cut_extra, _ = await task
        kept = len(cut.token_ids)
        rest, rest_extra, _ = await _serve_timed(replica, [1] + _REAL[:kept], _REAL[kept:])
        return cut, cut_extra, rest, rest_extra

    cut, cut_extra, rest, rest_extra = asyncio.run(scenario())
    assert cut.stop_reason == "aborted" and 0 < len(cut.token_ids) < len(_REAL)
    (before, three), = cut_extra.pop("modelled_token_versions")
    assert cut_extra == {"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3,
                         "modelled_response_tokens": 1000}  # fmt: skip
    assert cut.token_ids + rest.token_ids == _REAL
    (after, four), = rest_extra.pop("modelled_token_versions")
    assert rest_extra == {"global_steps": 4, "min_global_steps": 4, "max_global_steps": 4,
                          "modelled_response_tokens": 1000}  # fmt: skip
    # the modelled tokens of the two pieces: what the replica had decoded at the abort under 3, the rest under 4,
    # whatever the real tokens' split (the benchmark's token lag weighs these)
    assert (three, four) == (3, 4) and before + after == pytest.approx(1000)
    assert before == pytest.approx((_LOAD_AT_S - 0.05) * model.decode_tokens_per_s, rel=0.1)  # 400 of 1000


def test_an_in_flight_loads_stall_is_cut_out_of_the_busy_spans(tmp_path):
    """Guards: a sampler lane that counts the seconds its requests wait for new weights as generation (the
    in-flight schedule's busy share would be flattered by every load)."""

    trace = tmp_path / "sampler_busy.jsonl"
    records = [{"start": 0.0, "end": 5.0}, {"start": 4.0, "end": 10.0}, {"start": 3.0, "end": 4.5, "kind": "stall"},
               {"start": 12.0, "end": 13.0}]  # fmt: skip
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    spans = load_busy_spans(str(trace))
    assert spans == [(0.0, 3.0), (4.5, 10.0), (12.0, 13.0)]
    assert busy_share(spans, 0.0, 10.0) == pytest.approx(0.85)


def test_a_staged_load_stalls_nothing_and_switches_version_when_its_transfer_ends():
    """The hf server's way: the weights arrive beside decoding and swap in between two decode steps. Guards: a staged
    load priced as free *and* fresh at once (the version switching when the transfer begins), or one that still
    stalls the replica. The stalling load of the same model is the control: it ends the request later by sync_s."""
    staged_model = _versioned_model(staged_loads=True)

    async def scenario():
        replicas = {"staged": ModelledReplica(staged_model), "stalling": ModelledReplica(_versioned_model()),
                    "unloaded": ModelledReplica(staged_model)}  # fmt: skip
        for replica in replicas.values():
            replica.weights_loaded(3, in_flight=False)
        tasks = {name: asyncio.ensure_future(_serve_timed(replica, [1])) for name, replica in replicas.items()}
        await asyncio.sleep(staged_model.wall(_LOAD_AT_S))
        replicas["staged"].weights_loaded(3.5, in_flight=True)  # the first of a step's two updates
        replicas["stalling"].weights_loaded(3.5, in_flight=True)
        return {name: await task for name, task in tasks.items()}

    results = asyncio.run(scenario())
    answer, extra, end_s = results["staged"]
    unloaded_end_s = results["unloaded"][2]
    assert answer.token_ids == _REAL and answer.stop_reason == "completed"
    assert end_s == pytest.approx(unloaded_end_s, abs=0.06)  # no stall
    assert _in_flight_failures(staged_model, answer, end_s, unloaded_end_s) == ["no stall"]
    assert results["stalling"][2] - unloaded_end_s == pytest.approx(staged_model.wall(staged_model.sync_s), abs=0.06)
    # the new version starts when the 4 s transfer ends: 800 of the 1000 tokens under 3, the rest under 3.5
    (old_tokens, old_version), (new_tokens, new_version) = extra["modelled_token_versions"]
    assert (old_version, new_version) == (3, 3.5) and old_tokens + new_tokens == pytest.approx(1000)
    assert old_tokens == pytest.approx((_LOAD_AT_S + staged_model.sync_s - 0.05) * 100, abs=15)
    assert (extra["min_global_steps"], extra["max_global_steps"]) == (3, 3.5)


def test_a_staged_load_still_arriving_lands_before_the_next_one():
    model = _versioned_model(staged_loads=True, sync_s=100.0)  # transfers far longer than the request

    async def scenario():
        replica = ModelledReplica(model)
        replica.weights_loaded(1, in_flight=False)
        replica.weights_loaded(1.5, in_flight=True)
        assert replica.version == 1  # still arriving
        replica.weights_loaded(2, in_flight=True)  # the next update's: the first lands now
        assert replica.version == 1.5
        _, extra, _ = await _serve_timed(replica, [1])
        return extra

    extra = asyncio.run(scenario())
    assert extra["global_steps"] == 1.5  # the second is still arriving when the request ends
