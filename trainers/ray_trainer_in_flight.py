"""``in_flight_pipeline``: a sampler that never drains, fed new weights between decode steps (as PipelineRL does).

``trainer.v1.trainer_mode=in_flight_pipeline``. A feeder thread submits prompts to the sampler pool whenever the
lag bound allows, across step boundaries, while the trainer trains. After every update the new weights go to the
sampler through verl's checkpoint engine without aborting anything (:mod:`.in_flight_sync`): each hf server loads
them at its running batch's next decode step, every request keeps its KV cache and decodes on under the new
weights, and every token records the version that sampled it (its log-prob is that version's, which is what
GRPO+'s token-level IS correction compares with pi_old). The trainer updates once per minibatch of finished
groups, pi_old frozen across them, so a step's first minibatches train while its last groups still generate.

With ``trainer.v1.in_flight_pipeline.load_every_update`` (on by default for the hf server, which receives the
weights beside decoding) each minibatch update's weights are loaded too, as PipelineRL loads every optimizer
step's: after the m-th of a step's M updates the sampler runs v_{k-1} + m / M, so the batches generating for the
next steps lag less. Such a load waits until the rest of the step can be trained without it: while a group due
at this step still generates, or the groups already finished cannot fill the step's later minibatches, it is held
until the next minibatch's groups have been taken (a group it reached while generating has tokens newer than the
pi_old of the step, a lag below zero; the replay buffer takes such groups last); with nothing generating it is
skipped.

The lag bound (``trainer.v1.in_flight_pipeline.max_lag``, L, default 1) is enforced by deadlines, per token: a
group submitted while the sampler serves v_s may train no later than step s + 1 + L (the trainer then holds
v_{s+L}, so even its first token lags at most L). The feeder admits a prompt only if the steps up to its deadline
can train every group admitted so far (``train_batch_size`` groups per step), and the replay buffer
(:mod:`.in_flight_buffer`) hands out due groups first and waits for any still generating: a long response holds
the trainer back rather than being dropped (both counts are logged). With L = 0 the feeder admits the next batch
only after the sync: the schedule, the prompts and (with the hf server's per-request seeds) the samples are
verl's ``sync`` mode's.

``trainer.v1.in_flight_pipeline.max_untrained_prompts`` caps the prompt groups submitted and not yet taken by the
trainer (generating, scored or waiting), and the feeder refills each place as soon as a minibatch takes its groups:
under a bound of 2 it keeps the sampler at a steady load whose staleness the cap sets (Little's law: the groups
ahead of the trainer, over the groups it trains a step), instead of the batch-per-sync admission that the
deadlines of a bound of 1 allow, and a trainer that falls behind stops the feeder rather than training ever staler
groups. ``verl-pipe plan`` chooses it for a lag target. ``max_in_flight_prompts`` (default (L + 1) x
``train_batch_size``, which the bound never lets fill) caps those generating.

Per-step metrics under ``in_flight/``: token-weighted mean, max and min lag, the share of samples spanning more
than one version, groups held back and dropped, the bound, the minibatch loads sent and skipped, and the most
prompt groups generating, and untrained, at once since the last step beside their caps.
"""

from __future__ import annotations

import threading

import transfer_queue as tq
from tensordict.tensorclass import NonTensorData

from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl_pipe.trainers.config import PipelineConfigError
from verl_pipe.trainers.in_flight_sync import enable_in_flight_updates
from verl_pipe.trainers.pipelined_trainer import PipelinedTrainer
from verl_pipe.trainers.sampler_slot import IN_FLIGHT_BUFFER_NAME, IN_FLIGHT_BUFFER_PATH
from verl_pipe.trainers.token_lag import sample_versions, token_lag_metrics


def admissible_prompts(
    batch: int,
    synced_version: int,
    max_lag: int,
    next_step: int,
    untrained: int,
    free_slots: int,
    left_in_run: int,
    waiting_room: int | None = None,
) -> int:
    """How many prompts may start now, on weights v_``synced_version``, without breaking the lag bound.

    A prompt started now is due at step ``synced_version + 1 + max_lag``. Steps ``next_step`` .. due train
    ``batch`` groups each, earliest deadline first, and every group still untrained has a deadline no later than
    this one: all of them and the new ones must fit there. The sampler's free slots, the run's remaining prompts and
    the room under ``max_untrained_prompts`` (``waiting_room``; None: no cap) bound it too.
    """
    due = synced_version + 1 + max_lag
    room = batch * max(0, due - next_step + 1) - untrained
    capped = left_in_run if waiting_room is None else min(left_in_run, waiting_room)
    return max(0, min(free_slots, room, capped))


class LagBoundError(RuntimeError):
    """A trained token lagged more versions than ``max_lag`` allows: the schedule's guarantee broke."""


@register_trainer("in_flight_pipeline")
class InFlightPipelineTrainer(PipelinedTrainer):
    MODE = "in_flight_pipeline"
    REPLAY_BUFFER = (IN_FLIGHT_BUFFER_PATH, IN_FLIGHT_BUFFER_NAME)
    # The schedule, top to bottom: each hook of verl's V1 loop this mode overrides, in the order verl calls them
    # (trainer_base.fit -> step -> _step_once, once per minibatch), and what it does there. The feeder thread
    # (_feed) runs beside all of it, topping the sampler up whenever the lag bound allows.
    # tests/trainers/test_schedules_on_cpu.py holds this table to verl's loop and to the class.
    SCHEDULE = (
        ("on_train_begin", "restore the counters from the checkpoint, admit the first batches, start the feeder"),
        ("prepare_step", "raise a feeder failure here, on the trainer's thread; nothing is submitted per step"),
        ("on_sample_begin", "the step's last minibatch waits for every group due now; earlier ones take what is "
         "ready, if the due groups they leave fit in the minibatches after them; groups newer than pi_old last"),
        ("on_sample_end", "count the groups taken; send a minibatch load that waited for them to finish"),
        ("_balance_batch", "drop the samples the filters refuse, before any log-prob"),
        ("_update_actor", "skip an update left with nothing to train"),
        ("_step_once", "after each minibatch update but the step's last: load its weights into the running "
         "batches, unless a group due now still generates or the finished ones cannot fill the step (then "
         "on_sample_end sends it)"),
        ("_save_checkpoint", "hold the feeder while the dataloader's state is saved; a failed save stops the run"),
        ("on_step_end", "load v_k into the running batches, aborting nothing; at lag 0 the next batch starts now"),
        ("on_validate_begin", "lend the trainer's cores to the sampler pool, which validates"),
        ("on_validate_end", "take them back"),
        ("_compute_metrics", "each sample's token lag from its version tags; stop if one broke max_lag"),
        ("on_train_end", "stop the feeder"),
    )  # fmt: skip

    def __init__(self, config):
        super().__init__(config)
        self.max_lag = self.pipeline_cfg.max_lag
        # As many groups as the bound lets run (a batch per version it admits); a replica queues what it cannot run.
        self.slots = self.pipeline_cfg.max_in_flight_prompts or (self.max_lag + 1) * int(config.data.train_batch_size)
        # The feeder thread and the trainer share these; every read-modify-write holds the lock.
        self._lock = threading.Lock()
        self._submitted = 0  # prompt groups submitted (restored ones included)
        self._taken = 0  # prompt groups handed to a step
        self._taken_this_step = 0  # of which the current step's earlier minibatches took these
        self._dropped = 0  # prompt groups evicted unfinished-in-time (they free their place)
        self._stop = threading.Event()
        self._feeder: threading.Thread | None = None
        self._feed_error: BaseException | None = None
        self.load_every_update = self._loads_every_update(config)
        self._update_loads = {"sent": 0, "skipped": 0}  # this step's minibatch loads (not the step's last)
        self._unsent_update: float | None = None  # the version of a minibatch update's weights not loaded yet
        # the most prompt groups generating, and submitted and not yet trained, at once since the last step's
        # metrics (both only rise when the feeder submits, so its reading after a top-up is the peak; the untrained
        # one starts each window at the level carried into it)
        self._generating_peak = 0
        self._untrained_peak = 0

    def parameter_sync_step_for(self, config) -> int:
        # One optimizer step per minibatch of finished groups (pi_old frozen across them, as minibatch_pipeline
        # does), so the first minibatches train while the step's last groups still generate.
        return config.data.train_batch_size // config.actor_rollout_ref.actor.ppo_mini_batch_size

    def _loads_every_update(self, config) -> bool:
        configured = self.pipeline_cfg.load_every_update
        if configured is not None:
            return configured
        # the hf server stages a load's buckets while it decodes; vLLM's weight RPC holds its engine meanwhile
        return config.actor_rollout_ref.rollout.name == "hf"

    def _check_layout(self, config) -> None:
        super()._check_layout(config)
        cap, minibatch = self.pipeline_cfg.max_untrained_prompts, int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
        if cap is not None and cap < minibatch:
            raise PipelineConfigError(
                f"trainer.v1.{self.MODE}.max_untrained_prompts={cap} is below a minibatch "
                f"(actor_rollout_ref.actor.ppo_mini_batch_size={minibatch}): the trainer would wait forever for a "
                f"minibatch the feeder may not submit; set it to at least {minibatch}"
            )
        tau = self.pipeline_cfg.max_staleness
        if tau is not None and tau < self.pipeline_cfg.max_lag:
            raise PipelineConfigError(
                f"trainer.v1.{self.MODE}.max_staleness={tau} is below max_lag={self.pipeline_cfg.max_lag}: the filter "
                "would drop samples the lag bound admits; leave max_staleness unset (max_lag bounds every token)"
            )

    # --- verl pieces swapped for in-flight loading ------------------------------------------------------------

    def _setup(self):
        super()._setup()
        engine_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.rollout.checkpoint_engine)
        replicas = self.standalone_server_manager.get_replicas()
        manager_cls = self.composition.load("checkpoint_manager")  # InFlightCheckpointManager: no abort
        self.standalone_checkpoint_manager = manager_cls(
            config=engine_config, actor_wg=self.actor_rollout_wg, replicas=replicas
        )
        self.standalone_checkpoint_manager.version_listeners = tuple(enable_in_flight_updates(replicas))

    def get_llm_client(self):
        # VersionKeepingClient: verl's partial-rollout client, keeping every token's version
        return self.standalone_server_manager.get_client(client_cls=self.composition.load("llm_client"))

    # --- the feeder: refills the sampler's slots whenever the bound allows ----------------------------------------

    def _admissible(self, in_flight: int) -> int:
        """Prompts the feeder may submit now (lock held)."""
        cap = self.pipeline_cfg.max_untrained_prompts
        return admissible_prompts(
            batch=int(self.config.data.train_batch_size),
            synced_version=self._synced_version,
            max_lag=self.max_lag,
            next_step=self._next_step_to_sample,
            # the groups the current step has taken already fill part of its own batch
            untrained=self._submitted - self._taken - self._dropped + self._taken_this_step,
            free_slots=self.slots - in_flight,
            # every group the buffer evicted (a uniform one under dynamic sampling, a failed or late one) is replaced:
            # the run trains train_batch_size groups per step all the same
            left_in_run=int(self.config.data.train_batch_size) * self.total_training_steps
            - (self._submitted - self._dropped),
            waiting_room=None if cap is None else cap - self._untrained_now(),
        )

    def _untrained_now(self) -> int:
        """Prompt groups submitted and not yet taken by a minibatch: generating, scored or in the buffer (lock
        held). An evicted group frees its place."""
        return self._submitted - self._taken - self._dropped

    def _top_up(self) -> None:
        items = (tq.kv_list("train") or {}).get("train", {})
        in_flight = sum(
            1 for tag in items.values() if tag.get("is_prompt", False) and tag.get("status") in ("pending", "running")
        )
        with self._lock:
            count = self._admissible(in_flight)
            self._generating_peak = max(self._generating_peak, in_flight + count)
            self._untrained_peak = max(self._untrained_peak, self._untrained_now() + count)
            if count <= 0:
                return
            deadline = self._synced_version + 1 + self.max_lag
            self._submitted += count
            batch = self._next_train_batch(count)  # the dataloader's order: the prompts sync mode would see
        tu.assign_non_tensor_data(batch, "global_steps", deadline)
        self._timeline.batch_submitted(deadline)
        tags = [{"is_prompt": True, "status": "pending", "global_steps": deadline} for _ in range(len(batch))]
        tq.kv_batch_put(
            keys=list(batch["uid"]),
            partition_id="train",
            tags=tags,
            fields=batch.select(*[key for key in batch.keys() if not isinstance(batch.get(key), NonTensorData)]),
        )
        self.agent_loop_manager.generate_sequences(batch)

    def _feed(self) -> None:
        while not self._stop.wait(self.pipeline_cfg.poll_interval_s):
            try:
                self._top_up()
            except BaseException as error:  # noqa: BLE001 - raised on the trainer's thread at its next hook
                self._feed_error = error
                return

    def _raise_feed_error(self) -> None:
        if self._feed_error is not None:
            raise RuntimeError(f"{self.MODE}: the sampler feeder failed: {self._feed_error!r}") from self._feed_error

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        # verl's buffer calls this to replace groups it evicted: they free their place (and their share of the
        # run's prompts); the feeder submits the next prompts of the data there, tagged with the deadline of now.
        with self._lock:
            self._dropped += num_prompts
        return num_prompts

    def _save_checkpoint(self):
        with self._lock:  # the dataloader's state must not move while it is saved
            return super()._save_checkpoint()

    # --- the schedule ---------------------------------------------------------------------------------------------

    def on_train_begin(self):
        self._synced_version = self.global_steps - 1  # on_init_end synced the loaded weights
        self._next_step_to_sample = self.global_steps
        restored = self._restored_tq_prompt_count  # re-issued by verl, tagged due now
        self._submitted = batch_done = self.config.data.train_batch_size * (self.global_steps - 1)
        self._taken = batch_done
        self._submitted += restored
        self._top_up()
        self._feeder = threading.Thread(target=self._feed, name="verl-pipe-sampler-feeder", daemon=True)
        self._feeder.start()

    def prepare_step(self) -> dict:
        self._raise_feed_error()
        return {}

    def on_sample_begin(self):
        super().on_sample_begin()
        # A step's last minibatch waits for every group due at this step; earlier ones take what is ready, as long
        # as the due groups they leave fit in the minibatches after them.
        self.replay_buffer.later_capacity = self._places_left_in_step()
        self.replay_buffer.trainer_version = self.global_steps - 1  # pi_old, frozen across the step's minibatches

    def on_sample_end(self):
        super().on_sample_end()
        minibatch = int(self.config.data.train_batch_size) // self.parameter_sync_step
        with self._lock:
            self._taken += minibatch
            self._taken_this_step += minibatch
            if self.local_trigger_step == self.parameter_sync_step - 1:
                self._next_step_to_sample = self.global_steps + 1
                self._taken_this_step = 0
        self._load_update(inside_gen_timer=True)  # one that waited for the step's groups: they have generated now

    def _step_once(self, metrics, timing_raw, sample_batch_size):
        batch = super()._step_once(metrics, timing_raw, sample_batch_size)
        if self.load_every_update and self.local_trigger_step < self.parameter_sync_step - 1:
            self._unsent_update = self._version_after_update()
            self._load_update()
        return batch

    def _places_left_in_step(self) -> int:
        """Groups the step's minibatches after the current one will take."""
        minibatch = int(self.config.data.train_batch_size) // self.parameter_sync_step
        return minibatch * (self.parameter_sync_step - 1 - self.local_trigger_step)

    def _version_after_update(self) -> float:
        """The trainer's weights after this minibatch update: v_{k-1} + m / M after the m-th of a step's M."""
        return (self.global_steps - 1) + (self.local_trigger_step + 1) / self.parameter_sync_step

    def _load_update(self, inside_gen_timer: bool = False) -> None:
        """Send the latest minibatch update's weights to the sampler once the rest of the step can be trained without
        them: no group due at this step generates, and the groups already finished can fill the step's later
        minibatches. Every group still generating then trains at a later step; loaded now, its tokens would be newer
        than this step's pi_old (a lag below zero) if this step took it. Until then the load waits, and the next
        minibatch's sampling tries again. With nothing generating there is nothing to load into; the step's own
        sync supersedes a load still waiting at its end."""
        if self._unsent_update is None:
            return
        if self.replay_buffer.inflight_count() == 0:  # re-reads TransferQueue
            self._unsent_update = None
            self._update_loads["skipped"] += 1
            return
        if self.replay_buffer.due_in_flight(self.global_steps, "train"):
            return
        if self.replay_buffer.ready_for_this_step() < self._places_left_in_step():
            return
        version, self._unsent_update = self._unsent_update, None
        self._sync_weights(version, inside_gen_timer=inside_gen_timer)
        self._update_loads["sent"] += 1

    def on_step_end(self):
        self._raise_feed_error()
        if self._unsent_update is not None:  # superseded by the step's own weights, sent now
            self._unsent_update = None
            self._update_loads["skipped"] += 1
        # In flight: nothing is aborted, the servers load v_k at their next decode step.
        self._sync_weights(self.global_steps)
        with self._lock:
            self._synced_version = self.global_steps
        if self.global_steps >= self.total_training_steps:
            self._stop.set()
        else:
            self._top_up()  # lag 0: the next batch may start only now
        self._phase(None)

    def on_train_end(self):
        self._stop.set()
        super().on_train_end()

    # --- metrics and the bound's check -----------------------------------------------------------------------------

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        real = [(key, tag) for key, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
        if real:
            data = tq.kv_batch_get(
                keys=[key for key, _ in real], partition_id=batch.partition_id, select_fields=["extra_fields"]
            )
            extra = data.pop("extra_fields").tolist()  # as verl reads it (a plain index returns a linked list)
            samples = [sample_versions(tag, fields) for (_, tag), fields in zip(real, extra)]
            lag = token_lag_metrics(samples, trainer_version=global_steps - 1, prefix="in_flight")
            if lag and lag["in_flight/token_lag/max"] > self.max_lag:
                raise LagBoundError(
                    f"{self.MODE} step {global_steps}: a token lagged {lag['in_flight/token_lag/max']:.0f} versions, "
                    f"above trainer.v1.{self.MODE}.max_lag={self.max_lag}"
                )
            metrics.update(lag)
        counts = self.replay_buffer.take_counts()
        metrics["in_flight/held_back_groups"] = float(counts["held_back_groups"])
        metrics["in_flight/dropped_groups"] = float(counts["dropped_groups"])
        metrics["in_flight/max_lag"] = float(self.max_lag)
        metrics["in_flight/update_loads_sent"] = float(self._update_loads["sent"])
        metrics["in_flight/update_loads_skipped"] = float(self._update_loads["skipped"])
        self._update_loads = {"sent": 0, "skipped": 0}
        metrics.update(self._take_peaks())
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)

    def _take_peaks(self) -> dict[str, float]:
        """The peaks since the last step's metrics, beside their caps; the next window starts from the groups
        untrained now (a window in which the feeder submits nothing, e.g. a step that takes its groups before its
        next poll, still held them: starting it at 0 read a full cap as one short)."""
        with self._lock:
            peaks = {
                "in_flight/generating_max": float(self._generating_peak),
                "in_flight/max_in_flight_prompts": float(self.slots),
                "in_flight/untrained_max": float(self._untrained_peak),
            }
            if self.pipeline_cfg.max_untrained_prompts is not None:
                peaks["in_flight/max_untrained_prompts"] = float(self.pipeline_cfg.max_untrained_prompts)
            self._generating_peak = 0
            self._untrained_peak = self._untrained_now()
        return peaks
