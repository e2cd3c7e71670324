"""The batched decoder behind the hf rollout server, on the tiny random Qwen2 (no Ray)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl_pipe.backends.cpu.hf_generation import BatchedGenerator, GenerationRequest, _filter_top_k_top_p


@pytest.fixture(scope="module")
def generator(tiny_model_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    # Token 3 stands in for EOS so that random weights still stop some rows early.
    return BatchedGenerator(model, eos_token_ids=[3], pad_token_id=0)


def test_log_probs_equal_teacher_forced_scores_under_left_padding(generator):
    """Guards: left padding or the KV cache shifting positions, so rollout log-probs drift from the actor's."""
    requests = [
        GenerationRequest([5, 6, 7], max_tokens=12, temperature=1.0),
        GenerationRequest(list(range(20, 33)), max_tokens=9, temperature=0.7, top_p=0.9),
        GenerationRequest([40, 41], max_tokens=6, temperature=0.0),
    ]
    for request, result in zip(requests, generator.generate(requests)):
        assert 1 <= len(result.token_ids) <= request.max_tokens
        temperature = request.temperature if request.temperature > 0 else 1.0
        expected = generator.score(request.prompt_ids, result.token_ids, temperature)
        assert max(abs(a - b) for a, b in zip(expected, result.log_probs)) < 1e-4


def test_greedy_rows_do_not_depend_on_batch_mates(generator):
    """Guards: batching changing a request's output (validation must be reproducible)."""
    alone = generator.generate([GenerationRequest([9, 10, 11], max_tokens=10, temperature=0.0)])[0]
    batched = generator.generate(
        [GenerationRequest(list(range(50, 70)), 7, 1.0), GenerationRequest([9, 10, 11], 10, 0.0)]
    )[1]
    assert alone.token_ids == batched.token_ids


def test_each_row_stops_at_its_own_limit_or_eos(generator):
    """Guards: one row's max_tokens or EOS truncating or extending another row."""
    results = generator.generate([GenerationRequest([5, 6], max_tokens=n, temperature=1.0) for n in (1, 4, 16)])
    for n, result in zip((1, 4, 16), results):
        if result.finish_reason == "stop":
            assert result.token_ids[-1] == 3 and len(result.token_ids) <= n
        else:
            assert result.finish_reason == "length" and len(result.token_ids) == n
            assert 3 not in result.token_ids


def test_each_request_is_released_the_moment_it_finishes(generator):
    """Guards: a finished request waiting for its whole batch, so its reward cannot run during generation."""
    no_eos = BatchedGenerator(generator.model, eos_token_ids=[10**6], pad_token_id=0)  # rows end at their limits
    forward_calls: list[int] = []
    hook = generator.model.register_forward_hook(lambda *_: forward_calls.append(1))
    released: list[tuple[int, int, int]] = []  # (request index, its tokens, model forwards so far)
    requests = [GenerationRequest([5, 6], max_tokens=n, temperature=1.0) for n in (12, 2, 0, 6)]
    try:
        results = no_eos.generate(
            requests, on_finished=lambda i, r: released.append((i, len(r.token_ids), len(forward_calls)))
        )
    finally:
        hook.remove()
    assert [index for index, _, _ in released] == [2, 1, 3, 0]  # zero budget at once, then by length
    assert all(tokens == requests[index].max_tokens for index, tokens, _ in released)
    # The 2-token request was handed back after ~2 forwards, while the batch went on to 12.
    forwards_at = {index: calls for index, _, calls in released}
    assert forwards_at[1] <= 3 < forwards_at[0]
    assert [len(r.token_ids) for r in results] == [12, 2, 0, 6]


def test_zero_budget_request_returns_empty(generator):
    result = generator.generate([GenerationRequest([5, 6], max_tokens=0)])[0]
    assert result.token_ids == [] and result.log_probs == []


def test_abort_returns_partial_tokens(generator):
    """Guards: an abort (weight sync in async modes) losing the tokens already generated."""
    no_eos = BatchedGenerator(generator.model, eos_token_ids=[10**6], pad_token_id=0)  # only the abort can stop it
    calls = {"n": 0}

    def stop_after_three() -> bool:
        calls["n"] += 1
        return calls["n"] >= 3

    result = no_eos.generate([GenerationRequest([5, 6], max_tokens=50, temperature=1.0)], should_stop=stop_after_three)[0]
    assert result.finish_reason == "abort"
    assert len(result.token_ids) == 3 == len(result.log_probs)


def test_weights_swapped_between_decode_steps_keep_the_kv_cache_and_tag_each_token(tiny_model_path):
    """An in-flight weight update: new weights load between two decode steps of a running batch, no request is
    aborted or re-prefilled, and every token records the version that sampled it."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    no_eos = BatchedGenerator(model, eos_token_ids=[10**6], pad_token_id=0)
    request = GenerationRequest([5, 6, 7], max_tokens=8, temperature=0.0)
    reference = no_eos.generate([request])[0]  # the old weights throughout
    assert reference.token_versions == [], "no policy_version callback: nothing recorded"

    input_widths: list[int] = []
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: input_widths.append(kw["input_ids"].shape[1]),
                                           with_kwargs=True)  # fmt: skip
    calls = {"n": 0}

    def policy_version() -> int:
        calls["n"] += 1
        if calls["n"] == 4:  # before the 4th forward pass: load "v1" (every weight scaled)
            with torch.no_grad():
                for param in model.parameters():
                    param.mul_(1.5)
        return 0 if calls["n"] < 4 else 1

    try:
        swapped = no_eos.generate([request], policy_version=policy_version)[0]
    finally:
        hook.remove()
    assert swapped.finish_reason == "length" and len(swapped.token_ids) == 8
    assert swapped.token_versions == [0, 0, 0, 1, 1, 1, 1, 1]
    assert swapped.token_ids[:3] == reference.token_ids[:3] and swapped.log_probs[:3] == reference.log_probs[:3]
    assert swapped.log_probs[3:] != pytest.approx(reference.log_probs[3:], abs=1e-3), "v1 sampled tokens 4.."
    assert input_widths[0] == 3 and set(input_widths[1:]) == {1}, "one prefill, then one token a step: KV kept"


def test_top_k_and_top_p_filtering_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    out = _filter_top_k_top_p(logits, top_k=torch.tensor([2, -1]), top_p=torch.tensor([1.0, 0.7]))
    # Row 0: top-2 survive. Row 1: 0.5 (mass before 0) and 0.3 (mass before 0.5 < 0.7) survive; 0.15 has 0.8 before.
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]
    assert torch.isfinite(out[1]).tolist() == [True, True, False, False]
    same = _filter_top_k_top_p(logits, top_k=torch.tensor([-1, -1]), top_p=torch.tensor([1.0, 1.0]))
    assert torch.equal(same, logits)


def test_shared_prompt_rows_match_unshared_decoding(generator):
    """Guards: the shared-prefix prefill (one KV cache fanned out to n samples) mixing up rows or positions."""
    prompt = list(range(30, 45))
    shared = generator.generate(
        [GenerationRequest(prompt, 8, 0.0), GenerationRequest([7, 8], 8, 0.0), GenerationRequest(prompt, 8, 0.0)]
    )
    alone = generator.generate([GenerationRequest(prompt, 8, 0.0)])[0]
    assert shared[0].token_ids == shared[2].token_ids == alone.token_ids
    for a, b in zip(shared[0].log_probs, alone.log_probs):
        assert abs(a - b) < 1e-4
    sampled = generator.generate([GenerationRequest(prompt, 10, 1.0) for _ in range(4)])
    for result in sampled:
        expected = generator.score(prompt, result.token_ids)
        assert max(abs(a - b) for a, b in zip(expected, result.log_probs)) < 1e-4


def test_seeded_rows_sample_the_same_tokens_in_any_batch(generator):
    """Guards: a seeded request's samples depending on its batch mates or their order (a lag-0 in-flight run must
    sample what sync samples, whatever the batching); the control: another seed samples something else."""
    prompt = [5, 6, 7, 8]
    mates = [GenerationRequest(list(range(30, 41)), 12, 1.0, seed=11), GenerationRequest([9, 10], 5, 1.0)]
    alone = generator.generate([GenerationRequest(prompt, 16, 1.0, seed=1234)])[0]
    first = generator.generate([GenerationRequest(prompt, 16, 1.0, seed=1234), *mates])[0]
    last = generator.generate([*mates, GenerationRequest(prompt, 16, 1.0, seed=1234)])[2]
    assert alone.token_ids == first.token_ids == last.token_ids
    others = [generator.generate([GenerationRequest(prompt, 16, 1.0, seed=s)])[0].token_ids for s in (1, 2, 3)]
    assert any(tokens != alone.token_ids for tokens in others), "seeds must matter"
    # the seeded draws still follow the policy: their log-probs are the model's (teacher-forced) ones
    expected = generator.score(prompt, alone.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(expected, alone.log_probs)) < 1e-4
