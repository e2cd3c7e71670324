"""A lost Ray node, diagnosed: one error naming the node, what ran on it, the step and how to resume.

When a node of the cluster goes (its machine or its raylet dies), every actor on it dies with it, and the trainer
sees whatever Ray raises first: an ``ActorUnavailableError`` naming an actor id, an ``ActorDiedError`` from a
rollout server, a failed TransferQueue call. None says that a node was lost, which one, or what to do. The GCS marks
the node dead once it has missed its heartbeats (about 15 s on Ray's defaults); until then an actor on it is only
unreachable. So :func:`diagnosing_lost_nodes` waits up to ``wait_s`` for the GCS's ruling when the error is one Ray
raises before that ruling (an unreachable actor, a lost object), and otherwise reads the node table once (an
``ActorDiedError`` comes after the ruling on its actor, and so on its node); it raises :class:`LostNodeError` (the
original error chained) if a node alive at the start is gone, and lets the error through unchanged if none is.

It runs in two places. In the pipelined trainers (inside verl's TaskRunner actor), where it knows the step. And in
the driver of every ``python -m verl.trainer.main_ppo`` run (:func:`_patch_run_ppo`), which outlives any other
node, for verl's own modes and for a TaskRunner that was itself on the lost node; there the step is not known. The
same patch places the TaskRunner on the trainer's node when ``VERL_PIPE_POOL_NODES`` names one (verl places it on
any node, and a TaskRunner lost with the sampler's node takes the trainer's diagnosis with it), and at the driver's
exit removes the shared-memory segments the run's killed processes left (:mod:`verl_pipe.shm`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import ray

from verl_pipe.pool_nodes import POOL_NODES_ENV, pool_node_resources
from verl_pipe.shm import remove_orphans_at_exit
from verl_pipe.patching import fired, is_patched
from verl_pipe.patching import mark_patched as _mark

logger = logging.getLogger("verl_pipe")

# Ray's own resources on every node; what is left are the custom ones a pool can be placed by.
_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory", "node:", "accelerator_type:")


# What Ray raises before its GCS has ruled a silent node dead: an actor it cannot reach, an object whose owner or
# every copy is gone, a node it knows died.
UNRULED_ERRORS = (
    ray.exceptions.ActorUnavailableError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.NodeDiedError,
)


class LostNodeError(RuntimeError):
    """A Ray node that held part of the run was lost; the run cannot go on without what ran there."""


@dataclass(frozen=True)
class NodeView:
    node_id: str
    address: str
    custom_resources: tuple[str, ...]  # a dead node reports none, so they are taken while it lives


def awaits_a_ruling(error: BaseException) -> bool:
    """Whether ``error``, an error it was raised from, or the cause a ``RayTaskError`` carries, is one of
    :data:`UNRULED_ERRORS` (then a lost node may not be in the node table yet)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UNRULED_ERRORS):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__ or getattr(error, "cause", None)
    return False


def alive_nodes(list_nodes: Callable[[], list[dict]] = ray.nodes) -> dict[str, NodeView]:
    views = {}
    for node in list_nodes():
        if node.get("Alive"):
            custom = tuple(sorted(r for r in node.get("Resources", {}) if not r.startswith(_BUILTIN_RESOURCES)))
            views[node["NodeID"]] = NodeView(node["NodeID"], node.get("NodeManagerAddress", "?"), custom)
    return views


def dead_since(
    before: dict[str, NodeView], wait_s: float, list_nodes: Callable[[], list[dict]] = ray.nodes, poll_s: float = 0.5
) -> list[tuple[NodeView, str]]:
    """The nodes of ``before`` the GCS now reports dead (``list_nodes``: Ray's node table), with its reason; waits up
    to ``wait_s`` for one."""
    deadline = time.monotonic() + wait_s
    while True:
        dead = [
            (before[node["NodeID"]], node.get("DeathReasonMessage") or "no reason given")
            for node in list_nodes()
            if node["NodeID"] in before and not node.get("Alive")
        ]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(poll_s)


def actors_on(node_id: str) -> Counter:
    """How many actors of each class this job had on the node (alive or dead), from the GCS's actor table."""
    try:
        from ray._private.state import actors  # the GCS table, which needs no dashboard (the state API does)

        table, job = actors(), ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - a private reader: without it the error still names the node
        return Counter()
    return Counter(
        info.get("ActorClassName", "?").rsplit(".", 1)[-1]
        for info in table.values()
        if (info.get("Address") or {}).get("NodeID") == node_id and info.get("JobID") == job
    )


def describe_lost_node(
    node: NodeView, reason: str, held: Counter, step: int | None, checkpoint_dir: str, placement: dict | None = None
) -> str:
    """The error's text; ``placement``: ``VERL_PIPE_POOL_NODES`` parsed (default: this process's)."""
    # (imported here: the driver loads this module while verl is still importing, before it has picked a platform)
    from verl_pipe.trainers.checkpoint_guard import resume_advice

    placement = pool_node_resources() if placement is None else placement
    roles = [f"the {role}'s node" for role, res in placement.items() if res in node.custom_resources]
    resources = f", resources {', '.join(node.custom_resources)}" if node.custom_resources else ""
    what = f": {'; '.join(roles)} in VERL_PIPE_POOL_NODES" if roles else ""
    actors = ", ".join(f"{name} x{count}" for name, count in sorted(held.items())) or "none known"
    return (
        f"Ray node {node.address} (id {node.node_id[:8]}{resources}{what}) was lost "
        f"{'during the run' if step is None else f'during step {step}'} (Ray: "
        f"{reason}). The actors on it died with it: {actors}. The run cannot go on without them. Bring the node back "
        f"(or add one with the same resources) and rerun the same command: {resume_advice(checkpoint_dir)}"
    )


@contextlib.contextmanager
def diagnosing_lost_nodes(
    step: Callable[[], int],
    checkpoint_dir: str,
    wait_s: float = 30.0,
    list_nodes: Callable[[], list[dict]] = ray.nodes,
    list_actors: Callable[[str], Counter] = actors_on,
    placement: dict | None = None,
    before: dict[str, NodeView] | None = None,
):
    """Run the trainer's loop inside; an error that came with the loss of a node becomes :class:`LostNodeError`.
    ``before``: the nodes alive at the start (default: those alive now)."""
    before = alive_nodes(list_nodes) if before is None else before
    try:
        yield
    except Exception as error:
        if is_diagnosed(error):
            raise
        waiting = awaits_a_ruling(error) and bool(before)
        if waiting:
            logger.warning("verl-pipe: %s; waiting up to %.0f s for Ray to tell whether a node was lost",
                           type(error).__name__, wait_s)  # fmt: skip
        lost = dead_since(before, wait_s if waiting else 0.0, list_nodes)
        if not lost:
            raise
        node, reason = lost[0]
        text = describe_lost_node(node, reason, list_actors(node.node_id), step(), checkpoint_dir, placement)
        raise LostNodeError(text) from error


def is_diagnosed(error: BaseException) -> bool:
    """Whether ``error`` is a :class:`LostNodeError` already (as the driver gets the trainer's, in a RayTaskError)."""
    return isinstance(error, LostNodeError) or isinstance(getattr(error, "cause", None), LostNodeError)


# --- the driver ------------------------------------------------------------------------------------------------


def driver_pool_nodes(config) -> dict[str, str]:
    """``VERL_PIPE_POOL_NODES`` as the run's workers get it: the job's runtime_env, else the driver's environment."""
    env_vars = config.get("ray_kwargs", {}).get("ray_init", {}).get("runtime_env", {}).get("env_vars", {}) or {}
    return pool_node_resources(str(env_vars.get(POOL_NODES_ENV, os.environ.get(POOL_NODES_ENV, ""))))


class PlacedActorClass:
    """A Ray actor class whose instances ask for a sliver of a custom resource (so they land on the node that has
    it), and which notes the cluster's nodes as it creates one (Ray is up by then)."""

    SLIVER = 0.001  # of a resource the node sets to 1000: any number of such actors fit

    def __init__(self, actor_class, resource: str | None, on_create: Callable[[], None]):
        self._actor_class, self._resource, self._on_create = actor_class, resource, on_create

    def options(self, **options):
        self._on_create()
        if self._resource is not None:
            options["resources"] = {**(options.get("resources") or {}), self._resource: self.SLIVER}
        return self._actor_class.options(**options)

    def remote(self, *args, **kwargs):
        return self.options().remote(*args, **kwargs)


def run_ppo_diagnosed(run_ppo: Callable) -> Callable:
    """verl's ``run_ppo`` with its TaskRunner on the trainer's node (when one is named) and lost nodes diagnosed;
    at the driver's exit, the shared-memory segments the run's killed processes left are removed."""

    def run(config, task_runner_class):
        remove_orphans_at_exit()
        placement = driver_pool_nodes(config)
        nodes_at_start: dict[str, NodeView] = {}

        def note_nodes() -> None:
            nodes_at_start.update(alive_nodes())

        placed = PlacedActorClass(task_runner_class, placement.get("trainer"), note_nodes)
        checkpoint_dir = os.path.abspath(str(config.trainer.default_local_dir))
        fired("driver_run_ppo")
        with diagnosing_lost_nodes(lambda: None, checkpoint_dir, placement=placement, before=nodes_at_start):
            return run_ppo(config, placed)

    return run


def _patch_run_ppo() -> None:
    """Wrap the entrypoint's ``run_ppo``. ``python -m verl.trainer.main_ppo`` runs it as ``__main__``, which no import
    hook sees: the hook is verl's ``validate_config``, which ``main`` calls just before ``run_ppo``, once
    ``__main__`` has defined it."""
    from verl.utils import config as verl_config

    original = verl_config.validate_config
    if is_patched(original):
        return

    @_mark(original)
    def validate_config(*args, **kwargs):
        result = original(*args, **kwargs)
        entrypoint = sys.modules.get("__main__")
        run_ppo = getattr(entrypoint, "run_ppo", None)
        if callable(run_ppo) and not is_patched(run_ppo):
            entrypoint.run_ppo = _mark(run_ppo)(run_ppo_diagnosed(run_ppo))
        return result

    verl_config.validate_config = validate_config
