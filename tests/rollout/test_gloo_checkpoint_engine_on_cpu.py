"""The ``gloo`` checkpoint engine moves every byte of every weight, through verl's own engine protocol.

Guards the silent failures of a weight-sync transport: a tensor split across buckets reassembled in the wrong
order, a dtype misread from a misaligned offset, a receiver that stops before the last bucket, a non-root
trainer rank that skips the (collective) weight gather. Real gloo groups and a real TCP store, in threads.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import verl  # noqa: F401 - the plugin registers the engine on verl's registry
from verl.checkpoint_engine.base import CheckpointEngineRegistry

BUCKET = 1 << 16


def _weights() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(300, 97, generator=gen),  # 116 KB: spans two buckets
        "norm.weight": torch.randn(7, generator=gen).to(torch.bfloat16),  # odd byte count before the next tensor
        "position_ids": torch.arange(13),  # int64 right after an unaligned bf16 tensor
        "scalar": torch.tensor(3.5),
        "head.weight": torch.randn(64, 64, generator=gen).t(),  # non-contiguous, as FSDP can hand out
    }


def _sync(weights: dict[str, torch.Tensor], receivers: int = 2, actor_ranks: int = 2):
    engine_cls = CheckpointEngineRegistry.get("gloo")
    actors = [engine_cls(bucket_size=BUCKET, is_master=(i == 0)) for i in range(actor_ranks)]
    rollouts = [engine_cls(bucket_size=BUCKET) for _ in range(receivers)]
    metadata = [engine.prepare() for engine in actors + rollouts]
    actor_kwargs, rollout_kwargs = engine_cls.build_topology(actor_ranks, receivers, metadata)
    received: dict[int, dict[str, torch.Tensor]] = {}
    errors: list[BaseException] = []
    walked = []

    def receive(i: int) -> None:
        try:
            engine = rollouts[i]
            engine.init_process_group(**{k: v[i] for k, v in rollout_kwargs.items()})

            async def drain():
                return {name: tensor.clone() async for name, tensor in engine.receive_weights()}

            received[i] = asyncio.run(drain())
        except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
            errors.append(error)

    def send(i: int) -> None:
        try:
            engine = actors[i]
            engine.init_process_group(**{k: v[i] for k, v in actor_kwargs.items()})

            def generator():
                for name, tensor in weights.items():
                    walked.append((i, name))
                    yield name, tensor

            asyncio.run(engine.send_weights(generator()))
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=receive, args=(i,)) for i in range(receivers)]
    threads += [threading.Thread(target=send, args=(i,)) for i in range(actor_ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    for engine in actors + rollouts:
        engine.finalize()
    return received, walked, actors[0].last_sync


def test_every_receiver_gets_every_tensor_bit_exact():
    weights = _weights()
    received, walked, stats = _sync(weights)
    assert sorted(received) == [0, 1]
    for got in received.values():
        assert list(got) == list(weights), "names and order as the trainer produced them"
        for name, tensor in weights.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
            assert torch.equal(got[name], tensor), name
    assert stats["buckets"] >= 3, "the test must exercise a tensor split across buckets"
    # The non-root trainer rank walked the whole generator too (gathering a sharded weight is collective).
    assert sorted(name for rank, name in walked if rank == 1) == sorted(weights)


def test_each_sync_rendezvouses_afresh():
    """A group rebuilt per sync must not read the previous sync's bucket layouts."""
    first = _weights()
    second = {name: tensor + 1 if tensor.is_floating_point() else tensor for name, tensor in first.items()}
    _sync(first, receivers=1, actor_ranks=1)
    received, _, _ = _sync(second, receivers=1, actor_ranks=1)
    assert torch.equal(received[0]["embed.weight"], second["embed.weight"])


def test_bad_bucket_size_names_the_key():
    with pytest.raises(ValueError, match="update_weights_bucket_megabytes"):
        CheckpointEngineRegistry.get("gloo")(bucket_size=0)


def test_the_root_announces_the_port_its_store_is_bound_to():
    """The root's store takes its port from the kernel while binding, so no other process can take it between a
    free-port probe and the bind (EADDRINUSE seen once in a suite run), and the workers dial that port."""
    root = CheckpointEngineRegistry.get("gloo")(bucket_size=BUCKET, is_master=True)
    rendezvous = root.prepare()
    assert rendezvous.port == root._store.port and rendezvous.port > 0
    worker = dist.TCPStore(rendezvous.host, rendezvous.port, is_master=False, timeout=timedelta(seconds=10))
    worker.set("reached", "root")
    assert root._store.get("reached") == b"root"
