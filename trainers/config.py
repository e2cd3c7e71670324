"""Typed settings of the pipelined trainer modes, read from ``trainer.v1.<mode>`` and validated at start-up.

verl reads per-mode settings with ``config.trainer.v1.get(mode, {})``, so ours live under
``trainer.v1.minibatch_pipeline`` / ``trainer.v1.one_off_pipeline`` (set them with a leading ``+`` on the
command line, as any key verl's schema does not know). Every error names the full key and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional


class PipelineConfigError(ValueError):
    """A pipelined-trainer setting that cannot work; the message names the key and the fix."""


@dataclass
class PipelineConfig:
    # How often the trainer polls TransferQueue for finished prompt groups. verl's replay buffer waits 2 s per
    # poll, longer than a whole step of a small model; finished groups should be picked up at once.
    poll_interval_s: float = 0.05
    # Write one JSON line per step (prompts trained, the policy versions that generated them, phase times) here;
    # default: <trainer.default_local_dir>/pipeline_ledger.jsonl. "" turns it off.
    ledger_path: Optional[str] = None
    # Chrome-trace timeline of samplers, reward workers and trainer, rewritten after every step (draw it with
    # `verl-pipe plot TRACE.json`); default: <trainer.default_local_dir>/timeline.json. "" turns it off.
    timeline_path: Optional[str] = None
    # one_off_pipeline: fail the step if a sample's generating policy is not exactly one version behind.
    assert_staleness: bool = True
    # Sample filters, applied to every batch before old/ref log-probs are computed (trainers/sample_filters.py).
    # tau: drop a sample whose generating policy is more than this many versions older than the trainer's
    # weights (None: keep all; the schedules bound staleness to 1 (one-off) or 0 (minibatch) anyway).
    max_staleness: Optional[int] = None
    # Drop samples whose reward flagged an environment failure (reward_extra_info.sandbox_error: a sandbox
    # crash says nothing about the program); a group left with half or fewer valid samples is dropped whole.
    drop_env_failures: bool = True
    # Skip prompt groups whose rewards are all equal before any forward pass (their GRPO advantages are all
    # zero); a step left with no group skips its optimizer step too. Off by default: under token-mean the
    # kept tokens then weigh more than in verl's run ("deferred log-probs").
    skip_uniform_reward_groups: bool = False
    # in_flight_pipeline only. The lag bound, in policy versions and per token: a token sampled by v_j may train
    # at step k only if (k - 1) - j <= max_lag (the trainer holds v_{k-1}). 0 trains exactly what verl's sync
    # mode trains; 1 (default) lets generation run on while the trainer updates.
    max_lag: int = 1
    # in_flight_pipeline only. Prompt groups submitted and not finished at once (default: (max_lag + 1) x
    # data.train_batch_size, all the lag bound admits): a slot is refilled once its group finishes and the bound
    # allows, across step boundaries; the replicas queue what they cannot run.
    max_in_flight_prompts: Optional[int] = None
    # in_flight_pipeline only. Prompt groups submitted and not yet taken by the trainer at once: generating, scored
    # or waiting in the buffer (None: only the lag bound limits them). A steady load whose staleness it sets, by
    # Little's law whatever the trainer's pace (a trainer that falls behind stops the feeder, not the bound);
    # `verl-pipe plan` picks it for a lag target. At least one minibatch (ppo_mini_batch_size prompts).
    max_untrained_prompts: Optional[int] = None
    # in_flight_pipeline only. Also load the weights of each minibatch update into the sampler, not only the step's
    # last (versions then advance by a fraction of a step; a load waits while a group due at this step still
    # generates, so no token is sampled by weights newer than the pi_old it trains against). Each load costs the
    # trainer a sync. None: on for the hf rollout, whose server receives the weights beside decoding; off for vLLM,
    # whose weight RPC holds the engine for the whole transfer (each load would stall the sampler).
    load_every_update: Optional[bool] = None
    # Stop the run, with a diagnosis, when the trainer has waited this many seconds for samples without the sampler
    # getting anywhere (no group submitted, started or finished, no sample finished: trainers/stall_watch.py). It
    # must exceed the longest single generation a replica can take. None: wait forever (verl's behaviour).
    stall_timeout_s: Optional[float] = 1800.0
    # Stop the run, with a diagnosis, when this many prompt groups failed with none finished in between (verl drops
    # a failed group and submits another: a reward that raises on every sample would go round for ever, at full
    # speed). A dead actor stops the run sooner, found by the stall watch's look. None: no bound. Ignored when
    # stall_timeout_s is None (the watch is off).
    max_failed_groups_in_a_row: Optional[int] = 100

    @classmethod
    def from_section(cls, mode: str, section: Any) -> "PipelineConfig":
        section = dict(section or {})
        known = {f.name for f in fields(cls)}
        # parameter_sync_step is verl's own per-mode key (the trainers derive it and check a user value);
        # generation_counter names one_off_pipeline's actor for the agent-loop workers (set by the trainer).
        unknown = sorted(set(section) - known - {"parameter_sync_step", "generation_counter"})
        if unknown:
            raise PipelineConfigError(
                f"unknown key(s) trainer.v1.{mode}.{unknown[0]} (all unknown: {unknown}); "
                f"known keys: {sorted(known | {'parameter_sync_step'})}"
            )
        cfg = cls(**{k: v for k, v in section.items() if k in known})
        if not cfg.poll_interval_s > 0:
            raise PipelineConfigError(f"trainer.v1.{mode}.poll_interval_s must be > 0, got {cfg.poll_interval_s}")
        tau = cfg.max_staleness
        if tau is not None and (isinstance(tau, bool) or not isinstance(tau, int) or tau < 0):
            raise PipelineConfigError(
                f"trainer.v1.{mode}.max_staleness must be a whole number >= 0 (or null to keep every sample), "
                f"got {cfg.max_staleness!r}"
            )
        stall = cfg.stall_timeout_s
        if stall is not None and (isinstance(stall, bool) or not isinstance(stall, (int, float)) or not stall > 0):
            raise PipelineConfigError(
                f"trainer.v1.{mode}.stall_timeout_s must be a number of seconds > 0 (or null to wait forever), "
                f"got {stall!r}"
            )
        if cfg.load_every_update is not None and not isinstance(cfg.load_every_update, bool):
            raise PipelineConfigError(
                f"trainer.v1.{mode}.load_every_update must be true, false or null (the rollout decides), "
                f"got {cfg.load_every_update!r}"
            )
        optional = ("max_in_flight_prompts", "max_untrained_prompts", "max_failed_groups_in_a_row")
        for key, floor in (("max_lag", 0), *((name, 1) for name in optional)):
            value = getattr(cfg, key)
            if value is None and key in optional:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < floor:
                raise PipelineConfigError(f"trainer.v1.{mode}.{key} must be a whole number >= {floor}, got {value!r}")
        return cfg
