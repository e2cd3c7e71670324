"""``minibatch_pipeline``: the trainer updates on minibatches of finished prompt groups while the rest generate.

verl-pipe's minibatch pipelining (the DeepCoder / rLLM thesis, §4.2) on verl's V1 trainer:
``trainer.v1.trainer_mode=minibatch_pipeline``.
Each iteration:

1. the iteration's ``data.train_batch_size`` prompts go to the sampler pool at once;
2. as soon as ``ppo_mini_batch_size`` prompt groups have finished, the trainer takes them (the longest finished
   groups first) and runs one optimizer step on them, while the sampler keeps generating the rest;
3. pi_old is the policy that generated the iteration: verl's ``DetachActorWorker`` snapshots it before the first
   minibatch and restores it to compute every later minibatch's old log-probs (verl-pipe patches the snapshot so
   it is a copy when parameters live in host memory);
4. after the last minibatch, the new weights go to the sampler through the checkpoint engine.

Unlike the original verl-pipe, no minibatch ever spills into the next iteration (checked every step), GRPO+'s
clip-high, overlong masking and IS correction apply to every minibatch (they live in verl's actor update, which
each minibatch goes through), and weights travel through verl's checkpoint engine, not the Ray object store.
"""

from __future__ import annotations

from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl_pipe.trainers.pipelined_trainer import PipelinedTrainer
from verl_pipe.trainers.config import PipelineConfigError


@register_trainer("minibatch_pipeline")
class MinibatchPipelineTrainer(PipelinedTrainer):
    MODE = "minibatch_pipeline"
    # The schedule, top to bottom: each hook of verl's V1 loop this mode overrides, in the order verl calls them
    # (trainer_base.fit -> step -> _step_once, once per minibatch), and what it does there.
    # tests/trainers/test_schedules_on_cpu.py holds this table to verl's loop and to the class.
    SCHEDULE = (
        ("on_train_begin", "nothing: no prefetch, each iteration generates its own prompts"),
        ("prepare_step", "submit the iteration's prompts (less those a resumed checkpoint restored)"),
        ("on_sample_begin", "the trainer waits for a minibatch of finished groups (on its timeline)"),
        ("on_sample_end", "train on them while the rest generate"),
        ("_balance_batch", "drop the samples the filters refuse, before any log-prob"),
        ("_update_actor", "skip an update left with nothing to train"),
        ("_save_checkpoint", "a failed save (a full disk) stops the run naming the disk; its partial folder goes"),
        ("on_step_end", "check nothing spills into the next iteration, then sync v_k"),
        ("on_validate_begin", "lend the trainer's cores to the sampler pool, which validates"),
        ("on_validate_end", "take them back"),
        ("_compute_metrics", "the step's ledger, staleness histogram and phase times"),
    )  # fmt: skip

    def parameter_sync_step_for(self, config) -> int:
        minibatches = config.data.train_batch_size // config.actor_rollout_ref.actor.ppo_mini_batch_size
        requested = config.trainer.v1.get(self.MODE, {}).get("parameter_sync_step", None)
        if requested not in (None, minibatches):
            raise PipelineConfigError(
                f"trainer.v1.{self.MODE}.parameter_sync_step={requested} contradicts data.train_batch_size / "
                f"actor_rollout_ref.actor.ppo_mini_batch_size = {minibatches}: leave it unset (it is derived)"
            )
        return minibatches

    def on_train_begin(self):
        return None  # no prefetch: each iteration generates exactly its own prompts

    def prepare_step(self) -> dict:
        # After a resume, prompts restored from the checkpoint already belong to this iteration.
        restored, self._restored_tq_prompt_count = self._restored_tq_prompt_count, 0
        missing = self.config.data.train_batch_size - restored
        if missing > 0:
            self._submit_tagged(self.global_steps, missing)
        return {}

    def on_step_end(self):
        if self.prev_step_profile:
            self._stop_rollout_profiling()
        left_in_flight = self.replay_buffer.inflight_count()
        left_ready = self.replay_buffer.ready_count()
        if left_in_flight or left_ready:
            raise RuntimeError(
                f"minibatch_pipeline step {self.global_steps}: {left_in_flight} prompt groups still generating and "
                f"{left_ready} finished but untrained after the last minibatch; they would spill into the next "
                "iteration under new weights"
            )
        self._sync_weights(self.global_steps)  # the iteration's updates are done: the weights are v_{step}
        self._phase(None)
