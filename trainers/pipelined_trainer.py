"""The base of both pipelined trainer modes, on top of verl's ``separate_async`` trainer.

verl's ``PPOTrainerSeparateAsync`` already runs a standalone sampler pool beside the trainer pool, streams
finished prompt groups through TransferQueue, keeps pi_old fixed across minibatches (``DetachActorWorker``) and
syncs weights through a checkpoint engine. The pipelined modes keep all of that and add, each in its module:

* start-up checks that name the key and the fix (:mod:`.layout_checks`);
* a replay buffer that picks finished groups up within ``poll_interval_s`` (verl's polls every 2 s) and hands
  out the longest finished groups first (:mod:`.replay_buffer`), named in verl's custom-sampler slot
  (:mod:`.sampler_slot`);
* sample filters (staleness, environment failures, uniform-reward groups) before any log-prob is computed
  (:mod:`.sample_filters`, and the step's record of what they dropped: :mod:`.filtered_samples`);
* a per-step ledger (prompts consumed and trained, the policy versions that generated each sample, phase times:
  :mod:`.step_ledger`), per-step metrics (``pipeline/trainer_bubble_frac``, ``pipeline/sampler_idle_frac``,
  ``pipeline/time/*``, ``pipeline/staleness_hist/*``) and a timeline of samplers, reward workers and trainer
  (:mod:`.timeline_recorder`, :mod:`.timeline`);
* checkpoints a resume can trust: a failed save (a full disk) stops the run naming the step, the disk and the
  checkpoint a rerun resumes from, and a tracker that names no complete checkpoint is refused at start-up
  (:mod:`.checkpoint_guard`);
* a lost Ray node stops the run with one error naming the node, the actors that died on it, the step and the
  checkpoint a rerun resumes from (:mod:`.lost_nodes`).

This class holds the schedule's building blocks the modes share (tagged submission, waiting for an idle
sampler, weight sync) and wires the pieces above into verl's step.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from types import SimpleNamespace

import ray
from omegaconf import open_dict

from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl_pipe.rollout.composition import check_built, compose, register_replica
from verl_pipe.trainers.checkpoint_guard import check_resumable, saving_checkpoint
from verl_pipe.trainers.config import PipelineConfig
from verl_pipe.trainers.dead_replicas import (
    call_while_engines_live,
    diagnosing_dead_replicas,
    engine_health,
    engine_healths,
)
from verl_pipe.trainers.dynamic_sampling import DynamicSampling, DynamicSamplingConfig
from verl_pipe.trainers.filtered_samples import FilteredSamples
from verl_pipe.trainers.layout_checks import check_layout
from verl_pipe.trainers.lost_nodes import diagnosing_lost_nodes
from verl_pipe.trainers.sample_filters import is_padding_only
from verl_pipe.trainers.sampler_slot import REPLAY_BUFFER_NAME, REPLAY_BUFFER_PATH, select_pipeline_replay_buffer
from verl_pipe.trainers.step_ledger import StepLedger
from verl_pipe.trainers.timeline import Timeline
from verl_pipe.trainers.timeline_recorder import TimelineRecorder
from verl_pipe.trainers.token_lag import version_number


def ping_all(actors: list, timeout_s: float = 5.0) -> list[str]:
    """Whether each Ray actor answers, all asked at once: ``"answers"``, ``"does not answer within N s"`` or
    ``"is dead (<error>)"``. A dead actor's answer comes at once, so a short ``timeout_s`` still finds it."""
    refs = [actor.__ray_ready__.remote() for actor in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    answers = []
    for ref in refs:
        if ref not in ready:
            answers.append(f"does not answer within {timeout_s:.0f} s")
            continue
        try:
            ray.get(ref)
            answers.append("answers")
        except ray.exceptions.RayActorError as error:
            answers.append(f"is dead ({type(error).__name__})")
    return answers


def ping(actor, timeout_s: float = 5.0) -> str:
    """Whether a Ray actor answers (:func:`ping_all` of one)."""
    return ping_all([actor], timeout_s)[0]


# The quick look at the sampler's actors, every few seconds of the trainer's wait: a dead actor answers at once.
QUICK_LOOK_TIMEOUT_S = 2.0


class PipelinedTrainer(PPOTrainerSeparateAsync):
    """Base of ``minibatch_pipeline`` and ``one_off_pipeline``; subclasses set ``MODE`` and the schedule."""

    MODE = ""
    REPLAY_BUFFER = (REPLAY_BUFFER_PATH, REPLAY_BUFFER_NAME)  # named in verl's custom-sampler slot

    def __init__(self, config):
        self.pipeline_cfg = PipelineConfig.from_section(self.MODE, config.trainer.v1.get(self.MODE, {}))
        self._check_layout(config)  # refuses a rollout composition that cannot run the mode
        # the replica, server, checkpoint manager and client this run builds, on this platform; verl's registry then
        # builds that replica in this process
        self.composition = compose(config)
        register_replica(self.composition)
        minibatches = config.data.train_batch_size // config.actor_rollout_ref.actor.ppo_mini_batch_size
        with open_dict(config):
            # verl's separate_async constructor asserts this identity on its own section.
            config.trainer.v1.separate_async.parameter_sync_step = minibatches
            config.trainer.v1.separate_async.num_warmup_batches = 0
            config.trainer.v1.separate_async.hybrid_rollout.enable_switch = False
            if self.MODE not in config.trainer.v1:
                config.trainer.v1[self.MODE] = {}
            config.trainer.v1[self.MODE].parameter_sync_step = self.parameter_sync_step_for(config)
        select_pipeline_replay_buffer(config, *self.REPLAY_BUFFER)  # verl's constructor builds the one named
        super().__init__(config)
        ledger_path = self._resolve_path(self.pipeline_cfg.ledger_path, "pipeline_ledger.jsonl")
        self._ledger = StepLedger(ledger_path, self.MODE) if ledger_path else None
        timeline_path = self._resolve_path(self.pipeline_cfg.timeline_path, "timeline.json")
        self._timeline = TimelineRecorder(Timeline(timeline_path) if timeline_path else None)
        self._filtered = FilteredSamples()

    def _resolve_path(self, configured, default_name: str):
        if configured == "":
            return None
        return configured or os.path.join(self.config.trainer.default_local_dir, default_name)

    def _setup(self):
        super()._setup()
        check_built(self.composition, self.standalone_server_manager.get_replicas())

    def fit(self, agent_loop_manager):
        step, checkpoints = (lambda: self.global_steps), self._checkpoint_dir()
        # a lost node is the root cause of the replicas that died on it: its diagnosis looks last, at either error
        with diagnosing_lost_nodes(step, checkpoints), diagnosing_dead_replicas(step, checkpoints):
            return super().fit(agent_loop_manager)

    # --- checkpoints ----------------------------------------------------------------------------------------------

    def _checkpoint_dir(self) -> str:
        return os.path.abspath(self.config.trainer.default_local_dir)  # verl resolves it against the working dir

    def _save_checkpoint(self):
        with saving_checkpoint(self._checkpoint_dir(), self.global_steps):
            return super()._save_checkpoint()

    def _load_checkpoint(self):
        if self.config.trainer.resume_mode == "auto":
            check_resumable(self._checkpoint_dir())
        return super()._load_checkpoint()

    # --- start-up checks ----------------------------------------------------------------------------------------

    def parameter_sync_step_for(self, config) -> int:
        """Optimizer steps per iteration as verl's step() counts them (one sample-and-update round each)."""
        raise NotImplementedError

    def _check_layout(self, config) -> None:
        check_layout(self.MODE, self.pipeline_cfg, config)

    # --- sample filters ------------------------------------------------------------------------------------------

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        buffer.describe_sampler = self._describe_sampler  # what the stall watch reports of the replicas
        buffer.find_dead_actor = self._an_actor_is_dead  # what it asks every few seconds of a wait
        dynamic = DynamicSamplingConfig.from_verl(self.config)
        if dynamic is not None and hasattr(buffer, "dynamic_sampling"):  # ours, not a user's own sampler
            # verl gives its DAPO metric to its own buffer only; ours runs verl's drop-and-refill with it
            buffer.filter_groups_metric = dynamic.metric
            buffer.dynamic_sampling = DynamicSampling(dynamic)
        return buffer

    def _an_actor_is_dead(self) -> bool:
        """Whether a reward worker, a rollout server or a server's engine is dead: every actor pinged at once, then
        the live servers asked about their engines at once (a few milliseconds on a healthy cluster)."""
        workers = list(self.get_reward_handles() or [])
        servers = [server for replica in self.standalone_server_manager.get_replicas() for server in replica.servers]
        answers = ping_all(workers + servers, QUICK_LOOK_TIMEOUT_S)
        if any(answer.startswith("is dead") for answer in answers):
            return True
        live = [server for server, answer in zip(servers, answers[len(workers):]) if answer == "answers"]
        return any(problem is not None for problem in engine_healths(live, QUICK_LOOK_TIMEOUT_S))

    def _describe_sampler(self) -> tuple[str, str | None]:
        """How each rollout replica's servers and each reward worker answer now, and the cause when a replica's
        server or engine process, or a reward worker, is dead (the stall watch's diagnosis; it stops at once then)."""
        handles = list(self.get_reward_handles() or [])
        workers = [(f"worker {rank}", answer) for rank, answer in enumerate(ping_all(handles))]
        dead = [name for name, answer in workers if answer.startswith("is dead")]
        servers, dead_replicas = [], []
        for replica in self.standalone_server_manager.get_replicas():
            for server, answer in zip(replica.servers, ping_all(list(replica.servers))):
                engine = engine_health(server) if answer == "answers" else None
                if engine or answer.startswith("is dead"):
                    dead_replicas.append(f"replica {replica.replica_rank}")
                if engine:
                    servers.append(f"replica {replica.replica_rank}: its server answers, but {engine}")
                    continue
                stuck = answer == "answers" and not dead  # with a reward worker dead, the engine may be fine
                servers.append(f"replica {replica.replica_rank}: its server {answer}"
                               f"{' (its engine, not the server, is stuck)' if stuck else ''}")  # fmt: skip
        facts = f"Rollout replicas: {'; '.join(servers) or 'none registered'}."
        if workers:
            facts += f" Reward workers: {'; '.join(f'{name}: {answer}' for name, answer in workers)}."
        cause = None
        if dead_replicas:
            cause = (
                f"Rollout {' and '.join(dead_replicas)} died (its server or its engine process: killed, or out of "
                "memory): its requests never finish, and verl-pipe does not restart a replica in place. Fix: read "
                "the server's log (`ray logs`, or the session's logs folder; dmesg for the OOM killer), and resume "
                "from the last checkpoint (trainer.resume_mode=auto)"
            )
        elif dead:
            cause = (
                f"Reward {' and '.join(dead)} died: every group routed to it fails, and verl's buffer submits it "
                "again. Fix: read its log (`ray logs`, or the session's logs folder: out of memory?), and resume "
                "from the last checkpoint (trainer.resume_mode=auto)"
            )
        return facts, cause

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        # verl's step balances each batch as it leaves the replay buffer, before any log-prob: filtering here
        # keeps the dropped samples out of every forward pass. verl's balancing then pads the survivors.
        batch = self._filtered.filter(batch, self.pipeline_cfg, trainer_version=self.global_steps - 1)
        return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    def _update_actor(self, batch, metrics):
        if is_padding_only(batch):  # every sample was filtered: an optimizer step would only replay momentum
            self._filtered.skip_update()
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
            self._timeline.batch_submitted(step)
            self._add_prompts_to_generate(num_prompts)
        finally:
            self.global_steps = current

    def _sync_weights(self, version: int, inside_gen_timer: bool = False) -> None:
        """Push the trainer's weights v_``version`` to the sampler pool through the checkpoint engine (sampler idle).

        ``version`` becomes the samplers' tag on everything they generate next, so it must be the number of
        updates in the weights sent, not the current step (a sync that waited for the sampler happens during the
        next step, while the trainer still holds the previous step's weights).
        """
        resume = self._timeline.current_phase
        self._phase("sync")
        started = time.perf_counter()
        metrics = call_while_engines_live(
            lambda: self.standalone_checkpoint_manager.update_weights(version),
            self.standalone_server_manager.get_replicas(), self.global_steps, self._checkpoint_dir())  # fmt: skip
        self._pending_sync_metrics = dict(metrics or {})
        seconds = time.perf_counter() - started
        self._phase(resume)
        self._timeline.add_seconds("sync", seconds)
        if inside_gen_timer:  # verl's "gen" timer is running: keep the sync out of the trainer's wait for samples
            self._timeline.add_seconds("sync_inside_gen", seconds)

    # --- the trainer's timeline track ------------------------------------------------------------------------------

    def _phase(self, name: str | None) -> None:
        """Close the trainer's current interval and open ``name`` (None: the trainer is between phases)."""
        self._timeline.enter(name)

    def on_sample_begin(self):
        super().on_sample_begin()
        self._phase("wait for samples")

    def on_sample_end(self):
        super().on_sample_end()
        self._phase("train")

    def on_validate_begin(self):
        super().on_validate_begin()
        self._phase("validate")
        self._lend_trainer_cores(True)

    def on_validate_end(self):
        self._lend_trainer_cores(False)
        super().on_validate_end()
        self._phase(None)

    def _lend_trainer_cores(self, lend: bool) -> None:
        """verl validates on the sampler pool while the trainer pool waits: lend the trainer ranks' torch threads to
        the hf servers for that time (on CPU the pools split the cores, and greedy validation is the sampler's
        slowest work), and take them back after. Other engines size their threads at start and keep them."""
        replicas = self.standalone_server_manager.get_replicas()
        servers = [server for r in replicas if getattr(r, "lends_torch_threads", False) for server in r.servers]
        if not servers:
            return
        extra = 0
        if lend:  # each trainer rank runs OMP_NUM_THREADS threads (the CPU backend's split of the cores)
            trainer_threads = self.actor_rollout_wg.world_size * int(os.environ.get("OMP_NUM_THREADS") or 1)
            extra = max(1, trainer_threads // len(servers))
        ray.get([server.lend_torch_threads.remote(extra) for server in servers])

    # --- per-step metrics and ledger ----------------------------------------------------------------------------

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(self._filtered.batch_for_verl_metrics(batch), metrics, timing_raw, global_steps, epoch)
        real = [tag for tag in batch.tags if not tag.get("is_padding", False)]
        trained_keys = [key for key, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
        consumed_keys, consumed_tags = self._filtered.consumed(trained_keys, real)
        staleness = [version_number((global_steps - 1) - float(tag["max_global_steps"])) for tag in real]
        for value, count in Counter(staleness).items():
            metrics[f"pipeline/staleness_hist/{value}"] = count
        metrics.update(self._timeline.time_metrics(timing_raw))
        metrics["pipeline/prompts_trained"] = len({key.split("_")[0] for key in trained_keys})
        metrics["pipeline/prompts_consumed"] = len({key.split("_")[0] for key in consumed_keys})
        metrics.update(self._filtered.count_metrics())
        dropped_uniform = []
        if getattr(self.replay_buffer, "dynamic_sampling", None) is not None:
            trained_tokens = sum(int(tag.get("response_len", 0)) for tag in real)
            dropped, dapo_metrics = self.replay_buffer.dynamic_sampling.take_step_record(global_steps, trained_tokens)
            dropped_uniform = [(group.prompt, group.value) for group in dropped]
            metrics.update(dapo_metrics)
            metrics["pipeline/prompts_consumed"] += len(dropped)
        consumed = SimpleNamespace(keys=consumed_keys, partition_id=batch.partition_id)
        self._timeline.record_step(consumed, consumed_tags, metrics, self.replay_buffer)
        if self._ledger is not None:
            self._ledger.write(global_steps, batch.partition_id, trained_keys, consumed_keys, consumed_tags, metrics,
                               dropped_uniform)  # fmt: skip
        self._filtered.clear(batch.partition_id)
