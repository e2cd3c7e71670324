"""Register verl's own FSDP engines (LM head and value head) for the ``cpu`` device.

verl registers ``FSDPEngineWithLMHead`` / ``FSDPEngineWithValueHead`` for cuda and npu only. The engines
themselves are device-agnostic under FSDP2 (``strategy=fsdp2``); FSDP1 is not supported on CPU because it
syncs module states through device collectives and pins memory.
"""

from __future__ import annotations


def register_cpu_engines() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine_cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        registered = EngineRegistry._engines.get(model_type, {}).get("fsdp2", {})
        if registered.get("cpu") is engine_cls:
            continue  # idempotent: every `import verl` in a process runs the plugin hook once more at most
        EngineRegistry.register(model_type=model_type, backend="fsdp2", device="cpu")(engine_cls)
