"""``verl-pipe baseline``: a model's pass rate on the embedded coding problems before any training.

Samples each problem with the same chat template, decoder (the hf rollout's batched generator) and reward that
training uses, so the number is the starting point of the demo's reward curve. Reports pass@1 (mean over
samples), the share of problems solved at least once, and the format rate, overall and by problem style.

:func:`iter_completions` is the sampling half on its own; ``verl-pipe eval`` samples through it too, so both
commands decode exactly as the CPU rollout does.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from verl_pipe.reports import write_json


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample: the model (``smollm2``, ``tiny`` or an HF folder) and its decoding settings."""

    model: str = "smollm2"
    samples: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 192
    batch_size: int = 16
    seed: int = 0


@dataclass(frozen=True)
class BaselineConfig(SamplingConfig):
    """The sampling settings plus which embedded problems to score."""

    split: str = "all"  # "all", "train" or "val"
    out: Optional[str] = None


def iter_completions(
    prompts: Sequence[list[dict[str, Any]]], cfg: SamplingConfig, progress: bool = True
) -> Iterator[list[tuple[int, str]]]:
    """Sample ``cfg.samples`` completions of each chat prompt; yields one batch of ``(prompt index, text)`` at a
    time, so callers can score while the next batch decodes. Samples of one prompt are adjacent, in order."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_pipe.backends.cpu.hf_generation import BatchedGenerator, GenerationRequest
    from verl_pipe.models import resolve_model_path

    torch.manual_seed(cfg.seed)
    path = resolve_model_path(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    generator = BatchedGenerator(model, [tokenizer.eos_token_id], tokenizer.pad_token_id)

    jobs = []  # (prompt index, prompt_ids) repeated per sample
    for index, messages in enumerate(prompts):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        jobs.extend((index, list(ids)) for _ in range(cfg.samples))

    started = time.time()
    for start in range(0, len(jobs), cfg.batch_size):
        chunk = jobs[start : start + cfg.batch_size]
        requests = [GenerationRequest(ids, cfg.max_tokens, cfg.temperature, cfg.top_p) for _, ids in chunk]
        results = generator.generate(requests)
        yield [(i, tokenizer.decode(r.token_ids, skip_special_tokens=True)) for (i, _), r in zip(chunk, results)]
        if progress:
            done = min(start + cfg.batch_size, len(jobs))
            print(f"  {done}/{len(jobs)} samples, {time.time() - started:.0f} s", flush=True)


def run_baseline(cfg: BaselineConfig) -> dict:
    from verl_pipe.data.embedded import load_embedded_problems, split_problems, to_verl_rows
    from verl_pipe.reward_score import compute_score
    from verl_pipe.reward_score.extract import extract_last_python_block

    problems = load_embedded_problems()
    if cfg.split != "all":
        train, val = split_problems(problems, seed=cfg.seed)
        problems = train if cfg.split == "train" else val
    rows = to_verl_rows(problems, split=cfg.split)

    started = time.time()
    per_problem: dict[str, list[float]] = defaultdict(list)
    formatted = 0
    style_of = {}
    for batch in iter_completions([row["prompt"] for row in rows], cfg):
        for index, text in batch:
            row = rows[index]
            score = compute_score(row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"])
            pid = row["extra_info"]["problem_id"]
            per_problem[pid].append(float(score["passed"]))
            style_of[pid] = row["extra_info"]["testtype"]
            formatted += bool(extract_last_python_block(text) is not None)
    n_samples = len(rows) * cfg.samples

    def summarize(pids: list[str]) -> dict:
        scores = [s for p in pids for s in per_problem[p]]
        return {
            "problems": len(pids),
            "pass_at_1": sum(scores) / max(1, len(scores)),
            "solved_at_least_once": sum(any(per_problem[p]) for p in pids) / max(1, len(pids)),
        }

    report = {
        "model": cfg.model,
        "samples_per_problem": cfg.samples,
        "temperature": cfg.temperature,
        "max_tokens": cfg.max_tokens,
        "overall": summarize(list(per_problem)),
        "format_rate": formatted / max(1, n_samples),
        "by_style": {
            style: summarize([p for p in per_problem if style_of[p] == style])
            for style in sorted(set(style_of.values()))
        },
        "solved_problems": sorted(p for p, s in per_problem.items() if any(s)),
        "wall_s": time.time() - started,
    }
    if cfg.out:
        write_json(cfg.out, report)
    return report
