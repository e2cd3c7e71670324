"""``VERL_PIPE_POOL_NODES`` on verl's real pool manager: the trainer's pools and the standalone replicas' pools ask
for their node's resource through verl's ``accelerator_type`` bundle entry; without the setting (the control) no
pool asks for any node; a malformed setting is named. (The placement itself, on two Ray nodes:
tests/e2e/test_two_nodes_on_cpu.py.)"""

from __future__ import annotations

import pytest

from verl_pipe.pool_nodes import POOL_NODES_ENV, _patch_pool_node_resources, pool_node_resources

SPEC = {"global_pool": [1], "rollout_pool_0": [1], "rollout_pool_1": [1]}


def _pools(monkeypatch) -> dict:
    from verl.single_controller.ray.base import ResourcePoolManager

    _patch_pool_node_resources()
    monkeypatch.setattr(ResourcePoolManager, "_check_resource_available", lambda self: None)  # needs a cluster
    manager = ResourcePoolManager(resource_pool_spec=dict(SPEC), mapping={})
    manager.create_resource_pool()
    return {name: pool.accelerator_type for name, pool in manager.resource_pool_dict.items()}


def test_each_pool_asks_for_its_roles_node(monkeypatch):
    monkeypatch.setenv(POOL_NODES_ENV, "trainer=node_a, sampler=node_b")
    assert _pools(monkeypatch) == {"global_pool": "node_a", "rollout_pool_0": "node_b", "rollout_pool_1": "node_b"}


def test_control_without_the_setting_no_pool_asks_for_a_node(monkeypatch):
    monkeypatch.delenv(POOL_NODES_ENV, raising=False)
    assert set(_pools(monkeypatch).values()) == {None}


def test_one_role_alone_places_only_that_role(monkeypatch):
    monkeypatch.setenv(POOL_NODES_ENV, "sampler=node_b")
    assert _pools(monkeypatch)["global_pool"] is None


@pytest.mark.parametrize("value", ["trainer", "learner=node_a", "trainer=", "trainer=node_a;sampler=node_b"])
def test_a_malformed_setting_is_named(value):
    with pytest.raises(ValueError, match=POOL_NODES_ENV):
        pool_node_resources(value)
