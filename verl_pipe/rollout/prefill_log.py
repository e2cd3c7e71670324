"""What each vLLM request cost in prefill, one JSON line per request (``VERL_PIPE_PREFILL_LOG=<path>``; off unless
set), so that runs of different trainer modes on the real engine can be compared token for token.

verl's weight sync in ``separate_async`` aborts every running request, and its partial-rollout client resubmits
each one with the answer so far appended to the prompt; verl resets vLLM's prefix cache with the weights, so the
engine prefills prompt and answer again. ``in_flight_pipeline`` loads between decode steps and resubmits nothing.
A line holds the prompt tokens a request brought, those vLLM found in its prefix cache (verl's
``num_cached_tokens``), how many of the prompt's tokens are an earlier aborted answer's, the answer tokens it
produced and whether it was aborted. A resubmission is recognised by its content: its prompt is exactly an aborted
request's prompt plus that request's output (verl's load balancer sends it back to the same server).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

PREFILL_LOG_ENV = "VERL_PIPE_PREFILL_LOG"
ABORTED = ("aborted", "abort")


class PrefillLog:
    """One server's writer: appends a line per finished ``generate`` call."""

    def __init__(self, path: str, replica: Any):
        self.path, self.replica = path, replica
        # hash of an aborted request's prompt + output -> answer tokens in that sequence (its resubmission's prompt)
        self._aborted: dict[int, int] = {}

    @classmethod
    def from_env(cls, replica: Any) -> Optional["PrefillLog"]:
        path = os.environ.get(PREFILL_LOG_ENV)
        return cls(path, replica) if path else None

    def record(self, prompt_ids: Sequence[int], output: Any) -> None:
        """``output``: verl's ``TokenOutput`` of the call (token ids, stop reason, extra fields)."""
        answer_in_prompt = self._aborted.pop(hash(tuple(prompt_ids)), 0)
        token_ids = list(output.token_ids or [])
        aborted = output.stop_reason in ABORTED
        if aborted:
            self._aborted[hash((*prompt_ids, *token_ids))] = answer_in_prompt + len(token_ids)
        cached = (output.extra_fields or {}).get("num_cached_tokens")
        line = {
            "replica": self.replica,
            "time": time.time(),
            "prompt_tokens": len(prompt_ids),
            "cached_tokens": cached,  # None: vLLM returned no output to read it from (aborted before any token)
            "answer_tokens_in_prompt": answer_in_prompt,
            "output_tokens": len(token_ids),
            "aborted": aborted,
        }
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")


@dataclass(frozen=True)
class PrefillSummary:
    requests: int  # generate calls, resubmissions included
    aborted: int
    resubmitted: int  # calls whose prompt carried an aborted answer
    prompt_tokens: int
    prefilled_tokens: int  # prompt tokens the engine computed (not found in its prefix cache)
    # of which by resubmissions: the original prompt again too, since verl resets the prefix cache with the weights
    resubmission_prefilled_tokens: int
    reprefilled_answer_tokens: int  # of which tokens of an answer sampled before an abort
    output_tokens: int

    def per(self, count: int) -> dict[str, float]:
        """Every count divided by ``count`` (steps, or trained samples)."""
        return {name: value / count for name, value in vars(self).items()}


def summarize(lines: list[dict]) -> PrefillSummary:
    prefilled = resubmission = reprefilled = 0
    for line in lines:
        # a call aborted before it produced anything reports no cache hits: count all of its prompt as computed
        computed = line["prompt_tokens"] - (line["cached_tokens"] or 0)
        prefilled += computed
        if line["answer_tokens_in_prompt"]:
            resubmission += computed
        # the cache serves a prompt's front (the original prompt) first; what is left of the answer was recomputed
        reprefilled += min(line["answer_tokens_in_prompt"], computed)
    return PrefillSummary(
        requests=len(lines),
        aborted=sum(1 for line in lines if line["aborted"]),
        resubmitted=sum(1 for line in lines if line["answer_tokens_in_prompt"]),
        prompt_tokens=sum(line["prompt_tokens"] for line in lines),
        prefilled_tokens=prefilled,
        resubmission_prefilled_tokens=resubmission,
        reprefilled_answer_tokens=reprefilled,
        output_tokens=sum(line["output_tokens"] for line in lines),
    )


def read_prefill_log(path: str) -> PrefillSummary:
    with open(path, encoding="utf-8") as handle:
        return summarize([json.loads(line) for line in handle if line.strip()])
