"""The pipelined modes' replay buffer: verl's async one, polling fast and handing out whole batches in order.

verl builds it from its name in verl's custom-sampler slot (:mod:`.sampler_slot`), and no trainer module imports
it: importing it imports verl's V1 trainer package, whose import hook loads the trainer modules, so an import of
this module among them would be circular.
"""

from __future__ import annotations

from collections import Counter

from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl_pipe.trainers.config import PipelineConfig


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
    """

    on_poll = None  # callable(partition_id) -> None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.poll_interval = PipelineConfig.from_section(self.trainer_mode, self.trainer_config).poll_interval_s

    def _oldest_batch(self, partition_id, keys):
        steps = self.prompt_global_steps[partition_id]
        if partition_id == "val" or not steps:
            return keys
        oldest = min(steps.values())
        return {uid for uid in keys if steps.get(uid) == oldest}

    def _has_enough_samples(self, global_steps, partition_id, batch_size, sampleable_keys):
        oldest = self._oldest_batch(partition_id, sampleable_keys)
        return super()._has_enough_samples(global_steps, partition_id, batch_size, oldest)

    def _wait_for_next_poll(self, partition_id, last_debug_time):
        if self.on_poll is not None:
            self.on_poll(partition_id)
        return super()._wait_for_next_poll(partition_id, last_debug_time)

    def _select_prompt_uids(self, partition_id, sampleable_keys, batch_size):
        sampleable_keys = self._oldest_batch(partition_id, sampleable_keys)
        steps = dict(self.prompt_global_steps[partition_id])
        partition = dict(self.partitions[partition_id])
        tokens: Counter = Counter()
        for key, tag in partition.items():
            tokens[key.split("_")[0]] += int(tag.get("response_len", 0))
        ordered = sorted(sampleable_keys, key=lambda uid: (steps.get(uid, 0), -tokens[uid], uid))
        return ordered[:batch_size], partition, steps

    def inflight_count(self, partition_id: str = "train") -> int:
        """Prompt groups submitted and not yet finished (re-reads TransferQueue)."""
        self._sync_metadata_from_transfer_queue()
        return len(self.pending_keys[partition_id]) + len(self.running_keys[partition_id])

    def ready_count(self, partition_id: str = "train") -> int:
        """Finished prompt groups not yet sampled by the trainer (as of the last re-read)."""
        return len(self.finished_keys[partition_id]) + len(self.failure_keys[partition_id])
