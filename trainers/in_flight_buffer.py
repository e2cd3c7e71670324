"""``in_flight_pipeline``'s replay buffer: prompt groups trained by deadline, from a sampler that never drains.

Each prompt group is tagged (verl's ``global_steps`` prompt tag) with its *deadline*: the last step that may train
it without any of its tokens lagging more than the lag bound (:mod:`.ray_trainer_in_flight` sets it at
submission). A step takes whole finished groups, earliest deadline first, then the longest, one minibatch at a
time; its last minibatch waits while any group due at this step is still generating, so a long response is
waited for, never starved, and the step records it as held back. A finished group already past its deadline
(none should be: the trainer admits no more prompts than the steps up to their deadlines can train) is dropped,
and counted.

verl builds it from its name in verl's custom-sampler slot (:mod:`.sampler_slot`); no trainer module imports it
(see :mod:`.replay_buffer`).
"""

from __future__ import annotations

from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl_pipe.trainers.replay_buffer import PipelineReplayBuffer


class InFlightReplayBuffer(PipelineReplayBuffer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Set by the trainer per minibatch: how many groups the step's later minibatches will still take. A
        # minibatch takes what is ready (due groups first) as long as the due groups it leaves fit in those.
        self.later_capacity = 0
        self.held_back: set[str] = set()  # groups a ready step waited for (due now, still generating)
        self.dropped: set[str] = set()  # finished groups evicted past their deadline

    def _oldest_batch(self, partition_id, keys):
        return keys  # groups of any submission may train together; deadlines order them

    def due_in_flight(self, global_steps: int, partition_id: str) -> set[str]:
        """Groups due at ``global_steps`` or earlier that are still generating (as of the last TransferQueue read)."""
        steps = self.prompt_global_steps[partition_id]
        generating = self.pending_keys[partition_id] | self.running_keys[partition_id]
        return {uid for uid in generating if steps.get(uid, global_steps) <= global_steps}

    def _has_enough_samples(self, global_steps, partition_id, batch_size, sampleable_keys):
        if partition_id == "val":
            return ReplayBufferAsync._has_enough_samples(self, global_steps, partition_id, batch_size, sampleable_keys)
        enough = len(sampleable_keys) >= batch_size
        due = self.due_in_flight(global_steps, partition_id)
        steps = self.prompt_global_steps[partition_id]
        due_ready = sum(1 for uid in sampleable_keys if steps.get(uid, global_steps) <= global_steps)
        left_due = len(due) + max(0, due_ready - batch_size)  # what this minibatch leaves to the later ones
        if enough and left_due > self.later_capacity:
            self.held_back |= due
            return False
        return enough

    def _stale_terminal_keys(self, global_steps, partition_id):
        if partition_id == "val":
            return set()
        steps = self.prompt_global_steps[partition_id]
        late = {uid for uid in self.finished_keys[partition_id] if steps.get(uid, global_steps) < global_steps}
        self.dropped |= late
        return late

    def take_counts(self) -> dict[str, int]:
        """Groups held back and dropped since the last call (the trainer logs them per step)."""
        counts = {"held_back_groups": len(self.held_back), "dropped_groups": len(self.dropped)}
        self.held_back, self.dropped = set(), set()
        return counts
