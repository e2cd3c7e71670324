"""The pipelined modes' replay buffer: verl's async one, polling fast and handing out whole batches in order.

verl builds it from its name in verl's custom-sampler slot (:mod:`.sampler_slot`), and no trainer module imports
it: importing it imports verl's V1 trainer package, whose import hook loads the trainer modules, so an import of
this module among them would be circular.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable, Optional

from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl_pipe.trainers.config import PipelineConfig
from verl_pipe.trainers.dynamic_sampling import DroppedGroup, DynamicSampling
from verl_pipe.trainers.stall_watch import StallWatch
from verl_pipe.trainers.step_ledger import prompt_ids_by_uid

logger = logging.getLogger("verl_pipe")


class PipelineReplayBuffer(ReplayBufferAsync):
    """verl's async replay buffer, polling fast, batch by batch, and handing out the longest finished groups first.

    * Polling: every ``trainer.v1.<mode>.poll_interval_s`` (verl's buffer waits 2 s per poll), read from the
      ``trainer_config`` verl passes (its ``trainer.v1.<mode>`` section).
    * Batch by batch: only groups of the oldest batch still known (lowest ``global_steps`` tag) are handed out,
      so a group of a prefetched batch that happens to finish early never fills the current batch.
    * Longest-ready-first (verl-pipe's minibatch schedule): among the ready groups, the ones with the most
      response tokens train first, so the long tail of a batch overlaps the training of the short groups that
      finished before it rather than the other way round.
    * ``on_poll`` (set by a trainer) runs between polls while the trainer waits for samples, on the snapshot
      just read: one-off pipelining syncs the sampler there as soon as the batch in flight has generated.
    * A stall watch (:mod:`.stall_watch`): a wait in which no group finishes and no sample is stored for
      ``trainer.v1.<mode>.stall_timeout_s``, a dead actor of the sampler's (looked for every few seconds of
      waiting and at once when a group fails), or ``trainer.v1.<mode>.max_failed_groups_in_a_row`` groups failed
      with none finished raises, naming what it waited for and what the sampler holds; ``describe_sampler`` (set
      by a trainer) adds how the sampler's actors answer, and the likely cause.
    * Dynamic sampling (``dynamic_sampling``, set by a trainer with ``algorithm.filter_groups`` on, together with
      verl's ``filter_groups_metric``): verl's own drop-and-refill of uniform groups, within the step's budget,
      each dropped group's dataset row recorded (:mod:`.dynamic_sampling`).
    """

    on_poll = None  # callable(partition_id) -> None
    # () -> (what the sampler's actors answer, the cause and fix when that names one, else None)
    describe_sampler: Optional[Callable[[], tuple[str, Optional[str]]]] = None
    find_dead_actor: Optional[Callable[[], bool]] = None  # () -> whether an actor of the sampler's is dead (quick)
    dynamic_sampling: Optional[DynamicSampling] = None
    # The batch tag of each group the last eviction pass removed, in uid order: verl calls ``refill_fn`` with their
    # count right after, and a mode whose batches overlap (one_off_pipeline) refills each into its own batch.
    last_evicted_tags: list[int] = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        cfg = PipelineConfig.from_section(self.trainer_mode, self.trainer_config)
        self.poll_interval = cfg.poll_interval_s
        self._stall_watch = StallWatch(cfg.stall_timeout_s, max_failed_in_a_row=cfg.max_failed_groups_in_a_row)
        self._finished_before: set[str] = set()  # the finished groups of the last TransferQueue read
        self._waiting_for: tuple[int, int] = (0, 0)  # (step, groups) of the current wait, for the diagnosis
        self._evicted_while_waiting = 0

    def _oldest_batch(self, partition_id, keys):
        steps = self.prompt_global_steps[partition_id]
        if partition_id == "val" or not steps:
            return keys
        oldest = min(steps.values())
        return {uid for uid in keys if steps.get(uid) == oldest}

    def _has_enough_samples(self, global_steps, partition_id, batch_size, sampleable_keys):
        oldest = self._oldest_batch(partition_id, sampleable_keys)
        return super()._has_enough_samples(global_steps, partition_id, batch_size, oldest)

    def wait_for_sampleable(self, global_steps, partition_id, target_count):
        self._stall_watch.start()
        self._waiting_for = (global_steps, target_count)
        self._evicted_while_waiting = 0
        return super().wait_for_sampleable(global_steps, partition_id, target_count)

    def _terminal_eviction_reasons(self, global_steps, partition_id):
        stale, uniform, failed, counts = super()._terminal_eviction_reasons(global_steps, partition_id)
        if self.dynamic_sampling is not None and uniform:
            allowed = self.dynamic_sampling.within_budget(uniform, self.prompt_global_steps[partition_id])
            if allowed != uniform:  # the rest are kept, and trained as they are
                cache = self._dapo_classification_cache[partition_id]
                uniform, counts = allowed, Counter(cache[uid] for uid in allowed)
        return stale, uniform, failed, counts

    def _evict_terminal_groups(self, global_steps, partition_id, eviction_reasons):
        uniform = eviction_reasons[1]
        if self.dynamic_sampling is not None and uniform:
            self._record_uniform_drops(partition_id, uniform)  # before verl clears them from TransferQueue
        # the batch tags of the groups about to go (verl clears them); called on every poll, mostly with none
        steps = self.prompt_global_steps[partition_id]
        tags = {uid: steps.get(uid, global_steps) for uid in set().union(*eviction_reasons[:3])}
        finished = set(self.finished_keys[partition_id])
        if finished - self._finished_before:
            self._stall_watch.group_finished()
        self._finished_before = finished
        evicted = super()._evict_terminal_groups(global_steps, partition_id, eviction_reasons)
        self.last_evicted_tags = [int(tags.get(uid, global_steps)) for uid in sorted(evicted[0])]
        self._evicted_while_waiting += len(evicted[0]) - len(uniform)  # failed (or stale) groups, replaced
        failed = len(eviction_reasons[2] & set(evicted[0]))
        # verl replaces each failed group and moves on: a dead actor would fail its replacements for ever
        self._stall_watch.groups_failed(failed, lambda s, dead: self._stall_diagnosis(partition_id, s, dead),
                                        lambda n: self._failure_diagnosis(partition_id, n),
                                        self._an_actor_is_dead)  # fmt: skip
        return evicted

    def _record_uniform_drops(self, partition_id: str, uniform: set[str]) -> None:
        keys = [key for key in self.partitions[partition_id] if key.split("_")[0] in uniform]
        try:
            prompts = prompt_ids_by_uid(keys, partition_id)
        except Exception:  # noqa: BLE001 - data without an index column: the ledger names prompts by uid
            prompts = {}
        cache, tags = self._dapo_classification_cache[partition_id], self.prompt_global_steps[partition_id]
        tokens: Counter = Counter()
        for key, tag in self.partitions[partition_id].items():
            tokens[key.split("_")[0]] += int(tag.get("response_len", 0))
        dropped = [DroppedGroup(prompts.get(uid, uid), float(cache[uid]), int(tags.get(uid, 0)), tokens[uid])
                   for uid in sorted(uniform)]  # fmt: skip
        for warning in self.dynamic_sampling.record_drops(dropped):
            logger.warning(warning)

    def _wait_for_next_poll(self, partition_id, last_debug_time):
        describe = lambda seconds, dead: self._stall_diagnosis(partition_id, seconds, dead)  # noqa: E731
        self._stall_watch.observe(self._progress(partition_id), describe, self._an_actor_is_dead)
        if self.on_poll is not None:
            self.on_poll(partition_id)
        return super()._wait_for_next_poll(partition_id, last_debug_time)

    def _progress(self, partition_id: str) -> tuple:
        """What changes whenever the sampler produces something (on the snapshot just read): a group finished, or
        one more sample of a live group stored. Groups submitted, started or failed are not progress: with a dead
        replica or reward worker verl's buffer evicts each failed group and submits a new one, round after round,
        and nothing ever finishes. Nor is a key TransferQueue lists without a sample's tag: a group being cleared
        or submitted shows its prompt keys with empty tags for a moment, and counting them (as the count of keys
        listed did) made every such round look like progress (``make chaos --faults reward_kill`` hung there)."""
        live = self.pending_keys[partition_id] | self.running_keys[partition_id] | self.finished_keys[partition_id]
        samples = frozenset(key for key, tag in self.partitions[partition_id].items()
                            if tag.get("status") == "success" and key.split("_")[0] in live)  # fmt: skip
        return frozenset(self.finished_keys[partition_id]), samples

    def _an_actor_is_dead(self) -> bool:
        """Whether the trainer's quick look at the sampler's actors finds one dead (asked every few seconds of
        waiting, so it must be quick; the diagnosis then asks ``describe_sampler`` for the details)."""
        if self.find_dead_actor is None:
            return False
        try:
            return self.find_dead_actor()
        except Exception:  # noqa: BLE001 - cannot tell: the full timeout decides
            return False

    def _stall_diagnosis(self, partition_id: str, stalled_s: float, found_dead: bool = False) -> str:
        step, groups = self._waiting_for
        what = "validation" if partition_id == "val" else f"step {step}"
        counts = {name: len(getattr(self, f"{name}_keys")[partition_id])
                  for name in ("pending", "running", "finished", "failure")}  # fmt: skip
        facts, cause = self._sampler_facts()
        cause = cause or (
            "A rollout engine is stuck or gone (paused, a request hanging in it, its process dead). Fix: read the "
            "rollout servers' logs (`ray logs`, or the session's logs folder), and resume from the last checkpoint "
            "once the replicas are healthy (trainer.resume_mode=auto)"
        )
        held = (f"TransferQueue holds {counts['pending']} pending, {counts['running']} running, {counts['finished']} "
                f"finished and {counts['failure']} failed groups")  # fmt: skip
        replaced = f"{self._evicted_while_waiting} failed groups were dropped and replaced during the wait"
        if found_dead:
            return (
                f"{self.trainer_mode}: an actor of the sampler's died while the trainer waited for {groups} prompt "
                f"groups of {what} (the last progress {stalled_s:.0f} s ago). {held}; {replaced}.{facts} {cause}."
            )
        return (
            f"{self.trainer_mode}: the sampler made no progress for {stalled_s:.0f} s while the trainer waited for "
            f"{groups} prompt groups of {what}. {held}; no group finished and no sample was stored in that time, and "
            f"{replaced}.{facts} {cause}; if one generation legitimately takes longer, raise "
            f"trainer.v1.{self.trainer_mode}.stall_timeout_s."
        )

    def _failure_diagnosis(self, partition_id: str, failed: int) -> str:
        step, groups = self._waiting_for
        what = "validation" if partition_id == "val" else f"step {step}"
        facts, cause = self._sampler_facts()
        cause = cause or (
            "Every group fails while the sampler's actors are alive: the rollout or the reward raises on every "
            "sample (the agent-loop workers' log has each failure's traceback: `ray logs`, or the session's logs "
            "folder). Fix its cause, and resume from the last checkpoint (trainer.resume_mode=auto)"
        )
        return (
            f"{self.trainer_mode}: {failed} prompt groups failed in a row while the trainer waited for {groups} "
            f"prompt groups of {what}, and none finished in between; verl drops each failed group and submits "
            f"another, so this would go on for ever.{facts} {cause}; if some failures are expected, raise "
            f"trainer.v1.{self.trainer_mode}.max_failed_groups_in_a_row (null: no bound)."
        )

    def _sampler_facts(self) -> tuple[str, Optional[str]]:
        """What ``describe_sampler`` says of the actors (with a leading space), and the cause it names, if any."""
        if self.describe_sampler is None:
            return "", None
        try:
            facts, cause = self.describe_sampler()
            return f" {facts}", cause
        except Exception as error:  # noqa: BLE001 - the diagnosis must not hide the stall
            return f" The sampler's actors could not be asked ({type(error).__name__}: {error}).", None

    def _select_prompt_uids(self, partition_id, sampleable_keys, batch_size):
        sampleable_keys = self._oldest_batch(partition_id, sampleable_keys)
        steps = dict(self.prompt_global_steps[partition_id])
        partition = dict(self.partitions[partition_id])
        tokens: Counter = Counter()
        for key, tag in partition.items():
            tokens[key.split("_")[0]] += int(tag.get("response_len", 0))
        ordered = sorted(sampleable_keys, key=self._selection_key(partition_id, steps, tokens))
        selected = ordered[:batch_size]
        if self.dynamic_sampling is not None:  # uniform groups past the step's refill budget, trained as they are
            cache = self._dapo_classification_cache[partition_id]
            self.dynamic_sampling.kept_uniform += sum(cache.get(uid) is not None for uid in selected)
        return selected, partition, steps

    def _selection_key(self, partition_id: str, steps: dict, tokens: Counter):
        """The order in which a minibatch takes ready groups: its batch's tag first, then the most response tokens."""
        return lambda uid: (steps.get(uid, 0), -tokens[uid], uid)

    def inflight_count(self, partition_id: str = "train") -> int:
        """Prompt groups submitted and not yet finished (re-reads TransferQueue)."""
        self._sync_metadata_from_transfer_queue()
        return len(self.pending_keys[partition_id]) + len(self.running_keys[partition_id])

    def ready_count(self, partition_id: str = "train") -> int:
        """Finished prompt groups not yet sampled by the trainer (as of the last re-read)."""
        return len(self.finished_keys[partition_id]) + len(self.failure_keys[partition_id])
