"""Which prompt groups have finished *generating*, while their rewards may still be running.

verl's TransferQueue status of a prompt group turns ``finished`` only once every session of the group has been
generated *and* scored. ``one_off_pipeline`` syncs the sampler between two batches, and every request of the
batch in flight must have ended first (a sync in the middle of a request would mix two policies in one sample).
Waiting for the ``finished`` status puts the slowest reward of the batch on the sampler's critical path: the
next batch could start as soon as the last request has *generated*. verl has no signal for that (its load
balancer's in-flight count reads 0 while a session is still being tokenized, which is a race), so:

* each agent-loop worker reports a session when post-processing asks for its reward, after its last turn (a
  version-guarded wrap of ``AgentLoopWorker._compute_score``, :mod:`.patches`; validation sessions count too,
  under their own uids, and are never asked about);
* the reports go to one small actor per run (:class:`GenerationCounter`, ``num_cpus=0``), named in
  ``trainer.v1.<mode>.generation_counter`` by the trainer before verl builds the workers;
* the trainer asks it about the groups TransferQueue lists as running: when none is pending and each running
  one has reported ``rollout.n`` sessions, no request of any submitted batch is left in a server.

The counts of a batch in flight only grow (the trainer forgets only batches it has trained) and prompts are
submitted only from the trainer's own thread, so the check cannot pass early. A session that fails, or a report
that is lost, only delays the sync: the trainer then waits for the terminal status, as without the counter.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter, defaultdict
from typing import Any, Iterable, Optional

import ray

logger = logging.getLogger("verl_pipe")

CONFIG_KEY = "generation_counter"  # trainer.v1.<mode>.generation_counter: the actor's name (set by the trainer)


@ray.remote(num_cpus=0)
class GenerationCounter:
    """Sessions that finished generating, per prompt uid, grouped by the batch tag that trains them."""

    def __init__(self):
        self._sessions: dict[int, Counter] = defaultdict(Counter)

    def add(self, tag: int, uid: str) -> None:
        self._sessions[int(tag)][uid] += 1

    def sessions(self, uids: list[str]) -> list[int]:
        return [sum(by_uid.get(uid, 0) for by_uid in self._sessions.values()) for uid in uids]

    def forget_before(self, tag: int) -> None:
        """Drop the counts of batches tagged below ``tag`` (trained: they are never asked about again)."""
        for old in [t for t in self._sessions if t < tag]:
            del self._sessions[old]


# --- worker side: called by the wrapped agent-loop post-processing ------------------------------------------------

_HANDLES: dict[str, Any] = {}
_WARNED: set[str] = set()


def counter_name(config: Any) -> Optional[str]:
    """The run's counter actor named in ``config`` (the whole trainer config), or None when no trainer asked."""
    v1 = config.trainer.get("v1") or {}
    section = v1.get(v1.get("trainer_mode", "")) or {}
    return section.get(CONFIG_KEY) or None


def report_generated(config: Any, session: dict) -> None:
    """Tell the run's counter that one session (the agent loop's keyword arguments) finished generating."""
    name = counter_name(config)
    uid = session.get("uid")
    if name is None or uid is None:
        return
    try:
        handle = _HANDLES.get(name)
        if handle is None:
            handle = _HANDLES[name] = ray.get_actor(name)
        handle.add.remote(int(session.get("global_steps", -1)), str(uid))  # fire and forget
    except Exception as error:  # noqa: BLE001 - a lost report only costs the early sync, never the sample
        if name not in _WARNED:
            _WARNED.add(name)
            logger.warning(
                "verl-pipe: cannot report generated sessions to %s (%s: %s); one_off_pipeline will sync only when "
                "whole groups have finished",
                name,
                type(error).__name__,
                error,
            )


# --- trainer side ----------------------------------------------------------------------------------------------


class GenerationWatch:
    """The trainer's view of the counter: has every submitted request finished generating?"""

    def __init__(self, samples_per_prompt: int):
        self.name = f"verl_pipe_generation_counter_{uuid.uuid4().hex[:12]}"
        self.samples_per_prompt = samples_per_prompt
        self.actor = GenerationCounter.options(name=self.name).remote()
        self.enabled = True

    def all_generated(self, pending: Iterable[str], running: Iterable[str]) -> bool:
        """True when no prompt is pending and every running prompt has generated all its sessions.

        ``pending`` / ``running``: TransferQueue's prompt statuses, read after the last submission.
        """
        if not self.enabled or any(True for _ in pending):
            return False
        running = sorted(running)
        if not running:
            return True
        counts = ray.get(self.actor.sessions.remote(running))
        if max(counts) > self.samples_per_prompt:
            # A prompt ran more sessions than rollout.n (a per-prompt __rollout_n__): the count cannot tell
            # when such a group is done, so only the terminal status is trusted from now on.
            self.enabled = False
            logger.warning(
                "verl-pipe: a prompt group ran %d sessions with actor_rollout_ref.rollout.n=%d; one_off_pipeline "
                "now syncs only when whole groups have finished (rewards included)",
                max(counts),
                self.samples_per_prompt,
            )
            return False
        return min(counts) >= self.samples_per_prompt

    def forget_before(self, tag: int) -> None:
        self.actor.forget_before.remote(tag)
