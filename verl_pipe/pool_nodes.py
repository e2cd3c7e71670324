"""Pools placed on named Ray nodes: the trainer pool on one node, the sampler pool on another.

verl places each resource pool with placement groups of CPU (here) or GPU bundles, and on a cluster of several
nodes a pool lands wherever its bundles fit first. To run the pools on different nodes (a two-node cluster on one
machine, as the tests do, or nodes of different kinds), give each node a custom resource (``ray start
--resources='{"trainer_node": 1000}'``) and name it per pool::

    VERL_PIPE_POOL_NODES=trainer=trainer_node,sampler=sampler_node

(in the job's environment: ``+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PIPE_POOL_NODES=...``). The sampler's
pools are the standalone rollout replicas' (``rollout_pool_*``), the trainer's every other pool. Each pool's bundles
then ask for a sliver of its node's resource, through verl's own ``accelerator_type`` bundle entry.
"""

from __future__ import annotations

import os
import re

from verl_pipe.patching import fired, is_patched
from verl_pipe.patching import mark_patched as _mark

POOL_NODES_ENV = "VERL_PIPE_POOL_NODES"
SAMPLER_POOL_PREFIX = "rollout_pool_"  # verl's name for a standalone replica's pool (RolloutReplica.init_standalone)
ROLES = ("trainer", "sampler")
RESOURCE_NAME = re.compile(r"[A-Za-z0-9_.:-]+")


def pool_node_resources(value: str | None = None) -> dict[str, str]:
    """``{"trainer": resource, "sampler": resource}`` from ``VERL_PIPE_POOL_NODES`` (either may be left out)."""
    value = os.environ.get(POOL_NODES_ENV, "") if value is None else value
    placement = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        role, _, resource = item.partition("=")
        if role.strip() not in ROLES or not RESOURCE_NAME.fullmatch(resource.strip()):
            raise ValueError(
                f"{POOL_NODES_ENV}={value!r}: expected trainer=<node resource>,sampler=<node resource> (the custom "
                f"resources given to `ray start --resources`), got {item!r}"
            )
        placement[role.strip()] = resource.strip()
    return placement


def role_of_pool(pool_name: str) -> str:
    return "sampler" if pool_name.startswith(SAMPLER_POOL_PREFIX) else "trainer"


def _patch_pool_node_resources() -> None:
    from verl.single_controller.ray import base

    original = base.ResourcePoolManager.create_resource_pool
    if is_patched(original):
        return

    @_mark(original)
    def create_resource_pool(self):
        placement = pool_node_resources()
        original(self)
        if not placement:
            return
        fired("pool_node_resources")
        # The pools make their placement groups on first use, after this: each bundle then asks for the resource.
        for name, pool in self.resource_pool_dict.items():
            resource = placement.get(role_of_pool(name))
            if resource is not None:
                pool.accelerator_type = resource

    base.ResourcePoolManager.create_resource_pool = create_resource_pool
