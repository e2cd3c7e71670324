"""What both pipelined trainer modes share, on top of verl's ``separate_async`` trainer.

verl's ``PPOTrainerSeparateAsync`` already runs a standalone sampler pool beside the trainer pool, streams
finished prompt groups through TransferQueue, keeps pi_old fixed across minibatches (``DetachActorWorker``) and
syncs weights through a checkpoint engine. The pipelined modes keep all of that and add:

* start-up checks that name the key and the fix (hybrid replicas on, the ``naive`` engine between pools, pools
  larger than the cluster, a batch that does not split into minibatches);
* a replay buffer that picks finished groups up within ``poll_interval_s`` (verl's polls every 2 s) and hands
  out the longest finished groups first;
* sample filters (staleness, environment failures, uniform-reward groups) before any log-prob is computed
  (:mod:`.sample_filters`);
* a per-step ledger (prompts consumed and trained, the policy versions that generated each sample, phase times),
  per-step metrics (``pipeline/trainer_bubble_frac``, ``pipeline/sampler_idle_frac``, ``pipeline/time/*``,
  ``pipeline/staleness_hist/*``) and a timeline of samplers, reward workers and trainer (:mod:`.timeline`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import ray
import transfer_queue as tq
from omegaconf import open_dict
from transfer_queue import KVBatchMeta

from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl_pipe.rewards.hooks import _v1_reward_infos
from verl_pipe.trainers.config import PipelineConfig, PipelineConfigError
from verl_pipe.trainers.sample_filters import filter_batch, is_padding_only, stand_in_batch
from verl_pipe.trainers.timeline import Interval, Timeline, busy_seconds

logger = logging.getLogger("verl_pipe")


class PipelineReplayBuffer(ReplayBufferAsync):
    """verl's async replay buffer, polling fast, batch by batch, and handing out the longest finished groups first.

    * Batch by batch: only groups of the oldest batch still known (lowest ``global_steps`` tag) are handed out,
      so a group of a prefetched batch that happens to finish early never fills the current batch.
    * Longest-ready-first (verl-pipe's minibatch schedule): among the ready groups, the ones with the most
      response tokens train first, so the long tail of a batch overlaps the training of the short groups that
      finished before it rather than the other way round.
    * ``on_poll`` (set by a trainer) runs between polls while the trainer waits for samples, on the snapshot
      just read: one-off pipelining syncs the sampler there as soon as the batch in flight has generated.
    """

    on_poll = None  # callable(partition_id) -> None

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


def _cluster_ranks(resource: str) -> float:
    return float(ray.cluster_resources().get(resource, 0)) if ray.is_initialized() else float("inf")


class PipelinedTrainer(PPOTrainerSeparateAsync):
    """Base of ``minibatch_pipeline`` and ``one_off_pipeline``; subclasses set ``MODE`` and the schedule."""

    MODE = ""

    def __init__(self, config):
        self.pipeline_cfg = PipelineConfig.from_section(self.MODE, config.trainer.v1.get(self.MODE, {}))
        self._check_layout(config)
        minibatches = config.data.train_batch_size // config.actor_rollout_ref.actor.ppo_mini_batch_size
        with open_dict(config):
            # verl's separate_async constructor asserts this identity on its own section.
            config.trainer.v1.separate_async.parameter_sync_step = minibatches
            config.trainer.v1.separate_async.num_warmup_batches = 0
            config.trainer.v1.separate_async.hybrid_rollout.enable_switch = False
            if self.MODE not in config.trainer.v1:
                config.trainer.v1[self.MODE] = {}
            config.trainer.v1[self.MODE].parameter_sync_step = self.parameter_sync_step_for(config)
        super().__init__(config)
        self._ledger_path = self._resolve_path(self.pipeline_cfg.ledger_path, "pipeline_ledger.jsonl")
        timeline_path = self._resolve_path(self.pipeline_cfg.timeline_path, "timeline.json")
        self.timeline = Timeline(timeline_path) if timeline_path else None
        self._phase_s: dict[str, float] = {}
        self._open_phase: tuple[str, float] | None = None  # the trainer's current timeline interval
        self._submitted_at: dict[int, float] = {}  # batch tag (the step that trains it) -> submission time
        self._window_start = time.time()
        self._filter_counts: Counter = Counter()  # this step's pipeline/filter/* counts
        self._filtered_keys: list[str] = []  # this step's dropped samples, cleared from TransferQueue after metrics
        self._filtered_tags: list[dict] = []
        self._stand_in_keys: list[str] = []  # dropped samples passed through an emptied batch (tagged padding)

    # --- start-up checks ----------------------------------------------------------------------------------------

    def parameter_sync_step_for(self, config) -> int:
        """Optimizer steps per iteration as verl's step() counts them (one sample-and-update round each)."""
        raise NotImplementedError

    def _check_layout(self, config) -> None:
        mode = self.MODE
        rollout = config.actor_rollout_ref.rollout
        if config.actor_rollout_ref.get("hybrid_engine", True):
            raise PipelineConfigError(
                f"trainer.v1.trainer_mode={mode} runs samplers and trainer on separate pools: set "
                "actor_rollout_ref.hybrid_engine=False and size the sampler pool with "
                "actor_rollout_ref.rollout.nnodes / actor_rollout_ref.rollout.n_gpus_per_node"
            )
        if rollout.nnodes < 1 or rollout.n_gpus_per_node < 1:
            raise PipelineConfigError(
                f"trainer.v1.trainer_mode={mode} needs a sampler pool: set actor_rollout_ref.rollout.nnodes >= 1 and "
                f"actor_rollout_ref.rollout.n_gpus_per_node >= 1 (got {rollout.nnodes} x {rollout.n_gpus_per_node})"
            )
        backend = rollout.checkpoint_engine.backend
        if backend == "naive":
            raise PipelineConfigError(
                "actor_rollout_ref.rollout.checkpoint_engine.backend=naive only syncs a trainer with rollout "
                f"workers in its own processes; {mode} has separate pools: use backend=nccl on GPUs or "
                "backend=gloo on the CPU backend"
            )
        train_batch = config.data.train_batch_size
        mini_batch = config.actor_rollout_ref.actor.ppo_mini_batch_size
        if mini_batch < 1 or train_batch % mini_batch:
            raise PipelineConfigError(
                f"data.train_batch_size={train_batch} must be a multiple of "
                f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}: each minibatch is whole prompt groups"
            )
        if self.pipeline_cfg.skip_uniform_reward_groups and rollout.n < 2:
            raise PipelineConfigError(
                f"trainer.v1.{mode}.skip_uniform_reward_groups=true with actor_rollout_ref.rollout.n={rollout.n}: "
                "a group of one sample is always uniform, so every batch would be skipped; sample n >= 2 per prompt"
            )
        device = str(config.trainer.get("device", "cuda"))
        resource = "CPU" if device == "cpu" else ("NPU" if device == "npu" else "GPU")
        trainer_ranks = config.trainer.nnodes * config.trainer.n_gpus_per_node
        sampler_ranks = rollout.nnodes * rollout.n_gpus_per_node
        available = _cluster_ranks(resource)
        if trainer_ranks + sampler_ranks > available:
            raise PipelineConfigError(
                f"{mode} needs {trainer_ranks} trainer ranks (trainer.nnodes x trainer.n_gpus_per_node) plus "
                f"{sampler_ranks} sampler ranks (actor_rollout_ref.rollout.nnodes x "
                f"actor_rollout_ref.rollout.n_gpus_per_node) = {trainer_ranks + sampler_ranks} {resource}, but the "
                f"Ray cluster has {available:g}: shrink one of the pools or add nodes"
            )

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        if type(buffer) is ReplayBufferAsync:  # a user's custom sampler is left alone
            buffer.__class__ = PipelineReplayBuffer  # same constructor and state; only selection and polling differ
            buffer.poll_interval = self.pipeline_cfg.poll_interval_s
        return buffer

    # --- sample filters ------------------------------------------------------------------------------------------

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        # verl's step balances each batch as it leaves the replay buffer, before any log-prob: filtering here
        # keeps the dropped samples out of every forward pass. verl's balancing then pads the survivors.
        batch = self._filter_samples(batch)
        return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    def _filter_samples(self, batch):
        result = filter_batch(batch, self.pipeline_cfg, trainer_version=self.global_steps - 1)
        self._filter_counts.update(result.counts)
        self._filtered_keys.extend(result.dropped_keys)
        dropped = set(result.dropped_keys)
        self._filtered_tags.extend(tag for key, tag in zip(batch.keys, batch.tags) if key in dropped)
        if len(result.batch):
            return result.batch
        stand_in = stand_in_batch(batch, result.dropped_keys)
        self._filtered_keys.remove(stand_in.keys[0])  # verl clears it with the batch it passes through
        self._stand_in_keys.extend(stand_in.keys)
        return stand_in

    def _update_actor(self, batch, metrics):
        if is_padding_only(batch):  # every sample was filtered: an optimizer step would only replay momentum
            self._filter_counts["filter/updates_skipped"] += 1
            return batch
        return super()._update_actor(batch, metrics)

    # --- waiting on the sampler ---------------------------------------------------------------------------------

    def _sampler_idle(self) -> bool:
        return self.replay_buffer.inflight_count() == 0

    def _wait_sampler_idle(self) -> float:
        """Block until no prompt is pending or running; returns the seconds waited."""
        started = time.perf_counter()
        while not self._sampler_idle():
            time.sleep(self.pipeline_cfg.poll_interval_s)
        return time.perf_counter() - started

    def _submit_tagged(self, step: int, num_prompts: int) -> None:
        """Submit prompts tagged with the step that will train them (verl tags the current step).

        The replay buffer hands out the lowest tag first, so a prefetched batch that happens to finish early
        can never be taken in place of the batch whose turn it is.
        """
        current = self.global_steps
        self.global_steps = step
        try:
            self._submitted_at.setdefault(step, time.time())
            self._add_prompts_to_generate(num_prompts)
        finally:
            self.global_steps = current

    def _sync_weights(self, version: int, inside_gen_timer: bool = False) -> None:
        """Push the trainer's weights v_``version`` to the sampler pool through the checkpoint engine (sampler idle).

        ``version`` becomes the samplers' tag on everything they generate next, so it must be the number of
        updates in the weights sent, not the current step (a sync that waited for the sampler happens during the
        next step, while the trainer still holds the previous step's weights).
        """
        resume = self._open_phase[0] if self._open_phase else None
        self._phase("sync")
        started = time.perf_counter()
        self._pending_sync_metrics = dict(self.standalone_checkpoint_manager.update_weights(version) or {})
        seconds = time.perf_counter() - started
        self._phase(resume)
        self._add_phase("sync", seconds)
        if inside_gen_timer:  # verl's "gen" timer is running: keep the sync out of the trainer's wait for samples
            self._add_phase("sync_inside_gen", seconds)

    def _add_phase(self, name: str, seconds: float) -> None:
        self._phase_s[name] = self._phase_s.get(name, 0.0) + seconds

    # --- the trainer's timeline track ------------------------------------------------------------------------------

    def _phase(self, name: str | None) -> None:
        """Close the trainer's current interval and open ``name`` (None: the trainer is between phases)."""
        now = time.time()
        if self._open_phase is not None and self.timeline is not None:
            self.timeline.add("trainer", self._open_phase[0], self._open_phase[1], now)
        self._open_phase = (name, now) if name else None

    def on_sample_begin(self):
        super().on_sample_begin()
        self._phase("wait for samples")

    def on_sample_end(self):
        super().on_sample_end()
        self._phase("train")

    def on_validate_begin(self):
        super().on_validate_begin()
        self._phase("validate")

    def on_validate_end(self):
        super().on_validate_end()
        self._phase(None)

    # --- per-step bookkeeping -----------------------------------------------------------------------------------

    def _resolve_path(self, configured, default_name: str):
        if configured == "":
            return None
        return configured or os.path.join(self.config.trainer.default_local_dir, default_name)

    def _prompt_ids(self, keys: list[str], partition_id: str) -> list:
        """Dataset identity of each prompt group among ``keys`` (``index`` of the dataset row, else the uid)."""
        first_keys: dict[str, str] = {}
        for key in keys:
            first_keys.setdefault(key.split("_")[0], key)
        uids = sorted(first_keys)
        if not uids:
            return []
        try:
            data = tq.kv_batch_get(
                keys=[first_keys[uid] for uid in uids], partition_id=partition_id, select_fields=["index"]
            )
            return [int(i) for i in np.asarray(data["index"]).reshape(-1).tolist()]
        except Exception as error:  # noqa: BLE001 - datasets without an index column are identified by uid
            if not getattr(self, "_warned_no_index", False):
                self._warned_no_index = True
                logger.warning(
                    "verl-pipe: the ledger identifies prompts by uid (no dataset 'index' field: %s: %s); uids "
                    "differ between a run and its resume",
                    type(error).__name__,
                    error,
                )
            return uids

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(self._batch_for_verl_metrics(batch), metrics, timing_raw, global_steps, epoch)
        real = [tag for tag in batch.tags if not tag.get("is_padding", False)]
        trained_keys = [key for key, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
        consumed_keys = trained_keys + self._filtered_keys + self._stand_in_keys
        consumed_tags = real + self._filtered_tags
        staleness = np.array([(global_steps - 1) - int(tag["max_global_steps"]) for tag in real], dtype=int)
        for value, count in Counter(staleness.tolist()).items():
            metrics[f"pipeline/staleness_hist/{value}"] = count
        step_s = float(timing_raw.get("step", 0.0)) or 1e-9
        wait_s = max(0.0, float(timing_raw.get("gen", 0.0)) - self._phase_s.get("sync_inside_gen", 0.0))
        sync_s = self._phase_s.get("sync", 0.0)
        metrics["pipeline/time/gen_wait_s"] = wait_s
        metrics["pipeline/time/sync_s"] = sync_s
        metrics["pipeline/time/train_s"] = max(0.0, step_s - wait_s - sync_s)
        metrics["pipeline/trainer_bubble_frac"] = min(1.0, (wait_s + sync_s) / step_s)
        metrics["pipeline/prompts_trained"] = len({key.split("_")[0] for key in trained_keys})
        metrics["pipeline/prompts_consumed"] = len({key.split("_")[0] for key in consumed_keys})
        for name, count in sorted(self._filter_counts.items()):
            metrics[f"pipeline/{name}"] = float(count)
        metrics.setdefault("pipeline/filter/updates_skipped", 0.0)
        consumed = SimpleNamespace(keys=consumed_keys, partition_id=batch.partition_id)
        self._record_sampler_and_rewards(consumed, consumed_tags, metrics)
        self._write_ledger(batch.partition_id, trained_keys, consumed_keys, consumed_tags, global_steps, metrics)
        if self._filtered_keys:  # verl clears the keys of the batch it trained; the dropped ones are ours
            tq.kv_clear(keys=self._filtered_keys, partition_id=batch.partition_id)
        self._filtered_keys, self._filtered_tags, self._stand_in_keys = [], [], []
        self._filter_counts = Counter()
        self._phase_s = {}

    def _batch_for_verl_metrics(self, batch):
        """``batch``, or, when the filters left it only padding, the batch with its stand-in counted as real.

        verl's step metrics reduce over the real samples and fail on none; a step that trained nothing reports
        them for its stand-in sample (a real dropped one), and ``pipeline/filter/updates_skipped`` marks it.
        """
        if not self._stand_in_keys or not is_padding_only(batch):
            return batch
        stand_ins = set(self._stand_in_keys)
        tags = [dict(tag, is_padding=False) if key in stand_ins else tag for key, tag in zip(batch.keys, batch.tags)]
        return KVBatchMeta(
            keys=batch.keys, tags=tags, partition_id=batch.partition_id, fields=batch.fields, extra_info=batch.extra_info
        )

    def _record_sampler_and_rewards(self, batch, sample_tags, metrics) -> None:
        """Sampler and reward intervals of the step's samples (``batch``: keys and partition), and the sampler's
        idle share of this step.

        A sample's generation ended when the reward manager enqueued it (``reward_enqueue_ts``, written by the
        ``interleaved`` manager); without those timestamps only the trainer's track is drawn.
        """
        now = time.time()
        infos = [info for info in _v1_reward_infos(batch) if "reward_enqueue_ts" in info]
        tags = sorted({int(tag["global_steps"]) for tag in sample_tags})
        sampler: list[Interval] = []
        if infos:
            generated_until = max(float(info["reward_enqueue_ts"]) for info in infos)
            for tag in tags:
                if tag in self._submitted_at:
                    sampler.append(Interval("sampler", f"generate B{tag}", self._submitted_at.pop(tag), generated_until))
            for info in infos:
                if self.timeline is not None:
                    self.timeline.add("reward", "score", float(info["reward_start_ts"]), float(info["reward_end_ts"]))
        if self.timeline is not None:
            for interval in sampler:
                self.timeline.add(interval.track, interval.name, interval.start, interval.end)
            self.timeline.write()
        if infos:
            # Batches submitted and not yet trained (one-off's prefetch) by their real end too, or now if running.
            self.replay_buffer._sync_metadata_from_transfer_queue()
            in_flight = [
                Interval("sampler", "", start, self._generation_end(tag, now)) for tag, start in self._submitted_at.items()
            ]
            known = (self.timeline.track("sampler") if self.timeline is not None else sampler) + in_flight
            window = max(now - self._window_start, 1e-9)
            metrics["pipeline/sampler_idle_frac"] = 1.0 - busy_seconds(known, self._window_start, now) / window
        self._window_start = now

    def _generation_end(self, tag: int, now: float) -> float:
        """When the untrained batch ``tag`` finished generating (its last reward enqueue), or ``now`` if it has not.

        Reads the replay buffer's metadata snapshot; the caller re-reads TransferQueue once for all batches.
        """
        buffer = self.replay_buffer
        uids = {uid for uid, step in buffer.prompt_global_steps["train"].items() if step == tag}
        if not uids or uids & (buffer.pending_keys["train"] | buffer.running_keys["train"]):
            return now
        keys = [key for key in buffer.partitions["train"] if key.split("_")[0] in uids]
        infos = _v1_reward_infos(SimpleNamespace(keys=keys, partition_id="train")) if keys else []
        ends = [float(info["reward_enqueue_ts"]) for info in infos if "reward_enqueue_ts" in info]
        return max(ends) if ends else now

    def _write_ledger(self, partition_id, trained_keys, consumed_keys, consumed_tags, global_steps, metrics) -> None:
        if self._ledger_path is None:
            return
        record = {
            "step": global_steps,
            "mode": self.MODE,
            "trainer_version": global_steps - 1,
            # every prompt this step took from the sampler, and those that reached the update after the filters
            "prompts": self._prompt_ids(consumed_keys, partition_id),
            "prompts_trained": self._prompt_ids(trained_keys, partition_id),
            "sample_versions": sorted(
                {(int(t["min_global_steps"]), int(t["max_global_steps"])) for t in consumed_tags}
            ),
            "metrics": {k: float(v) for k, v in metrics.items() if k.startswith("pipeline/")},
        }
        os.makedirs(os.path.dirname(os.path.abspath(self._ledger_path)), exist_ok=True)
        with open(self._ledger_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
