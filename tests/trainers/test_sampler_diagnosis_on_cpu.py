"""What the stall watch says of the sampler's actors: each rollout server and each reward worker pinged for real
on the shared Ray cluster (in a subprocess: the test process never joins Ray), and a dead reward worker named as
the cause, not the rollout engine; and a replica whose engine process died under a live server (vLLM's
``EngineCore``, as ``make chaos --faults engine_kill`` kills it) named as such.

Seen with ``make chaos`` (``reward_kill``): with verl's reward worker killed, every group routed to it fails, verl's
buffer submits it again round after round, the rollout server answers, and the watch blamed a stuck engine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from verl_pipe.trainers.replay_buffer import PipelineReplayBuffer

SCRIPT = r"""
import json, sys, threading, time
from types import SimpleNamespace
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
import verl.trainer.ppo.v1  # verl's trainers first: importing them imports ours, the way a run does
from verl_pipe.trainers.pipelined_trainer import PipelinedTrainer
from verl_pipe.trainers.dead_replicas import call_while_engines_live

@ray.remote(num_cpus=0)
class Alive:
    pass

@ray.remote(num_cpus=0)
class ServerWithADeadEngine:  # answers pings, as vLLM's server does once its EngineCore process is gone
    def engine_health(self):
        return "its engine process (VLLM::EngineCore) is dead"

@ray.remote(num_cpus=0)
class ServerWhoseEngineDiesIn:  # its engine process dies ``seconds`` after the server starts (mid-transfer)
    def __init__(self, seconds):
        self.dies_at = time.monotonic() + seconds

    def engine_health(self):
        return "its engine process (VLLM::EngineCore) is dead" if time.monotonic() > self.dies_at else None

server, first, second = Alive.remote(), Alive.remote(), Alive.remote()
ray.get([a.__ray_ready__.remote() for a in (server, first, second)])
workers = [first, second]
trainer = SimpleNamespace(
    standalone_server_manager=SimpleNamespace(
        get_replicas=lambda: [SimpleNamespace(replica_rank=0, servers=[server])]),
    get_reward_handles=lambda: workers,
)
healthy = PipelinedTrainer._describe_sampler(trainer)
ray.kill(second)  # SIGKILL of its process, as the OOM killer would
while True:
    try:
        ray.get(second.__ray_ready__.remote(), timeout=5)
    except ray.exceptions.RayActorError:
        break
one_dead = PipelinedTrainer._describe_sampler(trainer)
workers.pop()
replicas = [SimpleNamespace(replica_rank=0, servers=[server]),
            SimpleNamespace(replica_rank=1, servers=[ServerWithADeadEngine.remote()])]
trainer.standalone_server_manager.get_replicas = lambda: replicas
dead_engine = PipelinedTrainer._describe_sampler(trainer)


def sync(replicas, seconds=None):  # a weight sync of `seconds` (None: for ever, as verl's sender on a dead engine)
    def transfer():
        threading.Event().wait(seconds)
        return {"synced": True}
    started = time.monotonic()
    try:
        outcome = call_while_engines_live(transfer, replicas, 4, "/nowhere", check_every_s=0.5)
    except Exception as error:
        outcome = f"{type(error).__name__}: {error}"
    return outcome, round(time.monotonic() - started, 1)

before_sync = sync(replicas, seconds=0)
dies = [SimpleNamespace(replica_rank=2, servers=[ServerWhoseEngineDiesIn.remote(2.0)])]
mid_sync = sync(dies)
lives = [SimpleNamespace(replica_rank=2, servers=[ServerWhoseEngineDiesIn.remote(600.0)])]
healthy_sync = sync(lives, seconds=3.0)
print(json.dumps({"healthy": healthy, "one_dead": one_dead, "dead_engine": dead_engine, "before_sync": before_sync,
                  "mid_sync": mid_sync, "healthy_sync": healthy_sync}))
"""


@pytest.fixture(scope="module")
def answers(ray_cluster) -> dict:
    """What the diagnosis said: every actor alive, a reward worker dead, a replica's engine dead."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, ray_cluster], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_dead_reward_worker_is_named_as_the_cause(answers):
    facts, cause = answers["one_dead"]
    assert "replica 0: its server answers." in facts, "with a reward worker dead the engine is not blamed"
    assert "Reward workers: worker 0: answers; worker 1: is dead (ActorDiedError)." in facts
    assert cause.startswith("Reward worker 1 died: every group routed to it fails")
    # the control: with every actor alive the cause is left to the default (a stuck rollout engine)
    facts, cause = answers["healthy"]
    assert "worker 1: answers" in facts and cause is None
    assert "replica 0: its server answers (its engine, not the server, is stuck)" in facts


def test_a_dead_engine_under_a_live_server_is_named_as_the_cause(answers):
    facts, cause = answers["dead_engine"]
    assert "replica 1: its server answers, but its engine process (VLLM::EngineCore) is dead" in facts, facts
    assert cause.startswith("Rollout replica 1 died (its server or its engine process"), cause
    # the control: replica 0's server (which cannot tell of an engine) is not blamed
    assert "replica 0: its server answers (its engine, not the server, is stuck)" in facts


def test_a_weight_sync_into_a_dead_engine_is_refused_before_it_starts(answers):
    """verl's bucket sender would wait for ever on a dead engine's socket (in_flight_pipeline, which does not abort
    first, hung there in `make chaos --faults engine_kill`)."""
    refused, _ = answers["before_sync"]
    assert refused.startswith("RolloutReplicaDiedError: Rollout replica 1 died during step 4: its server says its "
                              "engine process (VLLM::EngineCore) is dead"), refused  # fmt: skip
    assert "rerun the same command" in refused


def test_an_engine_that_dies_mid_transfer_ends_the_sync_instead_of_a_wait_for_ever(answers):
    stopped, seconds = answers["mid_sync"]
    assert stopped.startswith("RolloutReplicaDiedError: Rollout replica 2 died during step 4"), stopped
    assert seconds < 10, seconds  # dies 2 s in, checked every 0.5 s
    # the control: a slow sync with its engine alive is waited for to its end, and returns what the sync returned
    synced, seconds = answers["healthy_sync"]
    assert synced == {"synced": True} and seconds >= 3.0


def test_the_stall_error_carries_the_cause_the_trainer_found():
    buffer = PipelineReplayBuffer.__new__(PipelineReplayBuffer)  # only the diagnosis's inputs, set below
    buffer.trainer_mode, buffer._waiting_for, buffer._evicted_while_waiting = "one_off_pipeline", (3, 2), 86
    for name in ("pending", "running", "finished", "failure"):
        setattr(buffer, f"{name}_keys", {"train": ["a", "b"] if name == "running" else []})
    buffer.describe_sampler = lambda: ("Reward workers: worker 0: is dead (ActorDiedError).", "Reward worker 0 died")
    text = buffer._stall_diagnosis("train", 10.0)
    assert "86 failed groups were dropped" in text and "worker 0: is dead" in text
    assert "Reward worker 0 died; if one generation legitimately takes longer" in text
    assert "A rollout engine is stuck" not in text
    buffer.describe_sampler = lambda: ("Rollout replicas: replica 0: its server answers.", None)
    assert "A rollout engine is stuck or gone" in buffer._stall_diagnosis("train", 10.0)


def _buffer_with(finished=(), running=(), failed=(), listed=None) -> PipelineReplayBuffer:
    buffer = PipelineReplayBuffer.__new__(PipelineReplayBuffer)  # only what _progress reads, set below
    buffer.pending_keys, buffer.running_keys = {"train": set()}, {"train": set(running)}
    buffer.finished_keys, buffer.failure_keys = {"train": set(finished)}, {"train": set(failed)}
    buffer.partitions = {"train": dict(listed or {})}
    return buffer


def test_keys_listed_without_a_sample_and_samples_of_failed_groups_are_not_progress():
    """Seen in ``make chaos --faults reward_kill`` (in_flight_pipeline, its one reward worker killed): every round of
    failed-and-replaced groups listed the new groups' prompt keys with empty tags for a moment, the count of keys
    went 0, 4, 0, and the watch took each flicker for progress; the run hung."""
    base = _buffer_with(running={"g1"})._progress("train")
    flicker = _buffer_with(running={"g1"}, listed={"g2": {}, "g3": {}})  # a group being cleared or submitted
    assert flicker._progress("train") == base
    failed = _buffer_with(running={"g1"}, failed={"g4"}, listed={"g4_0_0": {"status": "success"}})
    assert failed._progress("train") == base
    # the controls: a stored sample of a live group is progress, and so is a finished group
    sample = _buffer_with(running={"g1"}, listed={"g1_0_0": {"status": "success"}})
    assert sample._progress("train") != base
    assert _buffer_with(finished={"g1"})._progress("train") != base


def test_groups_failing_in_a_row_are_diagnosed_with_the_bound_and_the_fix():
    buffer = PipelineReplayBuffer.__new__(PipelineReplayBuffer)  # only the diagnosis's inputs, set below
    buffer.trainer_mode, buffer._waiting_for = "in_flight_pipeline", (4, 8)
    buffer.describe_sampler = lambda: ("Reward workers: worker 0: answers.", None)  # every actor alive
    text = buffer._failure_diagnosis("train", 100)
    assert text.startswith("in_flight_pipeline: 100 prompt groups failed in a row while the trainer waited for 8 "
                           "prompt groups of step 4, and none finished in between")  # fmt: skip
    assert "the rollout or the reward raises on every sample" in text
    assert text.endswith("raise trainer.v1.in_flight_pipeline.max_failed_groups_in_a_row (null: no bound).")
