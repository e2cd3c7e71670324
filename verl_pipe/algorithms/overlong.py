"""Overlong filtering as a true loss mask (DeepCoder's GRPO+).

A response that hit the length limit without emitting EOS is cut, not finished; its reward says nothing about
the policy's answer. GRPO+ removes such responses from the policy loss entirely. The original implementation
zeroed their advantage instead, which left their tokens in the ``token-mean`` denominator (rllm's ``core_algos.py``).

verl counts the global number of loss tokens from the batch's ``loss_mask`` before any loss runs
(``FSDPEngine.forward_backward_batch``), and the policy loss averages over ``response_mask``. So the mask is
applied to *both* fields of the actor's copy of the batch, before the update, by the hook in
``verl_pipe.algorithms.hooks``. With ``seq-mean-*`` aggregation verl divides by the configured mini-batch
size, a constant; masked responses then leave the numerator only, as any constant normaliser intends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from tensordict import TensorDict

_SCORE_FIELDS = ("token_level_scores", "rm_scores", "token_level_rewards")


@dataclass(frozen=True)
class OverlongStats:
    samples: int
    truncated: int
    masked: int
    masked_tokens: int
    # the response length a sample must fill to count as cut: the run's configured limit (a later stage of a
    # context-lengthening schedule must show its own, longer one)
    length_limit: int

    def as_metrics(self) -> dict[str, float]:
        return {
            "grpo_plus/overlong_length_limit": float(self.length_limit),
            "grpo_plus/truncated_frac": self.truncated / max(self.samples, 1),
            "grpo_plus/overlong_masked_frac": self.masked / max(self.samples, 1),
            "grpo_plus/overlong_masked_tokens": float(self.masked_tokens),
        }


def eos_token_ids(model_config) -> set[int]:
    """Every EOS id the tokenizer, generation config and model config declare (a model may have several)."""
    ids: set[int] = set()
    for source in (
        getattr(model_config, "tokenizer", None),
        getattr(model_config, "generation_config", None),
        getattr(model_config, "hf_config", None),
    ):
        value = getattr(source, "eos_token_id", None)
        if value is None:
            continue
        ids.update(int(v) for v in (value if isinstance(value, Iterable) else [value]))
    return ids


def truncated_responses(
    lengths: torch.Tensor, last_tokens: torch.Tensor, max_response_length: int, eos_ids: set[int]
) -> torch.Tensor:
    """True where a response filled ``max_response_length`` tokens and its last token is not an EOS."""
    at_limit = lengths >= max_response_length
    if not eos_ids:
        return at_limit
    ends_with_eos = torch.isin(last_tokens, torch.tensor(sorted(eos_ids), dtype=last_tokens.dtype))
    return at_limit & ~ends_with_eos


def samples_to_keep(truncated: torch.Tensor, scores: torch.Tensor | None, mode: str) -> torch.Tensor:
    """Which samples stay in the loss: ``all`` drops every truncated one, ``wrong`` only those with score <= 0."""
    if mode == "off":
        return torch.ones_like(truncated)
    if mode == "all":
        return ~truncated
    if mode == "wrong":
        if scores is None:
            raise ValueError(
                "actor_rollout_ref.actor.policy_loss.overlong_filter=wrong needs the sample scores in the batch "
                f"(one of {_SCORE_FIELDS}); use overlong_filter=all instead."
            )
        return ~(truncated & (scores <= 0))
    raise ValueError(f"unknown overlong_filter mode {mode!r}")


def _response_lengths_and_last_tokens(data: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    responses = data["responses"]
    if responses.is_nested:  # V1 trainer: jagged (bs, j)
        offsets = responses.offsets()
        lengths = offsets.diff()
        values = responses.values()
        last_index = (offsets[1:] - 1).clamp(min=0)
        last = values[last_index] if values.numel() else torch.zeros_like(lengths)
        return lengths, torch.where(lengths > 0, last, torch.full_like(last, -1))
    # legacy trainer: right-padded (bs, R); the response part of the attention mask marks real tokens
    width = responses.shape[1]
    lengths = data["attention_mask"][:, -width:].sum(dim=-1).long()
    last = responses.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return lengths, torch.where(lengths > 0, last, torch.full_like(last, -1))


def _sample_scores(data: TensorDict) -> torch.Tensor | None:
    for name in _SCORE_FIELDS:
        if name in data.keys():
            scores = data[name]
            if scores.is_nested:
                offsets = scores.offsets()
                sums = torch.zeros(len(offsets) - 1, dtype=scores.values().dtype)
                rows = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff())
                return sums.index_add_(0, rows, scores.values())
            return scores.sum(dim=-1)
    return None


def _mask_rows(mask: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    if mask.is_nested:
        offsets = mask.offsets()
        keep_per_token = torch.repeat_interleave(keep, offsets.diff()).to(mask.values().dtype)
        return torch.nested.nested_tensor_from_jagged(mask.values() * keep_per_token, offsets=offsets)
    return mask * keep.to(mask.dtype).unsqueeze(-1)


def apply_overlong_filter(data: TensorDict, max_response_length: int, eos_ids: set[int], mode: str) -> OverlongStats:
    """Zero ``response_mask`` and ``loss_mask`` of the filtered samples in ``data`` (the actor's local copy)."""
    lengths, last_tokens = _response_lengths_and_last_tokens(data)
    truncated = truncated_responses(lengths, last_tokens, max_response_length, eos_ids)
    keep = samples_to_keep(truncated, _sample_scores(data) if mode == "wrong" else None, mode)
    response_mask = data["response_mask"]
    before = float(response_mask.values().sum() if response_mask.is_nested else response_mask.sum())
    # loss_mask may be the very tensor response_mask is (legacy trainer): build new tensors, never edit in place
    data["response_mask"] = _mask_rows(response_mask, keep)
    if "loss_mask" in data.keys():
        data["loss_mask"] = _mask_rows(data["loss_mask"], keep)
    masked_rm = data["response_mask"]
    after = float(masked_rm.values().sum() if masked_rm.is_nested else masked_rm.sum())
    return OverlongStats(
        samples=int(lengths.numel()),
        truncated=int(truncated.sum()),
        masked=int((~keep).sum()),
        masked_tokens=int(before - after),
        length_limit=max_response_length,
    )
