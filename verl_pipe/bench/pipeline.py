"""``verl-pipe bench pipeline`` (``make bench``): the real trainers on a modelled GPU cluster, on equal GPUs, repeated.

Every schedule runs ``python -m verl.trainer.main_ppo`` on the CPU backend under the latency model
(:mod:`verl_pipe.bench.latency`): generation, reward, update and sync take the time the modelled cluster would,
while a tiny model produces real tokens and the real trainer code schedules them. What makes the comparison fair:

* **Equal GPUs.** Each profile is a named cluster (:mod:`verl_pipe.bench.cluster`: DeepCoder-14B on 32 H100 for
  coding, DeepScaleR-1.5B on 8 H100 for math). verl's ``sync`` generates on all its GPUs and then trains on all of
  them; every separate-pool schedule splits the same GPUs into a sampler and a trainer pool, at the split the
  planner (:mod:`verl_pipe.bench.plan`) chooses for it, with its own knobs tuned the same way (verl's sync cadence
  as our load cadence).
* **One engine for all.** The modelled engine's semantics (``today``: a weight load pauses decoding; ``staged``: a
  labelled what-if) apply to every schedule alike (:class:`~verl_pipe.bench.cluster.Engine`).
* **Rates from physics.** The roofline of the named cluster, calibrated with measured H100 figures; the report
  prints each parameter's source.
* **Repeats.** ``blocks`` paired blocks: in each, every schedule runs once on the same seed (the same response
  lengths), in an order rotated from block to block; ratios are paired per block and reported as a geometric mean
  with a 95% t-interval. Beside each, the what-if model's expectation over 30 seeds (:mod:`.simulate`).
* **What the CPU adds.** The real work the model does not price (the trainer's loop outside the modelled phases,
  a real update or sync longer than its model) is measured per step and taken off where it delayed the step (all
  of it on colocated GPUs; on separate pools what the trainer's wait for samples did not cover), and the report
  shows how much; the old-log-prob pass is inside the modelled update.

Step times are reported in the modelled cluster's seconds (wall seconds divided by the profile's ``time_scale``,
which makes a ``sync`` step last ``unit_s`` of wall time).
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Optional

from verl_pipe.backends.cpu.overrides import ROLLOUT_ENGINES
from verl_pipe.bench import cluster as clusters
from verl_pipe.bench.latency import worker_env_vars
from verl_pipe.bench.plan import DEFAULT_LAG_TARGET, Knobs, Plan, expectation, held_to_verl_lag, plan
from verl_pipe.bench.sampler_trace import (
    SAMPLER_TRACE_ENV,
    admission_losses,
    losses_by_period,
    pool_busy_share,
    sampler_trace_path,
)
from verl_pipe.bench.simulate import SCHEDULES as MODELLED_MODES
from verl_pipe.trainer_modes import TRAINER_MODES


@dataclass(frozen=True)
class Profile:
    name: str
    cluster: str  # key of cluster.CLUSTERS
    # The real batch each run trains (each request stands for request_multiplicity of the cluster's). Its real
    # old-log-prob pass and update run inside the modelled training time, which must hold them: on coding's
    # 61 cluster seconds per wall second, 8 x 8 took 0.13-0.61 s a step beyond it, 8 x 4 0.08-0.11 s.
    prompts: int = 8
    samples: int = 8


PROFILES = {
    "coding": Profile("coding", "deepcoder-14b", samples=4),
    "math": Profile("math", "deepscaler-1.5b"),
}


@dataclass(frozen=True)
class Schedule:
    name: str
    trainer_mode: str  # verl's trainer.v1.trainer_mode, also the what-if model's name of the schedule
    separate_pools: bool


def schedule_name(mode: str) -> str:
    """The benchmark's name of a trainer mode: verl's own carry a ``verl_`` prefix."""
    return mode if TRAINER_MODES[mode].from_plugin else f"verl_{mode}"


def benchmark_schedules() -> dict[str, Schedule]:
    """Every trainer mode of the table that the what-if model can plan (a mode it has no model of cannot be
    priced: :data:`verl_pipe.bench.simulate.SCHEDULES`)."""
    return {
        schedule_name(name): Schedule(schedule_name(name), name, separate_pools=mode.separate_pools)
        for name, mode in TRAINER_MODES.items()
        if name in MODELLED_MODES
    }


SCHEDULES = benchmark_schedules()
BASELINES = ("verl_sync", "verl_separate_async")


@dataclass
class BenchConfig:
    profiles: tuple[str, ...] = ("coding", "math")
    schedules: Optional[tuple[str, ...]] = None  # None: every schedule
    # Paired blocks: every schedule once per block, on the block's seed, in an order rotated per block.
    blocks: int = 5
    # measured steps after the warm-up ones (one-off's first step only samples; its second trains a batch
    # generated during the first, slow, update)
    steps: int = 4
    # a run's first step includes its start-up (seconds of wall time, minutes of cluster time), and the groups a
    # sampler generated meanwhile train, staler than in the steady state, up to two steps later
    warmup_steps: int = 3
    # steps run after the measured ones and not measured: a run trains a fixed number of prompts, and a feeder
    # that stops submitting when it has them all (in_flight_pipeline's) lets its sampler drain during the last
    # steps, which verl's modes, submitting a batch every step, never do; every schedule runs them alike
    cooldown_steps: int = 2
    # wall seconds of one verl sync step on the profile's cluster (sets time_scale). At 3 the real CPU work the model
    # does not price was up to 19% of a trainer-bound schedule's step (in_flight_pipeline under a cap), which the
    # benchmark then takes off; at 6 it was at most 5.4% of any schedule's (the run of 2026-12-01), and 22-52% on a
    # slower box the next day, which max_cpu_share catches: the benchmark then starts again at a longer unit.
    unit_s: float = 6.0
    # The most of a run's measured period that may be taken off as unpriced CPU work. Beyond it the step is more
    # correction than measurement: a trainer whose real update overruns its modelled one never waits for samples,
    # so the run never tested whether the sampler would have kept up (on 2026-12-02 a slower box took 22-52% off at
    # unit_s 6 and put in_flight_pipeline at 60 s a step against the model's 111). The benchmark then starts again
    # at the --unit-s that would hold the CPU's work (CPUBoundRun), or stops naming it.
    max_cpu_share: float = 0.10
    # The real batch of every profile's runs; None: each profile's own (Profile.prompts, Profile.samples).
    prompts: Optional[int] = None
    samples: Optional[int] = None
    engine: str = "today"  # the trainers run on today's engine; "staged" is priced by the what-if model only
    seed: int = 0
    out_dir: Optional[str] = None
    timeout_s: int = 900
    ray_address: Optional[str] = None  # join this cluster instead of starting a private one
    # The rollout engine of every run: "hf" or "vllm". Either way the latency model times each request.
    rollout: str = "hf"
    what_if_seeds: int = 30
    # The sensitivity table (what-if model, re-planned per row): off to save its minutes
    sensitivity: bool = True
    # Plan every schedule at a token lag of at most this (its fastest setting within it), so that a faster schedule
    # is faster at equal or lower token lag; None: each schedule's fastest setting, whatever its lag.
    lag_target: Optional[float] = DEFAULT_LAG_TARGET
    # Hold every verl-pipe schedule to the token lag verl's tuned separate_async is expected at (when that is below
    # the target): "at equal or lower token lag" against verl's best asynchronous setting, not only the target's.
    match_verl_lag: bool = True

    def selected(self) -> tuple[str, ...]:
        return self.schedules or tuple(SCHEDULES)

    def for_profile(self, name: str) -> BenchConfig:
        """This config with the real batch the profile's runs train."""
        profile = PROFILES[name]
        return replace(self, prompts=self.prompts or profile.prompts, samples=self.samples or profile.samples)

    @property
    def batch(self) -> tuple[int, int]:
        """(prompts, samples) of a config for one profile (:meth:`for_profile`)."""
        return self.prompts, self.samples

    def validate(self) -> None:
        unknown = [p for p in self.profiles if p not in PROFILES] + [s for s in self.schedules or () if s not in SCHEDULES]
        if unknown:
            raise ValueError(f"unknown profile/schedule {unknown}; profiles: {list(PROFILES)}, schedules: {list(SCHEDULES)}")
        if self.lag_target is not None and self.lag_target < 0:
            raise ValueError(f"lag_target must be >= 0 (a token lag in policy versions), got {self.lag_target} "
                             "(--lag-target)")  # fmt: skip
        if self.steps < 1 or self.warmup_steps < 1 or self.blocks < 1:
            raise ValueError("steps, warmup_steps and blocks must be >= 1 (the first step of one-off only samples)")
        if not 0 < self.max_cpu_share <= 1:
            raise ValueError(f"max_cpu_share must be in (0, 1], got {self.max_cpu_share} (--max-cpu-share)")
        if self.cooldown_steps < 0:
            raise ValueError(f"cooldown_steps must be >= 0, got {self.cooldown_steps} (--cooldown-steps)")
        if self.samples is not None and self.samples < 2:
            raise ValueError(f"samples must be >= 2 (GRPO groups), got {self.samples} (--samples)")
        if self.rollout not in ROLLOUT_ENGINES:
            raise ValueError(f"rollout must be one of {', '.join(ROLLOUT_ENGINES)}, got {self.rollout!r} (--rollout)")
        if clusters.engine(self.engine).staged:
            raise ValueError(
                "engine=staged is a what-if no engine offers today: the benchmark prices it with the what-if model "
                "(its sensitivity table), and runs the trainers on engine=today only (--engine)"
            )
        for profile in self.profiles:
            named, shaped = clusters.cluster(PROFILES[profile].cluster), self.for_profile(profile)
            clusters.request_multiplicity(named, shaped.prompts * shaped.samples)
            if shaped.prompts % named.workload.minibatches:
                raise ValueError(f"prompts={shaped.prompts} must split into {named.workload.minibatches} minibatches")
        if self.rollout == "vllm":
            from verl_pipe.quickstart import require_vllm

            require_vllm()


# --- one run ------------------------------------------------------------------------------------------------


def verl_steps_per_step(trainer_mode: str, knobs: Knobs, minibatches: int) -> int:
    """verl steps per benchmark step: separate_async syncs once per verl step, so a sync after every minibatch
    update makes each minibatch a verl step of its own."""
    return minibatches if trainer_mode == "separate_async" and knobs.sync_every == 1 else 1


def schedule_overrides(schedule: Schedule, knobs: Knobs, cfg: BenchConfig, minibatches: int, model_path: str,
                       run_dir: str, ray_address: str, latency_path: str, reward_workers: int) -> list[str]:  # fmt: skip
    from verl_pipe.data.embedded import write_embedded_dataset
    from verl_pipe.quickstart import QuickstartConfig, training_overrides

    per_verl_step = verl_steps_per_step(schedule.trainer_mode, knobs, minibatches)
    batch = cfg.prompts // per_verl_step
    quick = QuickstartConfig(
        model=model_path,
        data="embedded",  # the tokens only carry the modelled lengths; its prompts are cut to 128 below
        torch_threads=1,  # every schedule's actors alike
        rollout=cfg.rollout,
        trainer="v1",
        mode=schedule.trainer_mode,
        algorithm="grpo_plus",
        steps=(cfg.warmup_steps + cfg.steps + cfg.cooldown_steps) * per_verl_step,
        prompts_per_step=batch,
        samples_per_prompt=cfg.samples,
        max_response_length=16,  # real tokens are only a carrier: the model sets the modelled lengths
        ray_address=ray_address,
        validate_at_end=False,
        seed=cfg.seed,
        out_dir=run_dir,
    )
    train_file, val_file = write_embedded_dataset(os.path.join(run_dir, "data"), seed=cfg.seed)
    latency_env = worker_env_vars(latency_path)  # every worker: the model, and the rollout servers' timing slot
    samples_per_minibatch = cfg.prompts // minibatches * cfg.samples
    overrides = training_overrides(quick, model_path, train_file, val_file, run_dir) + [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.prompts // minibatches}",
        # one forward/backward per minibatch: the tiny model's real work (which runs inside the modelled update)
        # is then mostly compute, not per-micro-batch overhead, and stays under every schedule's modelled update
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={samples_per_minibatch}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={samples_per_minibatch}",
        "reward.custom_reward_function.path=pkg://verl_pipe.bench.modelled_reward",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.interleaved.concurrency={reward_workers}",
        *(f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}={value}" for name, value in latency_env.items()),
        # every schedule's sampler lane, from the modelled replicas themselves (verl's modes record none)
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{SAMPLER_TRACE_ENV}={sampler_trace_path(run_dir)}",
        "trainer.rollout_data_dir=null",
        # The tiny model's real work should stay small beside the modelled phases: prompts cut to their last 32
        # tokens (the modelled lengths do not depend on them).
        "data.max_prompt_length=32",
        "data.filter_overlong_prompts=False",
        "data.truncation=left",
    ]
    return overrides + knob_overrides(schedule.trainer_mode, knobs, minibatches, cfg.prompts)


def knob_overrides(trainer_mode: str, knobs: Knobs, minibatches: int, prompts: int) -> list[str]:
    """The hydra overrides that give a trainer mode the planner's knobs (the learning bench trains with them too),
    for a run of ``prompts`` prompt groups per step."""
    if trainer_mode == "separate_async":
        per_verl_step = verl_steps_per_step(trainer_mode, knobs, minibatches)
        # verl counts its warm-up in its own batches (a minibatch each when it syncs every update) and submits
        # whole prompts of it (its async modes fetch one prompt at a time)
        ahead = knobs.warmup_prompts(prompts) / (prompts // per_verl_step)
        return [
            f"trainer.v1.separate_async.parameter_sync_step={minibatches // per_verl_step}",
            f"trainer.v1.separate_async.num_warmup_batches={ahead:g}",
        ]
    if trainer_mode == "in_flight_pipeline":
        cap = knobs.max_untrained_prompts(prompts)
        return [
            f"+trainer.v1.in_flight_pipeline.load_every_update={str(knobs.load_every_update).lower()}",
            f"+trainer.v1.in_flight_pipeline.max_lag={knobs.max_lag}",
            *([f"+trainer.v1.in_flight_pipeline.max_untrained_prompts={cap}"] if cap else []),
        ]
    return []


@dataclass
class RunResult:
    schedule: str
    profile: str
    block: int
    seed: int
    layout: str
    gpus: int
    knobs: str
    time_scale: float
    # modelled cluster seconds per step: the measured period less the real CPU work the model does not price on
    # the step's critical path (priced_period), over time_scale; the mean of the measured steps
    step_s: float
    step_s_each: list[float]
    wall_step_s: float  # the measured period, wall seconds
    unpriced_s: float  # wall seconds per step of the trainer's real work outside the modelled phases
    subtracted_s: float  # taken off the period: what of it delayed the step, or the sampler's idle for real CPU work
    token_lag_mean: float
    token_lag_max: float
    sampler_busy: Optional[float]
    trainer_busy: float  # the share of the step the trainer spent in the (modelled) update
    staleness_mean: float = 0.0
    dropped_groups: float = 0.0
    log: str = ""

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * self.step_s

    @property
    def subtracted_share(self) -> float:
        return self.subtracted_s / self.wall_step_s if self.wall_step_s > 0 else 0.0


class CPUBoundRun(RuntimeError):
    """A run's measured period was mostly the CPU's real work, not the modelled cluster's: it cannot be priced.
    ``unit_s``: the --unit-s that would hold that work."""

    def __init__(self, message: str, unit_s: float):
        super().__init__(message)
        self.unit_s = unit_s


def unit_s_to_hold_cpu_work(result: RunResult, unit_s: float, margin: float = 1.25) -> float:
    """The ``--unit-s`` at which the run's modelled training would hold the real work that overran it: the work
    taken off stays the same in wall seconds while the modelled phases grow with the unit, so the unit grows by
    (modelled training + taken off) / modelled training, with a margin for the rest of the loop's work."""
    modelled_train = max(result.trainer_busy * result.wall_step_s, 1e-6)
    return math.ceil(unit_s * margin * (modelled_train + result.subtracted_s) / modelled_train)


def check_cpu_share(result: RunResult, cfg: BenchConfig) -> None:
    """Refuse a run whose step would be more correction than measurement (``cfg.max_cpu_share``), naming the fix."""
    if result.subtracted_share > cfg.max_cpu_share:
        needed = unit_s_to_hold_cpu_work(result, cfg.unit_s)
        raise CPUBoundRun(
            f"block {result.block} {result.profile}/{result.schedule}: {result.subtracted_share:.0%} of its measured "
            f"period ({result.subtracted_s:.2f} of {result.wall_step_s:.2f} wall s a step) was real CPU work the model "
            f"does not price, over the {cfg.max_cpu_share:.0%} the benchmark takes off (--max-cpu-share): this machine "
            f"runs the trainer's real update slower than its modelled one, so the run never tested the sampler. Rerun "
            f"with --unit-s {needed:g} (now {cfg.unit_s:g}), which stretches the modelled phases to hold that work, "
            f"on an otherwise idle machine; see {result.log or 'the run log'}",
            needed,
        )


def _mean(records: list[dict], key: str, default: float = 0.0) -> float:
    values = [float(r[key]) for r in records if key in r]
    return statistics.mean(values) if values else default


def _step_parts(records: list[dict]) -> Optional[tuple[float, float]]:
    """(wait for samples, modelled phases) of one benchmark step's verl records, in wall seconds: the wait (the
    pipelined modes' leaves out the syncs made inside verl's "gen" timer, which ``bench/sync_wall_s`` holds), and
    the syncs and updates as modelled (the real old-log-prob, update and transfer run inside those; where they
    take longer, the excess is unpriced work). None when a record lacks the latency hooks' measures (nothing is
    then taken off)."""
    if not records or any("bench/train_modelled_wall_s" not in r for r in records):
        return None
    wait = sum(float(r.get("pipeline/time/gen_wait_s", r.get("timing_s/gen", 0.0))) for r in records)
    phases = sum(float(r.get("bench/sync_modelled_wall_s", r.get("bench/sync_wall_s", 0.0)))
                 + float(r.get("bench/train_modelled_wall_s", 0.0)) for r in records)  # fmt: skip
    return wait, phases


def priced_period(period: float, wait: float, phases: float, colocated: bool,
                  sampler_lost: float = 0.0) -> tuple[float, float]:  # fmt: skip
    """(the step's period less the real CPU work the model does not price on its critical path, that work).

    What the trainer's loop spends outside the modelled phases (metrics, logging, TransferQueue, any real update
    work longer than its model) is measured as the period less the wait for samples and the modelled phases. On
    colocated GPUs (verl's sync) it all delays the next generation, so it is all taken off. On separate pools the
    sampler runs on meanwhile, and only what the trainer's wait did not already cover delayed the step; but the
    sampler may itself have idled for real CPU work, between a sync and the work the model hands it at once
    (``sampler_lost``, from its trace: :func:`~.sampler_trace.admission_losses`), which delays the step by as
    much as the trainer then waited for samples. The larger of the two delays is taken off.
    """
    unpriced = max(0.0, period - wait - phases)
    if colocated:
        return period - unpriced, unpriced
    critical = max(unpriced - wait, min(sampler_lost, wait), 0.0)
    return period - critical, unpriced


def summarize_run(name: str, profile: str, block: int, seed: int, chosen: Plan, time_scale: float, per_verl_step: int,
                  steps: list[dict], warmup_steps: int, log: str,
                  measured_steps: Optional[int] = None) -> RunResult:  # fmt: skip
    """One run's step times (benchmark steps of ``per_verl_step`` verl steps) from verl's per-step records: the
    ``measured_steps`` after the warm-up ones (None: every one after them; the cool-down steps are left out)."""
    records = [s["data"] for s in sorted(steps, key=lambda s: s["step"]) if "bench/step_end_ts" in s["data"]]
    stamps = [float(r["bench/step_end_ts"]) for r in records][per_verl_step - 1 :: per_verl_step]
    if measured_steps is not None:
        stamps = stamps[: warmup_steps + measured_steps]
        records = records[: (warmup_steps + measured_steps) * per_verl_step]
    periods = [b - a for a, b in zip(stamps[warmup_steps - 1 :], stamps[warmup_steps:])]
    measured = records[warmup_steps * per_verl_step :]
    if not periods:
        raise RuntimeError(f"{name}/{profile}: no measured steps (see {log})")
    trace = sampler_trace_path(os.path.dirname(log)) if log else ""
    # a feeder capped on untrained groups admits when the trainer takes some, not at a load (sampler_trace)
    loads_hand_work = not chosen.knobs.untrained_batches
    sampler_lost = (losses_by_period(admission_losses(trace, loads_hand_work), stamps[warmup_steps - 1 :])
                    if trace else [])  # fmt: skip
    priced, unpriced = [], []
    for index, period in enumerate(periods):
        parts = _step_parts(measured[index * per_verl_step : (index + 1) * per_verl_step])
        lost = sampler_lost[index] if index < len(sampler_lost) else 0.0
        step, work = priced_period(period, *parts, chosen.layout.colocated, lost) if parts else (period, 0.0)
        priced.append(step)
        unpriced.append(work)
    wall = statistics.mean(periods)
    spans_window = (stamps[warmup_steps - 1], stamps[-2] if len(periods) > 1 else stamps[-1])
    sampler_busy = pool_busy_share(trace, *spans_window) if trace else None
    return RunResult(
        schedule=name,
        profile=profile,
        block=block,
        seed=seed,
        layout=chosen.layout.describe(),
        gpus=chosen.layout.gpus,
        knobs=chosen.knobs.describe(chosen.schedule),
        time_scale=time_scale,
        step_s=statistics.mean(priced) / time_scale,
        step_s_each=[p / time_scale for p in priced],
        wall_step_s=wall,
        unpriced_s=statistics.mean(unpriced),
        subtracted_s=wall - statistics.mean(priced),
        # in versions of a benchmark step: separate_async syncing after every update counts a version per verl step,
        # a minibatch, as in_flight_pipeline's loads after every update count half a version each
        token_lag_mean=_mean(measured, "bench/token_lag/mean") / per_verl_step,
        token_lag_max=max((float(r.get("bench/token_lag/max", 0.0)) for r in measured), default=0.0) / per_verl_step,
        sampler_busy=sampler_busy,
        trainer_busy=min(1.0, per_verl_step * _mean(measured, "bench/train_modelled_wall_s") / wall),
        staleness_mean=_mean(measured, "training/off_policy/trajectory_staleness/mean") / per_verl_step,
        dropped_groups=_mean(measured, "in_flight/dropped_groups"),
        log=log,
    )


# --- paired comparison --------------------------------------------------------------------------------------

# Two-sided 95% quantiles of Student's t, by degrees of freedom.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}  # fmt: skip


def t95(df: int) -> float:
    if df < 1:
        return math.inf
    known = [d for d in _T95 if d <= df]
    return _T95[max(known)] if df <= 30 else 1.96


@dataclass(frozen=True)
class PairedRatio:
    """``baseline step / schedule step`` over paired blocks: the geometric mean and its 95% interval."""

    mean: float
    low: float
    high: float
    blocks: int

    @property
    def faster(self) -> Optional[bool]:
        """True or False when the interval excludes 1, None when it does not (no claim)."""
        if self.low > 1:
            return True
        if self.high < 1:
            return False
        return None

    def describe(self) -> str:
        return f"{self.mean:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def paired_ratio(baseline_steps: list[float], steps: list[float]) -> PairedRatio:
    logs = [math.log(b / s) for b, s in zip(baseline_steps, steps)]
    mean = statistics.mean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
    return PairedRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


def compare(results: list[RunResult]) -> dict[str, Any]:
    """Per profile and schedule: the mean step, and the paired ratio against each baseline over the blocks."""
    report: dict[str, Any] = {}
    for profile in sorted({r.profile for r in results}):
        by = {}
        for r in results:
            if r.profile == profile:
                by.setdefault(r.schedule, {})[r.block] = r
        entry = {}
        for name, runs in by.items():
            row: dict[str, Any] = {"step_s": statistics.mean(r.step_s for r in runs.values()), "ratios": {}}
            for base in BASELINES:
                blocks = sorted(set(runs) & set(by.get(base, {})))
                if base != name and blocks:
                    ratio = paired_ratio([by[base][b].step_s for b in blocks], [runs[b].step_s for b in blocks])
                    row["ratios"][base] = asdict(ratio) | {"faster": ratio.faster}
            entry[name] = row
        report[profile] = entry
    return report


# --- the whole benchmark ------------------------------------------------------------------------------------


class UnfairComparison(RuntimeError):
    """Two schedules of one profile would run on different GPU counts or engines: the benchmark refuses."""


def check_equal_gpus(plans: dict[str, Plan], named: clusters.NamedCluster) -> None:
    """Every schedule holds the whole cluster (sync all of it in turn, the others split it)."""
    unequal = {name: chosen.layout.gpus for name, chosen in plans.items() if chosen.layout.gpus != named.gpus}
    if unequal:
        raise UnfairComparison(f"{named.name} has {named.gpus} GPUs, but these schedules would use {unequal}")


def check_same_engine(models: dict[str, Any], engine: clusters.Engine) -> None:
    """Every schedule's latency model has the profile's engine: no schedule gets an option another cannot."""
    odd = {name: model.staged_loads for name, model in models.items() if model.staged_loads != engine.staged}
    if odd:
        raise UnfairComparison(f"engine {engine.name} for every schedule, but staged loads differ for {odd}")


def run_model(named: clusters.NamedCluster, chosen: Plan, engine: clusters.Engine, cfg: BenchConfig, seed: int,
              time_scale: float):  # fmt: skip
    """The latency model one schedule's run gets: its layout on the cluster, the engine, the block's seed."""
    return clusters.latency_model(named, chosen.layout, engine, cfg.prompts * cfg.samples, seed=seed,
                                  time_scale=time_scale)  # fmt: skip


@dataclass
class ProfilePlan:
    profile: str
    cluster: str
    time_scale: float
    plans: dict[str, Plan] = field(default_factory=dict)
    what_if: dict[str, dict] = field(default_factory=dict)  # schedule -> simulate.Summary as a dict


def lag_bound_for(schedule_name: str, cfg: BenchConfig, prepared: "ProfilePlan") -> Optional[float]:
    """The token lag a schedule is planned at: the target, and for ours with ``match_verl_lag`` no more than verl's
    separate_async is expected at (when it is planned in this run)."""
    if schedule_name in BASELINES or not cfg.match_verl_lag:
        return cfg.lag_target
    return held_to_verl_lag(cfg.lag_target, prepared.what_if.get("verl_separate_async", {}).get("token_lag"))


def prepare_profile(name: str, cfg: BenchConfig, progress=print) -> ProfilePlan:
    """The profile's plans (layout and knobs per schedule) and their what-if expectations."""
    cfg = cfg.for_profile(name)
    named = clusters.cluster(PROFILES[name].cluster)
    engine = clusters.engine(cfg.engine)
    prepared = ProfilePlan(profile=name, cluster=named.name, time_scale=1.0)
    # verl's modes first: with match_verl_lag, ours are held to the lag verl's separate_async is expected at
    order = sorted(cfg.selected(), key=lambda schedule_name: schedule_name not in BASELINES)
    for schedule_name in order:
        schedule = SCHEDULES[schedule_name]
        chosen = plan(named, engine, schedule.trainer_mode, cfg.prompts, cfg.samples,
                      max_token_lag=lag_bound_for(schedule_name, cfg, prepared))  # fmt: skip
        prepared.plans[schedule_name] = chosen
        prepared.what_if[schedule_name] = asdict(
            expectation(named, engine, chosen, cfg.prompts, cfg.samples, seeds=cfg.what_if_seeds)
        )
        progress(f"{name:7s} {schedule_name:22s} planned: {chosen.layout.describe()}"
                 f"{', ' + chosen.knobs.describe(chosen.schedule) if chosen.knobs.describe(chosen.schedule) else ''}; "
                 f"what-if {prepared.what_if[schedule_name]['step_s']:.1f} s/step")  # fmt: skip
    prepared.plans = {schedule_name: prepared.plans[schedule_name] for schedule_name in cfg.selected()}
    prepared.what_if = {schedule_name: prepared.what_if[schedule_name] for schedule_name in cfg.selected()}
    check_equal_gpus(prepared.plans, named)
    sync_plan = prepared.plans.get("verl_sync") or plan(named, engine, "sync", cfg.prompts, cfg.samples)
    prepared.time_scale = cfg.unit_s / sync_plan.step_s
    return prepared


# A benchmark whose run is CPU-bound starts again on a longer clock at most this many times.
MAX_UNIT_RAISES = 2


def _measure_blocks(cfg: BenchConfig, prepared: dict[str, ProfilePlan], out_dir: str, model_path: str,
                    address: str, driver: Any, progress) -> list[RunResult]:  # fmt: skip
    """Every block's runs, each schedule of each profile once per block in the block's order; stops at a run that
    is more unpriced CPU work than measurement (:func:`check_cpu_share`)."""
    engine = clusters.engine(cfg.engine)
    schedules = list(cfg.selected())
    results: list[RunResult] = []
    for block in range(cfg.blocks):
        seed = cfg.seed + block
        order = schedules[block % len(schedules) :] + schedules[: block % len(schedules)]
        for profile_name in cfg.profiles:
            profile, shaped = prepared[profile_name], cfg.for_profile(profile_name)
            named = clusters.cluster(profile.cluster)
            models = {name: run_model(named, chosen, engine, shaped, seed, profile.time_scale)
                      for name, chosen in profile.plans.items()}  # fmt: skip
            check_same_engine(models, engine)
            for schedule_name in order:
                schedule, chosen, model = SCHEDULES[schedule_name], profile.plans[schedule_name], models[schedule_name]
                run_dir = os.path.join(out_dir, f"block{block}", profile_name, schedule_name)
                os.makedirs(run_dir, exist_ok=True)
                latency_path = os.path.join(run_dir, "latency_model.json")
                with open(latency_path, "w", encoding="utf-8") as fh:
                    fh.write(model.to_json())
                minibatches = named.workload.minibatches
                per_verl_step = verl_steps_per_step(schedule.trainer_mode, chosen.knobs, minibatches)
                overrides = schedule_overrides(schedule, chosen.knobs, replace(shaped, seed=seed), minibatches,
                                               model_path, run_dir, address, latency_path, model.reward_workers)  # fmt: skip
                t0 = time.time()
                rc, steps, log = driver.run(overrides, run_dir, timeout=cfg.timeout_s)
                if rc != 0:
                    raise RuntimeError(f"block {block} {profile_name}/{schedule_name} failed (exit {rc}); see {log}")
                result = summarize_run(schedule_name, profile_name, block, seed, chosen, profile.time_scale,
                                       per_verl_step, steps, cfg.warmup_steps, log, cfg.steps)  # fmt: skip
                results.append(result)
                progress(
                    f"block {block} {profile_name:7s} {schedule_name:22s} step {result.step_s:7.1f} s "
                    f"(wall {result.wall_step_s:5.2f} s, less {result.subtracted_share:5.1%} unpriced CPU work; run "
                    f"{time.time() - t0:4.0f} s)"
                )
                check_cpu_share(result, cfg)
    return results


def measure_on_a_clock_that_holds_the_cpu(cfg: BenchConfig, prepared: dict[str, ProfilePlan], out_dir: str,
                                          measure: Callable[[BenchConfig], list[RunResult]],
                                          progress=print) -> tuple[BenchConfig, list[RunResult]]:  # fmt: skip
    """``measure(cfg)``, started again on a longer clock when a run was CPU-bound (a slower machine than the unit was
    set for): the same plans, every profile's time scale stretched to the unit the run named, the runs so far set
    aside beside ``out_dir`` (nothing is deleted), at most ``MAX_UNIT_RAISES`` times. Returns the config measured
    under (its ``unit_s``) and the results."""
    for raised in range(MAX_UNIT_RAISES + 1):
        try:
            return cfg, measure(cfg)
        except CPUBoundRun as error:
            if raised == MAX_UNIT_RAISES or error.unit_s <= cfg.unit_s:
                raise
            aside = f"{out_dir}-cpu-bound-at-unit-s-{cfg.unit_s:g}"
            os.rename(out_dir, aside)
            os.makedirs(out_dir)
            progress(f"{error}\n  runs so far moved to {aside}; starting again at --unit-s {error.unit_s:g}")
            for profile in prepared.values():
                profile.time_scale *= error.unit_s / cfg.unit_s
            cfg = replace(cfg, unit_s=error.unit_s)
    raise AssertionError("unreachable: the last attempt returns or raises")


def run_bench(cfg: BenchConfig, progress=print) -> dict[str, Any]:
    """Every (block, profile, schedule) run on one private Ray cluster through one warm verl driver; returns the
    JSON-ready report."""
    from verl_pipe.local_jobs import local_ray_head
    from verl_pipe.bench.warm_driver import WarmDriver
    from verl_pipe.models import build_tiny_qwen2

    cfg.validate()
    out_dir = os.path.abspath(cfg.out_dir or os.path.join("runs", time.strftime("bench-pipeline-%Y%m%d-%H%M%S")))
    os.makedirs(out_dir, exist_ok=True)
    started = time.time()
    prepared = {name: prepare_profile(name, cfg, progress) for name in cfg.profiles}
    # vLLM's CPU attention serves head sizes from 32 up; the default tiny model's 4 heads of 16 need twice the width.
    model_path = build_tiny_qwen2(hidden_size=128) if cfg.rollout == "vllm" else build_tiny_qwen2()
    head = contextlib.nullcontext(cfg.ray_address) if cfg.ray_address else local_ray_head(num_cpus=16)
    with head as address, WarmDriver() as driver:
        cfg, results = measure_on_a_clock_that_holds_the_cpu(
            cfg, prepared, out_dir, lambda shaped: _measure_blocks(shaped, prepared, out_dir, model_path, address,
                                                                   driver, progress), progress)  # fmt: skip
    report = {
        "config": asdict(cfg),
        "profiles": {
            name: {"cluster": p.cluster, "time_scale": p.time_scale, "what_if": p.what_if,
                   **dict(zip(("prompts", "samples"), cfg.for_profile(name).batch)),
                   "plans": {s: {"layout": c.layout.describe(), "gpus": c.layout.gpus,
                                 "knobs": c.knobs.describe(c.schedule), "knob_values": asdict(c.knobs),
                                 "meets_lag_target": c.meets_lag_target, "lag_bound": lag_bound_for(s, cfg, p)}
                             for s, c in p.plans.items()},
                   "sources": clusters.cluster(p.cluster).roofline().sources()}
            for name, p in prepared.items()
        },  # fmt: skip
        "runs": [asdict(r) | {"gpu_seconds": r.gpu_seconds, "subtracted_share": r.subtracted_share} for r in results],
        "comparison": compare(results),
    }
    if cfg.sensitivity:
        from verl_pipe.bench.sensitivity import sensitivity_table

        report["sensitivity"] = {
            name: sensitivity_table(PROFILES[name].cluster, *cfg.for_profile(name).batch, lag_target=cfg.lag_target,
                                    match_verl_lag=cfg.match_verl_lag)
            for name in cfg.profiles
        }
    from verl_pipe.bench.schedule_lanes import schedule_panels
    from verl_pipe.plot import plot_schedules

    report["timeline_png"] = plot_schedules(schedule_panels(report, block=0), os.path.join(out_dir, "schedules.png"))
    report["wall_s"] = time.time() - started
    report["out_dir"] = out_dir
    return report


def plan_of(meta: dict[str, Any], schedule_name: str) -> tuple[Plan, int]:
    """A report's plan of a schedule, as the run that made it chose it (layout and knobs), and the verl steps its
    runs took per benchmark step."""
    named = clusters.cluster(meta["cluster"])
    saved = meta["plans"][schedule_name]
    layout = (clusters.colocated(named) if "colocated" in saved["layout"]
              else clusters.split(named, int(saved["layout"].split()[0])))  # fmt: skip
    chosen = Plan(SCHEDULES[schedule_name].trainer_mode, layout, Knobs(**saved.get("knob_values", {})),
                  meta["what_if"][schedule_name]["step_s"], meets_lag_target=saved.get("meets_lag_target", True))
    return chosen, verl_steps_per_step(chosen.schedule, chosen.knobs, named.workload.minibatches)


def reread_runs(report: dict[str, Any]) -> dict[str, Any]:
    """The report with every run summarized again from the records its runs left (``verl_metrics.jsonl`` and the
    sampler trace beside each run's log), by this version of the benchmark's reading: a change in how runs are read
    applies to measurements already made, without running them again. The plans and what-ifs stay the report's."""
    from verl_pipe.local_jobs import read_steps

    cfg = report["config"]
    results = []
    for run in report["runs"]:
        meta = report["profiles"][run["profile"]]
        chosen, per_verl_step = plan_of(meta, run["schedule"])
        steps = read_steps(os.path.dirname(run["log"]))
        if not steps:
            raise ValueError(f"{run['log']}: the run's records (verl_metrics.jsonl beside it) are gone")
        results.append(summarize_run(run["schedule"], run["profile"], run["block"], run["seed"], chosen,
                                     run["time_scale"], per_verl_step, steps, cfg["warmup_steps"], run["log"],
                                     cfg.get("steps")))  # fmt: skip
    return report | {
        "runs": [asdict(r) | {"gpu_seconds": r.gpu_seconds, "subtracted_share": r.subtracted_share} for r in results],
        "comparison": compare(results),
    }


# A what-if ratio within this of 1 is parity: a measured difference the model does not predict is not claimed.
WHAT_IF_PARITY = 0.02
# A faster schedule is faster at equal or lower token lag than an asynchronous baseline only if its measured lag is
# at most the baseline's plus this (the lags are means of a few steps' tags). Against verl's on-policy sync the
# lags are printed, and every asynchronous schedule trades staleness for speed by design.
LAG_PARITY = 0.01


def format_report(report: dict[str, Any]) -> str:
    """The tables a user reads: per profile, the sources, every schedule's step with its paired ratios and the
    what-if expectation, then the sensitivity table."""
    lag_target = report["config"].get("lag_target")
    max_cpu_share = report["config"].get("max_cpu_share", BenchConfig.max_cpu_share)
    lines = [f"engine: {report['config']['engine']} ({clusters.engine(report['config']['engine']).summary}); "
             f"{report['config']['blocks']} paired blocks; step times in the modelled cluster's seconds"
             + ("" if lag_target is None else f"; every schedule planned at token lag <= {lag_target:g}")]  # fmt: skip
    if report["config"].get("match_verl_lag"):
        lines.append("verl-pipe's schedules held to the token lag verl's separate_async is planned at, where lower")
    runs = report["runs"]
    for profile, comparison in report["comparison"].items():
        meta = report["profiles"][profile]
        named = clusters.cluster(meta["cluster"])
        lines += ["", f"profile {profile}: {named.recipe}, {named.gpus} x {named.gpu}"]
        lines += [f"  {name:28s} {value:55s} {source}" for name, value, source in meta["sources"]]
        header = (f"  {'schedule':22s} {'layout (GPUs)':24s} {'step s':>7s} {'what-if':>8s} {'vs verl_sync':>20s} "
                  f"{'vs separate_async':>20s} {'tok lag':>7s} {'what-if':>7s} {'smp busy':>8s} {'trn busy':>8s} {'GPU-s':>7s} "
                  f"{'CPU sub':>8s}  knobs")  # fmt: skip
        lines += ["", header]
        for name, row in comparison.items():
            own = [r for r in runs if r["profile"] == profile and r["schedule"] == name]
            ratios = {base: row["ratios"].get(base) for base in BASELINES}
            cells = []
            for base in BASELINES:
                ratio = ratios[base]
                cells.append("-" if ratio is None else f"{ratio['mean']:.2f}x [{ratio['low']:.2f}, {ratio['high']:.2f}]")
            busy = [r["sampler_busy"] for r in own if r["sampler_busy"] is not None]
            subtracted = statistics.mean(r["subtracted_share"] for r in own)
            plan_meta = meta["plans"][name]
            lines.append(
                f"  {name:22s} {plan_meta['layout']:24s} {row['step_s']:7.1f} {meta['what_if'][name]['step_s']:8.1f} "
                f"{cells[0]:>20s} {cells[1]:>20s} {statistics.mean(r['token_lag_mean'] for r in own):7.2f} "
                f"{meta['what_if'][name].get('token_lag', float('nan')):7.2f} "
                f"{(statistics.mean(busy) if busy else float('nan')):8.0%} "
                f"{statistics.mean(r['trainer_busy'] for r in own):8.0%} "
                f"{statistics.mean(r['gpu_seconds'] for r in own):7.0f} "
                f"{subtracted:8.1%}  {plan_meta['knobs'] or '-'}"
                + ("" if plan_meta.get("meets_lag_target", True) else " (no setting within the lag target)")
            )
        lines.append("  (CPU sub: the share of the measured period taken off as real CPU work the model does not "
                     "price, where it delayed the step)")  # fmt: skip
        claims = [(name, base, ratio) for name, row in comparison.items() for base, ratio in row["ratios"].items()]
        for name, base, ratio in claims:
            if name not in BASELINES and ratio["faster"] is not None:
                verdict = "faster than" if ratio["faster"] else "slower than"
                lags = {n: statistics.mean(r["token_lag_mean"] for r in runs if r["profile"] == profile
                                           and r["schedule"] == n) for n in (name, base)}  # fmt: skip
                line = (f"  {name} is {verdict} {base} (interval {ratio['low']:.2f}-{ratio['high']:.2f}x; token lag "
                        f"{lags[name]:.2f} against {lags[base]:.2f})")  # fmt: skip
                expected = meta["what_if"][base]["step_s"] / meta["what_if"][name]["step_s"]
                cpu_bound = sorted({r["schedule"] for r in runs if r["profile"] == profile and r["schedule"] in
                                    (name, base) and r["subtracted_share"] > max_cpu_share})  # fmt: skip
                if cpu_bound:  # a report read again, made before the check or under a laxer --max-cpu-share
                    line += (f"; {' and '.join(cpu_bound)} took off more than {max_cpu_share:.0%} of a step as "
                             "unpriced CPU work: not priced, no claim")  # fmt: skip
                elif not (expected > 1 + WHAT_IF_PARITY if ratio["faster"] else expected < 1 - WHAT_IF_PARITY):
                    # the CPU's unpriced work does not hit every schedule alike: a measured edge the model
                    # does not predict is no claim about the cluster
                    line += f"; the what-if model expects {expected:.2f}x: not a claim about the cluster"
                elif ratio["faster"] and lags[base] > 0 and lags[name] > lags[base] + LAG_PARITY:
                    line += "; at a higher token lag: not a claim at equal lag"
                lines.append(line)
    if report.get("sensitivity"):
        from verl_pipe.bench.sensitivity import format_sensitivity

        lines += ["", *format_sensitivity(report["sensitivity"])]
    lines.append(f"wall time {report['wall_s']:.0f} s; runs in {report['out_dir']}")
    if report.get("timeline_png"):
        lines.append(f"block 0's schedules side by side: {report['timeline_png']}")
    return "\n".join(lines)
