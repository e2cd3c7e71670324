"""The lost-node diagnosis (trainers/lost_nodes.py) on Ray's node table as Ray reports it: the rows below are a
two-node cluster's ``ray.nodes()`` as recorded on this machine, before and after its second node's raylet was
killed (trimmed to the fields the diagnosis reads). The real loss, through verl's dataflow, is
tests/e2e/test_two_nodes_on_cpu.py."""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest
import ray

from verl_pipe.trainers.lost_nodes import (
    LostNodeError,
    alive_nodes,
    dead_since,
    describe_lost_node,
    diagnosing_lost_nodes,
    awaits_a_ruling,
)

HEAD = {"NodeID": "8c1f" + "0" * 52, "Alive": True, "NodeManagerAddress": "192.0.2.2",
        "Resources": {"CPU": 8.0, "memory": 1e10, "object_store_memory": 1e9, "node:192.0.2.2": 1.0,
                      "node:__internal_head__": 1.0, "verl_pipe_trainer_node": 1000.0}}  # fmt: skip
SAMPLER = {"NodeID": "52d6767bd7150fc794aca75c96b246cf9426326ab25a90ef840d6070", "Alive": True,
           "NodeManagerAddress": "192.0.2.2",
           "Resources": {"CPU": 8.0, "memory": 1e10, "object_store_memory": 1e9, "node:192.0.2.2": 1.0,
                         "verl_pipe_sampler_node": 1000.0}}  # fmt: skip
# How the GCS reports it once its heartbeats stopped: no resources any more, a death reason.
SAMPLER_DEAD = {**SAMPLER, "Alive": False, "Resources": {}, "DeathReason": 2,
                "DeathReasonMessage": "health check failed due to missing too many heartbeats"}  # fmt: skip
HELD = Counter({"HFRolloutServer": 1, "CheckpointEngineWorker": 1, "AgentLoopWorker": 4, "RewardLoopWorker": 1})


def _tables(*tables):
    """A node table that answers with each of ``tables`` in turn, then the last one for ever."""
    answers = list(tables)
    return lambda: answers.pop(0) if len(answers) > 1 else answers[0]


@pytest.fixture
def saved_step_2(tmp_path):
    os.makedirs(tmp_path / "global_step_2")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    return str(tmp_path)


def test_the_custom_resources_are_kept_from_when_the_node_lived():
    views = alive_nodes(lambda: [HEAD, SAMPLER])
    assert views[SAMPLER["NodeID"]].custom_resources == ("verl_pipe_sampler_node",)
    assert views[HEAD["NodeID"]].custom_resources == ("verl_pipe_trainer_node",)
    assert alive_nodes(lambda: [HEAD, SAMPLER_DEAD]).keys() == {HEAD["NodeID"]}


def test_the_gcs_may_mark_the_node_dead_after_the_first_error():
    before = alive_nodes(lambda: [HEAD, SAMPLER])
    later = _tables([HEAD, SAMPLER], [HEAD, SAMPLER], [HEAD, SAMPLER_DEAD])
    [(node, reason)] = dead_since(before, wait_s=5.0, list_nodes=later, poll_s=0.0)
    assert node.node_id == SAMPLER["NodeID"] and "heartbeats" in reason
    assert dead_since(before, wait_s=0.0, list_nodes=lambda: [HEAD, SAMPLER]) == []


def test_the_errors_raised_before_ray_rules_on_a_silent_node():
    unreachable = ray.exceptions.ActorUnavailableError("unreachable", b"\0" * 16)
    assert awaits_a_ruling(unreachable)
    try:  # raised from it, as a replica manager re-raises
        raise RuntimeError("generation failed") from unreachable
    except RuntimeError as wrapped:
        assert awaits_a_ruling(wrapped)
    assert awaits_a_ruling(ray.exceptions.RayTaskError("generate", "traceback", unreachable))
    assert awaits_a_ruling(ray.exceptions.OwnerDiedError("00" * 28, "", "(call site)"))
    # ruled already: a dead actor (its node's death, if that was the cause, is in the node table), or no Ray error
    assert not awaits_a_ruling(ray.exceptions.ActorDiedError())
    assert not awaits_a_ruling(ray.exceptions.RayTaskError("generate", "traceback", ValueError("a bug")))
    assert not awaits_a_ruling(ValueError("data.train_batch_size must be positive"))


def test_the_error_names_the_node_its_role_the_actors_the_step_and_the_resume(saved_step_2, monkeypatch):
    monkeypatch.setenv("VERL_PIPE_POOL_NODES", "trainer=verl_pipe_trainer_node,sampler=verl_pipe_sampler_node")
    node = alive_nodes(lambda: [SAMPLER])[SAMPLER["NodeID"]]
    text = describe_lost_node(node, SAMPLER_DEAD["DeathReasonMessage"], HELD, 3, saved_step_2)
    assert text.startswith("Ray node 192.0.2.2 (id 52d6767b, resources verl_pipe_sampler_node: the sampler's node")
    assert "during step 3" in text and "missing too many heartbeats" in text
    assert "AgentLoopWorker x4, CheckpointEngineWorker x1, HFRolloutServer x1, RewardLoopWorker x1" in text
    assert f"resumes from {os.path.join(saved_step_2, 'global_step_2')}" in text
    fresh = describe_lost_node(node, "gone", Counter(), 1, os.path.join(saved_step_2, "nothing_saved"))
    assert "none known" in fresh and "no checkpoint was saved yet" in fresh


def test_an_error_that_came_with_a_lost_node_becomes_one_diagnosis(saved_step_2):
    unreachable = ray.exceptions.ActorUnavailableError("unreachable", b"\0" * 16)
    # alive at the start and when the error came, ruled dead a moment later
    later = _tables([HEAD, SAMPLER], [HEAD, SAMPLER], [HEAD, SAMPLER], [HEAD, SAMPLER_DEAD])
    with pytest.raises(LostNodeError, match=r"was lost during step 3 .* HFRolloutServer x1") as caught:
        with diagnosing_lost_nodes(lambda: 3, saved_step_2, wait_s=5.0, list_nodes=later, list_actors=lambda _: HELD):
            raise unreachable
    assert caught.value.__cause__ is unreachable, "Ray's error stays chained"
    # the control: without the wait for Ray's ruling the same loss goes by undiagnosed
    later = _tables([HEAD, SAMPLER], [HEAD, SAMPLER], [HEAD, SAMPLER], [HEAD, SAMPLER_DEAD])
    with pytest.raises(ray.exceptions.ActorUnavailableError):
        with diagnosing_lost_nodes(lambda: 3, saved_step_2, wait_s=0.0, list_nodes=later, list_actors=lambda _: HELD):
            raise unreachable
    # a dead actor comes after Ray's ruling: the node table already says so
    ruled = _tables([HEAD, SAMPLER], [HEAD, SAMPLER_DEAD])
    with pytest.raises(LostNodeError, match="was lost during step 3"):
        with diagnosing_lost_nodes(lambda: 3, saved_step_2, wait_s=0.0, list_nodes=ruled, list_actors=lambda _: HELD):
            raise ray.exceptions.ActorDiedError()


def test_control_an_error_with_every_node_alive_passes_through_unchanged(saved_step_2):
    alive = _tables([HEAD, SAMPLER])
    started = time.monotonic()
    with pytest.raises(ray.exceptions.ActorDiedError):  # a replica died, its node did not: not a lost node
        with diagnosing_lost_nodes(lambda: 3, saved_step_2, wait_s=30, list_nodes=alive, list_actors=lambda _: HELD):
            raise ray.exceptions.ActorDiedError()
    assert time.monotonic() - started < 5, "a dead actor on a live node is let through without waiting for Ray"
    with pytest.raises(ray.exceptions.ActorUnavailableError):  # unreachable for a while, its node never ruled dead
        with diagnosing_lost_nodes(lambda: 3, saved_step_2, wait_s=0.3, list_nodes=alive, list_actors=lambda _: HELD):
            raise ray.exceptions.ActorUnavailableError("unreachable", b"\0" * 16)
    with pytest.raises(ValueError, match="a bug"):
        with diagnosing_lost_nodes(lambda: 3, saved_step_2, list_nodes=alive, list_actors=lambda _: HELD):
            raise ValueError("a bug")
