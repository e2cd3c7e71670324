"""``in_flight_pipeline``'s replay buffer: prompt groups trained by deadline, from a sampler that never drains.

Each prompt group is tagged (verl's ``global_steps`` prompt tag) with its *deadline*: the last step that may train
it without any of its tokens lagging more than the lag bound (:mod:`.ray_trainer_in_flight` sets it at
submission). A step takes whole finished groups, earliest deadline first, then the longest, one minibatch at a
time; its last minibatch waits while any group due at this step is still generating, so a long response is
waited for, never starved, and the step records it as held back. A group that a load between the step's updates
reached while it generated (a token newer than the step's pi_old: a lag below zero) comes last: the trainer holds
such a load until the groups already finished can fill the rest of the step (:mod:`.ray_trainer_in_flight`), so
the step takes those, and the newer group trains at a later step, whose pi_old is at least as new. A finished
group already past its deadline (none should be: the trainer admits no more prompts than the steps up to their
deadlines can train) is dropped, and counted.

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
        # Set by the trainer per minibatch: the version of the step's pi_old (frozen across its minibatches), which
        # no trained token may be newer than. None: no step has begun.
        self.trainer_version: float | None = None

    def _oldest_batch(self, partition_id, keys):
        return keys  # groups of any submission may train together; deadlines order them

    def due_in_flight(self, global_steps: int, partition_id: str) -> set[str]:
        """Groups due at ``global_steps`` or earlier that are still generating (as of the last TransferQueue read)."""
        steps = self.prompt_global_steps[partition_id]
        generating = self.pending_keys[partition_id] | self.running_keys[partition_id]
        return {uid for uid in generating if steps.get(uid, global_steps) <= global_steps}

    def newer_than_pi_old(self, partition_id: str = "train") -> set[str]:
        """Groups with a stored sample whose freshest token came from weights newer than the step's pi_old (as of the
        last TransferQueue read)."""
        if self.trainer_version is None:
            return set()
        return {key.split("_")[0] for key, tag in self.partitions[partition_id].items()
                if float(tag.get("max_global_steps", -1)) > self.trainer_version + 1e-9}  # fmt: skip

    def ready_for_this_step(self, partition_id: str = "train") -> int:
        """Finished groups not taken yet that the current step may train: none of their tokens is newer than its
        pi_old (as of the last TransferQueue read)."""
        return len(self.finished_keys[partition_id] - self.newer_than_pi_old(partition_id))

    def _selection_key(self, partition_id, steps, tokens):
        base = super()._selection_key(partition_id, steps, tokens)
        if partition_id == "val":
            return base
        # the groups too new for this step's pi_old last: taken only when nothing else can fill the minibatch
        newer = self.newer_than_pi_old(partition_id)
        return lambda uid: (uid in newer, *base(uid))

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
