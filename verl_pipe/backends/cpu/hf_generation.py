"""Batched token-in/token-out decoding with a transformers model, for the ``hf`` rollout server.

One call decodes a whole batch of requests, each with its own sampling parameters (temperature, top-p, top-k,
max tokens), with a KV cache and left padding. It returns, per request, the sampled tokens, the log-probability
of each under the policy (``log_softmax(logits / temperature)``, which is what verl's actor recomputes, so the
two can be compared token by token) and why decoding stopped. A ``should_stop`` callback is polled between
decode steps so a weight sync can abort a running batch and keep the tokens produced so far. A
``policy_version`` callback runs before every forward pass instead: it may load new weights into the model
right there (an in-flight weight update: the running requests keep their KV cache and go on decoding under the
new weights), and each token records the version of the forward pass that sampled it. A request with a ``seed``
samples from its own random stream (exponential race: the token maximising p / E with E ~ Exp(1) drawn from that
stream is distributed as p), so the same request gives the same tokens in any batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    # Seeds this request's own random stream: its tokens then do not depend on which requests share its batch or
    # in what order they arrived (None: the batch's shared generator).
    seed: Optional[int] = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class GenerationResult:
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    # "stop" (an end-of-sequence token), "length" (max_tokens reached) or "abort" (should_stop fired).
    finish_reason: str = "length"
    # The policy version of the forward pass that sampled each token (generate's policy_version; empty without it).
    token_versions: list[int] = field(default_factory=list)


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k and nucleus; rows with k<=0 and p>=1 are untouched."""
    vocab = logits.shape[-1]
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(-1)
    remove = ranks >= k
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep a token while the mass strictly before it is below top_p (so the top token always survives).
    mass_before = torch.cumsum(probs, dim=-1) - probs
    remove |= mass_before >= top_p.unsqueeze(-1)
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


class BatchedGenerator:
    """Decodes batches of requests with one model; not thread-safe (the server serialises batches)."""

    def __init__(self, model: torch.nn.Module, eos_token_ids: Sequence[int], pad_token_id: int):
        self.model = model
        self.eos_token_ids = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long)
        self.pad_token_id = pad_token_id

    @torch.no_grad()
    def generate(
        self,
        requests: Sequence[GenerationRequest],
        should_stop: Optional[Callable[[], bool]] = None,
        generator: Optional[torch.Generator] = None,
        on_finished: Optional[Callable[[int, GenerationResult], None]] = None,
        policy_version: Optional[Callable[[], Optional[int]]] = None,
    ) -> list[GenerationResult]:
        """Decode ``requests`` as one batch. ``on_finished(index, result)`` is called the moment a request is
        complete (EOS or its length), so a server can hand it back while the rest of the batch decodes.
        ``policy_version()`` is called in this thread before every forward pass (the prefill included); it may swap
        the model's weights first, and returns the version the pass runs under (None: not recorded)."""
        results = [GenerationResult() for _ in requests]
        active_idx = [i for i, r in enumerate(requests) if r.max_tokens > 0]
        if on_finished is not None:
            for i, request in enumerate(requests):
                if request.max_tokens <= 0:
                    on_finished(i, results[i])
        if not active_idx:
            return results
        batch = [requests[i] for i in active_idx]
        bsz = len(batch)

        # GRPO sends n samples of each prompt: prefill every distinct prompt once and fan its KV cache out to
        # its rows (what prefix caching gives a GPU server). Left-pad so each row's next token is last.
        unique_prompts: dict[tuple[int, ...], int] = {}
        row_to_unique = [unique_prompts.setdefault(tuple(r.prompt_ids), len(unique_prompts)) for r in batch]
        prompts = list(unique_prompts)
        width = max(len(p) for p in prompts)
        prefill_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        prefill_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            prefill_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            prefill_mask[row, width - len(prompt) :] = 1
        prefill_pos = (prefill_mask.cumsum(-1) - 1).clamp(min=0)
        logits_version = policy_version() if policy_version is not None else None
        # logits_to_keep=1: only the last position's logits are needed, not prompt_len x vocab of them.
        out = self.model(
            input_ids=prefill_ids,
            attention_mask=prefill_mask,
            position_ids=prefill_pos,
            use_cache=True,
            logits_to_keep=1,
        )
        fan_out = torch.tensor(row_to_unique, dtype=torch.long)
        past = out.past_key_values
        if len(prompts) != bsz:
            past.reorder_cache(fan_out)
        logits = out.logits[:, -1, :].index_select(0, fan_out)
        attention_mask = prefill_mask.index_select(0, fan_out)
        position_ids = prefill_pos.index_select(0, fan_out)

        temperature = torch.tensor([r.temperature if not r.greedy else 1.0 for r in batch], dtype=torch.float32)
        greedy = torch.tensor([r.greedy for r in batch])
        top_p = torch.tensor([1.0 if r.greedy else r.top_p for r in batch], dtype=torch.float32)
        top_k = torch.tensor([-1 if r.greedy else r.top_k for r in batch], dtype=torch.long)
        max_tokens = torch.tensor([r.max_tokens for r in batch], dtype=torch.long)
        needs_filter = bool(((top_p < 1.0) | (top_k > 0)).any())
        row_streams = [
            torch.Generator().manual_seed(r.seed % (2**63)) if r.seed is not None and not r.greedy else None
            for r in batch
        ]
        seeded_rows = [row for row, stream in enumerate(row_streams) if stream is not None]

        finished = torch.zeros(bsz, dtype=torch.bool)
        produced = torch.zeros(bsz, dtype=torch.long)

        for _ in range(int(max_tokens.max())):
            scaled = logits.float() / temperature.unsqueeze(-1)
            log_probs = torch.log_softmax(scaled, dim=-1)
            sample_logits = _filter_top_k_top_p(scaled, top_k, top_p) if needs_filter else scaled
            probs = torch.softmax(sample_logits, dim=-1)
            sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            for row in seeded_rows:  # every step draws the row's noise, finished or not: streams stay aligned
                noise = torch.empty(probs.shape[-1]).exponential_(generator=row_streams[row])
                sampled[row] = int(torch.argmax(probs[row] / noise))
            tokens = torch.where(greedy, scaled.argmax(dim=-1), sampled)
            token_log_probs = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

            for row in torch.nonzero(~finished).flatten().tolist():
                res = results[active_idx[row]]
                res.token_ids.append(int(tokens[row]))
                res.log_probs.append(float(token_log_probs[row]))
                if logits_version is not None:
                    res.token_versions.append(logits_version)
            produced += (~finished).long()
            hit_eos = torch.isin(tokens, self.eos_token_ids) & ~finished
            hit_len = (produced >= max_tokens) & ~finished & ~hit_eos
            for row in torch.nonzero(hit_eos).flatten().tolist():
                results[active_idx[row]].finish_reason = "stop"
            if on_finished is not None:
                for row in torch.nonzero(hit_eos | hit_len).flatten().tolist():
                    on_finished(active_idx[row], results[active_idx[row]])
            finished |= hit_eos | hit_len
            if bool(finished.all()):
                break
            if should_stop is not None and should_stop():
                for row in torch.nonzero(~finished).flatten().tolist():
                    results[active_idx[row]].finish_reason = "abort"
                break

            if policy_version is not None:  # new weights, if any, apply here: between two decode steps
                logits_version = policy_version()
            # Finished rows keep decoding a pad token (cheaper than reshaping the cache); their output is ignored.
            next_tokens = torch.where(finished, torch.full_like(tokens, self.pad_token_id), tokens)
            attention_mask = torch.cat([attention_mask, torch.ones((bsz, 1), dtype=torch.long)], dim=-1)
            position_ids = position_ids[:, -1:] + 1
            out = self.model(
                input_ids=next_tokens.unsqueeze(-1),
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past,
                use_cache=True,
                logits_to_keep=1,
            )
            past = out.past_key_values
            logits = out.logits[:, -1, :]
        return results

    @torch.no_grad()
    def score(self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0) -> list[float]:
        """Log-probabilities of ``response_ids`` given ``prompt_ids`` under this model (teacher forcing)."""
        ids = torch.tensor([prompt_ids + response_ids], dtype=torch.long)
        logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / max(temperature, 1e-6)
        log_probs = torch.log_softmax(logits, dim=-1)
        return log_probs.gather(-1, torch.tensor(response_ids).unsqueeze(-1)).squeeze(-1).tolist()
