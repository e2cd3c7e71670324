"""Overlong filtering masks the batch where verl counts the token-mean denominator (both batch layouts)."""

import pytest
import torch
from tensordict import TensorDict

from verl_pipe.algorithms.overlong import apply_overlong_filter, eos_token_ids, samples_to_keep, truncated_responses

EOS = 2
MAX_LEN = 4
# responses: finished early; cut at the limit; finished exactly at the limit with EOS; empty
RESPONSES = [[5, 6, EOS], [7, 8, 9, 10], [7, 8, 9, EOS], []]
SCORES = [1.0, 0.0, 1.0, 0.0]


def nested(rows, dtype=torch.int64):
    return torch.nested.as_nested_tensor([torch.tensor(r, dtype=dtype) for r in rows], layout=torch.jagged)


def v1_batch(scores=SCORES):
    """The V1 trainer's layout: jagged tensors, loss_mask a separate copy of response_mask."""
    masks = [[1] * len(r) for r in RESPONSES]
    rm = [[0] * max(len(r) - 1, 0) + ([s] if r else []) for r, s in zip(RESPONSES, scores)]
    return TensorDict(
        {
            "responses": nested(RESPONSES),
            "response_mask": nested(masks),
            "loss_mask": nested(masks),
            "rm_scores": nested(rm, dtype=torch.float32),
        },
        batch_size=[len(RESPONSES)],
    )


def legacy_batch():
    """The legacy trainer's layout: right-padded responses, loss_mask *is* response_mask."""
    responses = torch.zeros(4, MAX_LEN, dtype=torch.int64)
    attention = torch.zeros(4, 3 + MAX_LEN, dtype=torch.int64)
    attention[:, :3] = 1
    for row, r in enumerate(RESPONSES):
        responses[row, : len(r)] = torch.tensor(r, dtype=torch.int64) if r else responses[row, :0]
        attention[row, 3 : 3 + len(r)] = 1
    response_mask = attention[:, 3:].clone()
    scores = torch.zeros(4, MAX_LEN)
    scores[:, 0] = torch.tensor(SCORES)
    return TensorDict(
        {"responses": responses, "attention_mask": attention, "response_mask": response_mask,
         "loss_mask": response_mask, "token_level_scores": scores},
        batch_size=[4],
    )


def token_count(mask):
    return int(mask.values().sum() if mask.is_nested else mask.sum())


def row_sums(mask):
    if mask.is_nested:
        return [int(row.sum()) for row in mask.unbind()]
    return mask.sum(dim=-1).tolist()


@pytest.mark.parametrize("layout", [v1_batch, legacy_batch])
def test_truncated_response_leaves_the_token_count(layout):
    data = layout()
    assert token_count(data["loss_mask"]) == 11
    stats = apply_overlong_filter(data, max_response_length=MAX_LEN, eos_ids={EOS}, mode="all")
    # only the response cut at the limit without EOS goes; the one ending in EOS at the limit stays
    assert row_sums(data["response_mask"]) == [3, 0, 4, 0]
    assert row_sums(data["loss_mask"]) == [3, 0, 4, 0]
    assert token_count(data["loss_mask"]) == 7  # what verl's engine now sums for batch_num_tokens
    assert (stats.samples, stats.truncated, stats.masked, stats.masked_tokens) == (4, 1, 1, 4)
    assert stats.as_metrics()["grpo_plus/overlong_masked_frac"] == pytest.approx(0.25)
    assert stats.as_metrics()["grpo_plus/overlong_length_limit"] == MAX_LEN


def test_a_later_stages_longer_limit_keeps_the_answers_the_shorter_one_cut():
    """Context lengthening: the same response filled the stage-1 limit, but stage 2 (a longer limit) keeps it."""
    data = v1_batch()
    stats = apply_overlong_filter(data, max_response_length=MAX_LEN + 1, eos_ids={EOS}, mode="all")
    assert (stats.truncated, stats.masked) == (0, 0)
    assert stats.as_metrics()["grpo_plus/overlong_length_limit"] == MAX_LEN + 1


def test_wrong_mode_keeps_truncated_responses_that_scored():
    data = v1_batch(scores=[1.0, 1.0, 1.0, 0.0])
    stats = apply_overlong_filter(data, max_response_length=MAX_LEN, eos_ids={EOS}, mode="wrong")
    assert stats.masked == 0 and stats.truncated == 1
    data = legacy_batch()
    stats = apply_overlong_filter(data, max_response_length=MAX_LEN, eos_ids={EOS}, mode="wrong")
    assert stats.masked == 1


def test_legacy_masks_are_rebuilt_not_edited_in_place():
    data = legacy_batch()
    original = data["response_mask"]
    before = original.clone()
    apply_overlong_filter(data, max_response_length=MAX_LEN, eos_ids={EOS}, mode="all")
    assert torch.equal(original, before)


def test_decision_table():
    lengths = torch.tensor([4, 4, 3, 0])
    last = torch.tensor([9, EOS, 9, -1])
    truncated = truncated_responses(lengths, last, 4, {EOS})
    assert truncated.tolist() == [True, False, False, False]
    assert truncated_responses(lengths, last, 4, set()).tolist() == [True, True, False, False]
    assert samples_to_keep(truncated, None, "off").all()
    with pytest.raises(ValueError, match="overlong_filter=all"):
        samples_to_keep(truncated, None, "wrong")


def test_eos_ids_from_every_source():
    class Tok:
        eos_token_id = 2

    class Gen:
        eos_token_id = [2, 7]

    class Model:
        tokenizer, generation_config, hf_config = Tok(), Gen(), None

    assert eos_token_ids(Model()) == {2, 7}
    assert eos_token_ids(None) == set()
