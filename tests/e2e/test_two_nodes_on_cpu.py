"""A pipelined run across two Ray nodes: the trainer pool on one, the sampler pool on the other, so the weight sync
(gloo), TransferQueue and the rollout requests cross nodes; then the sampler's node is lost mid-run.

The cluster is two raylets on this machine, each with its own object store and a custom resource
(:func:`verl_pipe.local_jobs.joined_ray_node`), and ``VERL_PIPE_POOL_NODES`` places each pool by it
(:mod:`verl_pipe.pool_nodes`). What is checked, from Ray's actor table and the run's own records:

* every trainer worker and verl's TaskRunner ran on the trainer's node, every rollout worker and the hf server on
  the sampler's node;
* one_off_pipeline trained its steps (at least three), each after the first on samples exactly one version old (so
  each sync crossed), each prompt once;
* then the sampler's node is lost (its raylet and every process on it killed at once): the run ends within bounded
  time with one error of ours (``LostNodeError``, trainers/lost_nodes.py) naming the node as the sampler's, the
  rollout server that died on it, the step and how to resume; no process of it outlives it.

The control of the placement (without the setting no pool asks for a node) is tests/backends/test_pool_nodes_on_cpu.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from verl_pipe.chaos import NODE_LOSS, SAMPLER_NODE, TRAINER_NODE, lose_node, processes_left, start_faulted_run
from verl_pipe.local_jobs import joined_ray_node, local_ray_head, stop_process_group

MODE = "one_off_pipeline"
# The sampler's node is lost once 3 steps are trained (step 3 trained samples of v1, synced across the nodes). A step
# takes well under a second here, so the run is long (the embedded set's 40 prompts, once): it cannot be over before
# the loss tells.
STEPS, TRAINED_BEFORE_THE_LOSS = 20, 3
STALL_TIMEOUT_S = 10
# Measured: runs end about 15 s after the loss (when Ray's GCS marks the node dead, which the diagnosis waits for);
# the bound is 60 s, and a hung run would not end at all.
NODE_LOSS_END_S = 60

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def two_nodes():
    """(the head's address, the sampler node's ``ray start`` process)."""
    with local_ray_head(num_cpus=8, resources={TRAINER_NODE: 1000}) as address:
        with joined_ray_node(address, num_cpus=8, resources={SAMPLER_NODE: 1000}) as sampler_node:
            yield address, sampler_node


def _cluster_state(address: str) -> dict:
    """Ray's node and actor tables (actors of ended jobs included), read from a child process."""
    probe = """
import json, sys, ray
from ray._private.state import actors
ray.init(address=sys.argv[1], logging_level="ERROR")
nodes = {n["NodeID"]: sorted(r for r in n["Resources"] if r.startswith("verl_pipe_")) for n in ray.nodes()}
idle = ray.available_resources().get("CPU", 0) == ray.cluster_resources().get("CPU", 0)
table = [{"id": i, "class": a["ActorClassName"], "node": a["Address"]["NodeID"]} for i, a in actors().items()]
print(json.dumps({"nodes": nodes, "actors": table, "idle": idle}))
"""
    done = subprocess.run([sys.executable, "-c", probe, address], capture_output=True, text=True, check=True,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled"))  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def _wait_idle(address: str, timeout_s: float = 60.0) -> dict:
    """The cluster once every CPU is free again (the actors of an earlier job reaped)."""
    deadline = time.monotonic() + timeout_s
    while not (state := _cluster_state(address))["idle"]:
        assert time.monotonic() < deadline, "the cluster still holds an earlier job's actors"
        time.sleep(1.0)
    return state


def _ledger(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "checkpoints", "pipeline_ledger.jsonl")) as handle:
        return [json.loads(line) for line in handle]


def _new_actors(before: dict, after: dict) -> list[tuple[str, str]]:
    """(class, node resource) of each actor in ``after`` that ``before`` did not have."""
    seen = {actor["id"] for actor in before["actors"]}
    placed = []
    for actor in after["actors"]:
        if actor["id"] not in seen:
            resources = after["nodes"].get(actor["node"]) or ["?"]
            placed.append((actor["class"].rsplit(".", 1)[-1], resources[0]))
    return placed


def test_pools_on_two_nodes_train_across_them_until_the_sampler_node_is_lost(
    two_nodes, tmp_path, tiny_model_path, tail_of
):
    address, sampler_node = two_nodes
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    before = _wait_idle(address)
    # chaos's node_loss run: the embedded set, 2 prompts x 2 samples, the pools placed by VERL_PIPE_POOL_NODES
    run, log_path = start_faulted_run(run_dir, tiny_model_path, address, MODE, NODE_LOSS,
                                      stall_timeout_s=STALL_TIMEOUT_S, steps=STEPS)  # fmt: skip
    ledger_path = os.path.join(run_dir, "checkpoints", "pipeline_ledger.jsonl")
    try:
        deadline = time.monotonic() + 400
        while not (os.path.exists(ledger_path) and len(_ledger(run_dir)) >= TRAINED_BEFORE_THE_LOSS):
            assert run.poll() is None and time.monotonic() < deadline, tail_of(log_path)
            time.sleep(0.2)
        placed = _new_actors(before, _cluster_state(address))
        lose_node(sampler_node)  # the node's raylet and every process on it SIGKILLed at once
        lost_at = time.monotonic()
        rc = run.wait(timeout=NODE_LOSS_END_S)
        ended_after = time.monotonic() - lost_at
    finally:
        stop_process_group(run, grace_s=10)

    where = {cls: {node for c, node in placed if c == cls} for cls, _ in placed}
    assert where["WorkerDict"] == {TRAINER_NODE}, placed  # the trainer's FSDP ranks
    assert where["CheckpointEngineWorker"] == where["HFRolloutServer"] == {SAMPLER_NODE}, placed
    # verl places it on any node (on the sampler's, in one of three runs before the driver patch placed it)
    assert where["TaskRunnerV1"] == {TRAINER_NODE}, placed
    ledger = _ledger(run_dir)
    assert ledger[0]["sample_versions"] == [[0, 0]], ledger
    assert len(ledger) >= TRAINED_BEFORE_THE_LOSS
    for row in ledger[1:]:  # trained on samples of weights synced across the nodes
        assert row["sample_versions"] == [[row["step"] - 2, row["step"] - 2]], row
    prompts = [p for row in ledger for p in row["prompts"]]
    assert len(prompts) == len(set(prompts)), ledger

    assert rc != 0 and len(ledger) < STEPS, tail_of(log_path)
    log = open(log_path, errors="replace").read()
    diagnosis = re.search(r"LostNodeError: (Ray node .*)", log)
    assert diagnosis, tail_of(log_path)
    text = diagnosis.group(1)
    assert "verl_pipe_sampler_node: the sampler's node" in text and "HFRolloutServer x1" in text, text
    assert "missing too many heartbeats" in text, text  # lost, not shut down: the GCS noticed its silence
    lost_at_step = int(re.search(r"was lost during step (\d+)", text).group(1))
    assert len(ledger) <= lost_at_step <= len(ledger) + 1, (text, len(ledger))
    assert processes_left(run_dir) == 0, "a process of the run outlived it"
    print(f"the run ended {ended_after:.0f} s after its sampler's node was lost")
