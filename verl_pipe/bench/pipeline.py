"""``verl-pipe bench pipeline``: the real trainers on a simulated GPU cluster, against verl's own modes.

Every schedule runs ``python -m verl.trainer.main_ppo`` on the CPU backend with the same data, seeds and
latency model (:mod:`verl_pipe.bench.latency`): generation, reward, update and sync take the time the
modelled cluster would, while the tiny model produces real tokens and the real trainer code schedules them.
Schedules, all V1:

* ``verl_sync_reward_after``: verl's ``sync`` mode with the reward spent after generation (the thesis'
  baseline; verl's V1 trainer always streams rule rewards, so the latency model moves it);
* ``verl_sync``: verl's ``sync`` mode as it ships (rewards stream while the rest of the batch generates);
* ``verl_separate_async``: verl's ``separate_async`` (separate pools, minibatch streaming, one warm-up batch);
* ``minibatch_pipeline``, ``one_off_pipeline`` and ``in_flight_pipeline``: ours (the last never drains its sampler
  and loads new weights between decode steps: after every minibatch update, received beside decoding as the hf
  server does, with the second weight buffer's memory taken from the modelled replica's KV cache);
* ``in_flight_pipeline_stalling``: the same mode on an engine whose loads hold it for the transfer (vLLM's weight
  RPC does), loading once a step, its default there; ``in_flight_pipeline_lag2``: lag bound 2.

Each phase time is held the same in every schedule (the model's per-request, per-token and per-sync costs),
as the ideal bounds assume; what differs is only how the schedule overlaps them. The step time is the loop's
real period (wall clock between consecutive steps' metrics), averaged after ``warmup_steps``.

Profiles set the modelled phase times as shares of one batch's generation time ``unit_s`` (wall seconds):
coding gen 1.0 : reward 0.5 : train 0.5 : sync 0.05 (the issue's shares; the thesis' coding runs spend about
as long scoring as training), and math with reward ~0.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from verl_pipe.backends.cpu.overrides import ROLLOUT_ENGINES
from verl_pipe.bench.latency import LatencyModel, worker_env_vars
from verl_pipe.bench.replica_model import (
    SAMPLER_TRACE_ENV,
    batch_generation_s,
    busy_share,
    load_busy_spans,
    sampler_trace_path,
)


@dataclass(frozen=True)
class Profile:
    name: str
    reward: float  # shares of one batch's generation time
    train: float = 0.5
    sync: float = 0.05


PROFILES = {"coding": Profile("coding", reward=0.5), "math": Profile("math", reward=0.0)}


@dataclass(frozen=True)
class Schedule:
    name: str
    trainer_mode: str
    separate_pools: bool
    reward_after_generation: bool = False
    extra_overrides: tuple[str, ...] = ()  # the mode's own options
    # The modelled replica receives in-flight loads beside decoding (LatencyModel.with_staged_loads: no stall, the
    # weight buffer's room taken from its KV cache), as the hf server does.
    staged_loads: bool = False


SCHEDULES = {
    s.name: s
    for s in (
        Schedule("verl_sync_reward_after", "sync", separate_pools=False, reward_after_generation=True),
        Schedule("verl_sync", "sync", separate_pools=False),
        Schedule("verl_separate_async", "separate_async", separate_pools=True),
        Schedule("minibatch_pipeline", "minibatch_pipeline", separate_pools=True),
        Schedule("one_off_pipeline", "one_off_pipeline", separate_pools=True),
        Schedule("in_flight_pipeline", "in_flight_pipeline", separate_pools=True, staged_loads=True),
        Schedule("in_flight_pipeline_stalling", "in_flight_pipeline", separate_pools=True,
                 extra_overrides=("+trainer.v1.in_flight_pipeline.load_every_update=false",)),
        Schedule("in_flight_pipeline_lag2", "in_flight_pipeline", separate_pools=True, staged_loads=True,
                 extra_overrides=("+trainer.v1.in_flight_pipeline.max_lag=2",)),  # fmt: skip
    )
}
BASELINES = ("verl_sync_reward_after", "verl_sync", "verl_separate_async")
# What runs when no schedules are named: every schedule on coding; on math (reward ~0) the sync baselines, verl's
# separate_async and the two off-policy pipelines (minibatch's on-policy overlap is a coding-profile question).
DEFAULT_SCHEDULES = {
    "coding": tuple(SCHEDULES),
    "math": ("verl_sync_reward_after", "verl_sync", "verl_separate_async", "one_off_pipeline", "in_flight_pipeline"),
}
SYNC_BASELINES = ("verl_sync_reward_after", "verl_sync")
MINIBATCHES = 2  # per step, in every schedule that splits its update (minibatch_ideal assumes the same)  # the ones one-off's ideal bound is defined against


@dataclass
class BenchConfig:
    profiles: tuple[str, ...] = ("coding", "math")
    schedules: Optional[tuple[str, ...]] = None  # None: DEFAULT_SCHEDULES of each profile
    # measured steps, after the warm-up ones: even, because in_flight_pipeline's steps alternate (a step whose
    # batch generated during the previous one, then one that waits for its stragglers)
    steps: int = 4
    # one-off's step 1 only samples and its step 2 trains a batch generated during step 1's (slow, first-call)
    # update: the steady state starts at step 3
    warmup_steps: int = 2
    unit_s: float = 4.0  # wall seconds one batch's generation takes under the model
    prompts: int = 4
    samples: int = 8  # DeepCoder's n
    reward_workers: int = 4
    seed: int = 0
    out_dir: Optional[str] = None
    timeout_s: int = 900
    ray_address: Optional[str] = None  # join this cluster instead of starting a private one
    # The rollout engine of every run: "hf" or "vllm" (verl's vLLM rollout on vLLM's CPU build). Either way the
    # latency model times each request (the generation-timing slot both servers honour).
    rollout: str = "hf"
    # Batches' worth of requests one sampler replica runs at once (the rest queue): its KV cache's capacity. The
    # modelled 14B replica (TP-2 H100) has ~110 GB for KV at 196 KB a token, ~560K tokens: 64 requests of ~9K
    # tokens at their longest, two batches of DeepCoder's size here.
    replica_batches: int = 2

    def schedules_for(self, profile: str) -> tuple[str, ...]:
        return self.schedules or DEFAULT_SCHEDULES[profile]

    def validate(self) -> None:
        unknown = [p for p in self.profiles if p not in PROFILES] + [s for s in self.schedules or () if s not in SCHEDULES]
        if unknown:
            raise ValueError(f"unknown profile/schedule {unknown}; profiles: {list(PROFILES)}, schedules: {list(SCHEDULES)}")
        if self.steps < 1 or self.warmup_steps < 1:
            raise ValueError("steps and warmup_steps must be >= 1 (the first step of one-off only samples)")
        if self.prompts % 2 or self.samples < 2:
            raise ValueError("prompts must be even (two minibatches per step) and samples >= 2 (GRPO groups)")
        if self.replica_batches < 1:
            raise ValueError(f"replica_batches must be >= 1 (--replica-batches), got {self.replica_batches}")
        if self.rollout not in ROLLOUT_ENGINES:
            raise ValueError(f"rollout must be one of {', '.join(ROLLOUT_ENGINES)}, got {self.rollout!r} (--rollout)")
        if self.rollout == "vllm":
            from verl_pipe.quickstart import require_vllm

            require_vllm()


# --- calibration: the profile's shares -> latency-model parameters --------------------------------------------


def calibrate(profile: Profile, cfg: BenchConfig, trials: int = 400) -> LatencyModel:
    """The latency model whose batch generation takes ``unit_s`` and whose other phases follow ``profile``.

    A batch's generation (all its requests on one modelled replica, until the last ends) and its tokens are
    averaged over batches drawn from the model's own length distribution.
    """
    requests = cfg.prompts * cfg.samples
    # The replica's KV cache bounds what it runs at once: a schedule that keeps more batches in flight than it holds
    # queues them rather than decoding them for free.
    base = LatencyModel(
        seed=cfg.seed, reward_workers=cfg.reward_workers, replica_concurrency=requests * cfg.replica_batches
    )
    batch_s, tokens = [], []
    for trial in range(trials):
        lengths = [base.response_tokens([10_000 + trial], i) for i in range(requests)]
        batch_s.append(batch_generation_s(base, lengths))
        tokens.append(sum(lengths))
    gen_s = statistics.mean(batch_s)
    kilotokens = statistics.mean(tokens) / 1000.0
    return replace(
        base,
        time_scale=cfg.unit_s / gen_s,
        train_s_per_ktoken=profile.train * gen_s / kilotokens,
        sync_s=profile.sync * gen_s,
        reward_s=profile.reward * gen_s / math.ceil(requests / cfg.reward_workers),
    )


# --- one run ------------------------------------------------------------------------------------------------


def schedule_overrides(schedule: Schedule, cfg: BenchConfig, model_path: str, run_dir: str, ray_address: str,
                       latency_path: str) -> list[str]:  # fmt: skip
    from verl_pipe.data.embedded import write_embedded_dataset
    from verl_pipe.quickstart import QuickstartConfig, training_overrides

    quick = QuickstartConfig(
        model=model_path,
        data="embedded",  # the tokens only carry the modelled lengths; its prompts are cut to 128 below
        torch_threads=1,  # every schedule's actors alike (the modelled times dominate; as measured before)
        rollout=cfg.rollout,
        trainer="v1",
        algorithm="grpo_plus",
        steps=cfg.warmup_steps + cfg.steps,
        prompts_per_step=cfg.prompts,
        samples_per_prompt=cfg.samples,
        max_response_length=16,  # real tokens are only a carrier: the model sets the modelled lengths
        ray_address=ray_address,
        validate_at_end=False,
        seed=cfg.seed,
        out_dir=run_dir,
    )
    train_file, val_file = write_embedded_dataset(os.path.join(run_dir, "data"), seed=cfg.seed)
    latency_env = worker_env_vars(latency_path)  # every worker: the model, and the rollout servers' timing slot
    overrides = training_overrides(quick, model_path, train_file, val_file, run_dir) + [
        f"trainer.v1.trainer_mode={schedule.trainer_mode}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.prompts // MINIBATCHES}",
        "reward.custom_reward_function.path=pkg://verl_pipe.bench.modelled_reward",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.interleaved.concurrency={cfg.reward_workers}",
        *(f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}={value}" for name, value in latency_env.items()),
        # every schedule's sampler lane, from the modelled replicas themselves (verl's modes record none)
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{SAMPLER_TRACE_ENV}={sampler_trace_path(run_dir)}",
        "trainer.rollout_data_dir=null",
        # The tiny model's real work should stay small beside the modelled phases (and steady under load):
        # prompts cut to their last 128 tokens; the modelled lengths do not depend on them.
        "data.max_prompt_length=128",
        "data.filter_overlong_prompts=False",
        "data.truncation=left",
    ]
    if schedule.separate_pools:
        overrides += [
            "actor_rollout_ref.hybrid_engine=False",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
        ]
    overrides += list(schedule.extra_overrides)
    if schedule.trainer_mode == "separate_async":
        overrides.append(f"trainer.v1.separate_async.parameter_sync_step={MINIBATCHES}")
    return overrides


@dataclass
class RunResult:
    schedule: str
    profile: str
    step_s: float  # mean loop period over the measured steps
    step_s_each: list[float]
    gen_s: float  # the trainer's wait for samples (verl's timing_s/gen), mean
    sync_s: float
    reward_after_s: float  # reward spent after generation (the baseline only)
    reward_exposed_s: float  # streamed reward still running after the last sample finished generating
    trainer_bubble_frac: float
    sampler_idle_frac: Optional[float]
    reward_hidden_frac: Optional[float]
    staleness_mean: float = 0.0  # policy versions between the samples trained and the trainer's weights
    # policy versions a trained sample was generated across (1: one; 2: a sync aborted and resumed it), mean
    spans_mean: float = 1.0
    # trained samples whose modelled length was lost on a resume and defaulted to the median, per step
    modelled_tokens_defaulted: float = 0.0
    # one_off_pipeline: syncs per step that went out as soon as the batch generated, before its last reward
    syncs_before_last_reward: float = 0.0
    # policy versions between each trained token and the trainer's weights, token-weighted mean and max over the
    # measured steps, and the share of samples whose tokens span more than one version (from the modelled replicas)
    token_lag_mean: float = 0.0
    token_lag_max: float = 0.0
    spanning_share: float = 0.0
    # in_flight_pipeline: prompt groups per step the trainer waited for (due under the lag bound) or dropped
    held_back_groups: float = 0.0
    dropped_groups: float = 0.0
    # in_flight_pipeline: minibatch updates' weights loaded into the sampler over the whole run (besides each step's)
    update_loads_sent: float = 0.0
    log: str = ""

    @property
    def train_s(self) -> float:
        """Everything the trainer does besides waiting for samples, syncing and scoring late."""
        return max(0.0, self.step_s - self.gen_s - self.sync_s - self.reward_after_s)


def _mean(records: list[dict], key: str, default: float = 0.0) -> float:
    values = [float(r[key]) for r in records if key in r]
    return statistics.mean(values) if values else default


def summarize_run(schedule: Schedule, profile: Profile, steps: list[dict], warmup_steps: int, log: str) -> RunResult:
    """One schedule's measured phase times from verl's per-step records."""
    records = [s["data"] for s in sorted(steps, key=lambda s: s["step"]) if "bench/step_end_ts" in s["data"]]
    stamps = [float(r["bench/step_end_ts"]) for r in records]
    # the period of step k is stamp[k] - stamp[k-1]: measured steps are the ones after the warm-up
    periods = [b - a for a, b in zip(stamps[warmup_steps - 1 :], stamps[warmup_steps:])]
    measured = records[warmup_steps:]
    if not periods:
        raise RuntimeError(f"{schedule.name}/{profile.name}: no measured steps (see {log})")
    step_s = statistics.mean(periods)
    gen_s = _mean(measured, "timing_s/gen")
    sync_s = _mean(measured, "pipeline/time/sync_s", _mean(measured, "timing_s/update_weights"))
    reward_after_s = _mean(measured, "bench/reward_after_generation_s")
    exposed = _mean(measured, "reward/exposed_s")
    if "pipeline/trainer_bubble_frac" in (measured[0] if measured else {}):
        bubble = _mean(measured, "pipeline/trainer_bubble_frac")
    else:
        bubble = min(1.0, (gen_s + sync_s + reward_after_s) / step_s)
    spans = load_busy_spans(sampler_trace_path(os.path.dirname(log))) if log else []
    if spans:  # the modelled replicas' own record: the same measure for every schedule
        # Up to the start of the last step: a run's last batch leaves nothing to generate during its update (unless
        # the schedule generates prompts it never trains, as verl's separate_async does), which is the end of the
        # run, not the schedule's steady state.
        window_end = stamps[-2] if len(periods) > 1 else stamps[-1]
        sampler_idle: Optional[float] = 1.0 - busy_share(spans, stamps[warmup_steps - 1], window_end)
    elif "pipeline/sampler_idle_frac" in (measured[0] if measured else {}):
        sampler_idle = _mean(measured, "pipeline/sampler_idle_frac")
    elif schedule.trainer_mode == "sync":  # colocated: the replicas generate only inside the step's gen phase
        sampler_idle = max(0.0, 1.0 - max(0.0, gen_s - exposed) / step_s)
    else:
        sampler_idle = None  # verl's separate_async records no sampler timestamps
    hidden = 0.0 if schedule.reward_after_generation else _mean(measured, "reward/hidden_frac", float("nan"))
    return RunResult(
        schedule=schedule.name,
        profile=profile.name,
        step_s=step_s,
        step_s_each=periods,
        gen_s=gen_s,
        sync_s=sync_s,
        reward_after_s=reward_after_s,
        reward_exposed_s=exposed,
        trainer_bubble_frac=bubble,
        sampler_idle_frac=sampler_idle,
        reward_hidden_frac=None if math.isnan(hidden) else hidden,
        staleness_mean=_mean(measured, "training/off_policy/trajectory_staleness/mean"),
        spans_mean=_mean(measured, "training/off_policy/trajectory_spans/mean", 1.0),
        modelled_tokens_defaulted=_mean(measured, "bench/modelled_tokens_defaulted"),
        syncs_before_last_reward=_mean(measured, "pipeline/syncs_before_last_reward"),
        token_lag_mean=_mean(measured, "bench/token_lag/mean"),  # the steps train equal batches
        token_lag_max=max((float(r.get("bench/token_lag/max", 0.0)) for r in measured), default=0.0),
        spanning_share=_mean(measured, "bench/spanning_samples_share"),
        held_back_groups=_mean(measured, "in_flight/held_back_groups"),
        dropped_groups=_mean(measured, "in_flight/dropped_groups"),
        update_loads_sent=sum(float(r.get("in_flight/update_loads_sent", 0.0)) for r in records),
        log=log,
    )


def one_off_ideal(baseline: RunResult) -> float:
    """One-off's bound against ``baseline``: its (gen + exposed reward + train + sync) over max(gen, train + sync).

    The baseline's measured wait for samples includes any streamed reward still running after generation
    (``reward_exposed_s``); that part, and reward spent after generation, is what one-off can hide.
    """
    gen = max(1e-9, baseline.gen_s - baseline.reward_exposed_s)
    train_and_sync = max(0.0, baseline.step_s - baseline.gen_s - baseline.reward_after_s)
    return baseline.step_s / max(gen, train_and_sync)


def minibatch_ideal(baseline: RunResult, minibatches: int = MINIBATCHES) -> float:
    """minibatch_pipeline's on-policy bound against ``baseline``: every minibatch but the last trains while the
    batch generates; generation, the exposed reward, the last minibatch's update and the sync stay in series.

    Optimistic (the last minibatch holds the batch's longest groups, so more than 1/minibatches of the tokens).
    It is also the floor of any schedule that trains only samples of the current weights.
    """
    gen = max(1e-9, baseline.gen_s - baseline.reward_exposed_s)
    train_and_sync = max(0.0, baseline.step_s - baseline.gen_s - baseline.reward_after_s)
    train = max(0.0, train_and_sync - baseline.sync_s)
    return baseline.step_s / (gen + baseline.reward_exposed_s + train / minibatches + baseline.sync_s)


def compare(results: list[RunResult]) -> dict[str, Any]:
    """Ratios of every schedule against every baseline, and one-off against its ideal bounds, per profile."""
    report: dict[str, Any] = {}
    for profile in sorted({r.profile for r in results}):
        runs = {r.schedule: r for r in results if r.profile == profile}
        ratios = {
            name: {base: runs[base].step_s / run.step_s for base in BASELINES if base in runs}
            for name, run in runs.items()
        }
        ideal = {base: one_off_ideal(runs[base]) for base in SYNC_BASELINES if base in runs}
        entry: dict[str, Any] = {"speedup": ratios, "one_off_ideal": ideal}
        if "one_off_pipeline" in runs:
            entry["one_off_share_of_ideal"] = {
                base: ratios["one_off_pipeline"][base] / bound for base, bound in ideal.items()
            }
        if "minibatch_pipeline" in runs:
            entry["minibatch_ideal"] = {base: minibatch_ideal(runs[base]) for base in SYNC_BASELINES if base in runs}
            entry["minibatch_share_of_ideal"] = {
                base: ratios["minibatch_pipeline"][base] / bound for base, bound in entry["minibatch_ideal"].items()
            }
        report[profile] = entry
    return report


# --- the whole benchmark ------------------------------------------------------------------------------------


def run_bench(cfg: BenchConfig, progress=print) -> dict[str, Any]:
    """Run every (profile, schedule) pair on one private Ray cluster; returns the JSON-ready report."""
    from verl_pipe.bench.jobs import local_ray_head, run_verl_job
    from verl_pipe.models import build_tiny_qwen2

    cfg.validate()
    out_dir = os.path.abspath(cfg.out_dir or os.path.join("runs", time.strftime("bench-pipeline-%Y%m%d-%H%M%S")))
    os.makedirs(out_dir, exist_ok=True)
    # vLLM's CPU attention serves head sizes from 32 up; the default tiny model's 4 heads of 16 need twice the width.
    model_path = build_tiny_qwen2(hidden_size=128) if cfg.rollout == "vllm" else build_tiny_qwen2()
    results: list[RunResult] = []
    models: dict[str, dict] = {}
    started = time.time()
    head = contextlib.nullcontext(cfg.ray_address) if cfg.ray_address else local_ray_head(num_cpus=16)
    with head as address:
        for profile_name in cfg.profiles:
            profile = PROFILES[profile_name]
            model = calibrate(profile, cfg)
            models[profile_name] = asdict(model)
            for schedule_name in cfg.schedules_for(profile_name):
                schedule = SCHEDULES[schedule_name]
                run_dir = os.path.join(out_dir, profile_name, schedule_name)
                variant = replace(model, reward_after_generation=schedule.reward_after_generation)
                if schedule.staged_loads:
                    variant = variant.with_staged_loads()
                run_latency = os.path.join(out_dir, f"latency_{profile_name}_{schedule_name}.json")
                with open(run_latency, "w", encoding="utf-8") as fh:
                    fh.write(variant.to_json())
                overrides = schedule_overrides(schedule, cfg, model_path, run_dir, address, run_latency)
                t0 = time.time()
                rc, steps, log = run_verl_job(overrides, run_dir, timeout=cfg.timeout_s)
                if rc != 0:
                    raise RuntimeError(f"{profile_name}/{schedule_name} failed (exit {rc}); see {log}")
                result = summarize_run(schedule, profile, steps, cfg.warmup_steps, log)
                results.append(result)
                progress(
                    f"{profile_name:7s} {schedule_name:28s} step {result.step_s:6.2f} s  "
                    f"(run {time.time() - t0:5.0f} s)"
                )
    report = {
        "config": asdict(cfg),
        "latency_models": models,
        "runs": [asdict(r) | {"train_s": r.train_s} for r in results],
        "comparison": compare(results),
        "wall_s": time.time() - started,
        "out_dir": out_dir,
    }
    from verl_pipe.bench.schedule_lanes import schedule_panels
    from verl_pipe.plot import plot_schedules

    report["timeline_png"] = plot_schedules(schedule_panels(report), os.path.join(out_dir, "schedules.png"))
    return report


SAMPLER_BUSY_TARGET = 0.95  # a sampler-bound schedule's physical limit (issue 20's bar for in_flight_pipeline)


def _in_flight_lines(by_name: dict[str, dict]) -> list[str]:
    """Each in-flight schedule against verl's separate_async (step, token lag), and its sampler's busy share."""
    lines = []
    peer = by_name.get("verl_separate_async")
    for name, run in by_name.items():
        if not name.startswith("in_flight_pipeline"):
            continue
        if peer is not None:
            lines.append(
                f"  {name} vs verl_separate_async: {peer['step_s'] / run['step_s']:.2f}x the speed, token lag "
                f"{run['token_lag_mean']:.2f} vs {peer['token_lag_mean']:.2f} (max {run['token_lag_max']:g} vs "
                f"{peer['token_lag_max']:g}), samples spanning versions {run['spanning_share']:.0%} vs "
                f"{peer['spanning_share']:.0%}"
            )
        if run["sampler_idle_frac"] is not None:
            busy = 1.0 - run["sampler_idle_frac"]
            gap = SAMPLER_BUSY_TARGET - busy
            verdict = f"{gap:.1%} short of" if gap > 0 else f"{-gap:.1%} above"
            lines.append(
                f"  {name} sampler busy {busy:.1%} of the window ({verdict} the {SAMPLER_BUSY_TARGET:.0%} bar); "
                f"groups held back {run['held_back_groups']:.1f}/step, dropped {run['dropped_groups']:.1f}/step; "
                f"minibatch updates loaded {run.get('update_loads_sent', 0.0):.0f} in the run"
            )
    return lines


def format_report(report: dict[str, Any]) -> str:
    """The table a user reads: per profile, each schedule's step time, bubbles and speed-ups."""
    lines = []
    runs = report["runs"]
    for profile, comparison in report["comparison"].items():
        lines.append(f"profile {profile}")
        header = f"  {'schedule':28s} {'step s':>7s} {'stale':>5s} {'spans':>5s} {'tok lag':>7s} {'bubble':>7s}"
        header += f" {'smp idle':>8s}"
        header += f" {'rwd hid':>7s}"
        header += "".join(f" {'vs ' + b[5:]:>18s}" for b in BASELINES)
        lines.append(header)
        for run in (r for r in runs if r["profile"] == profile):
            idle = run["sampler_idle_frac"]
            hidden = run["reward_hidden_frac"]
            row = (
                f"  {run['schedule']:28s} {run['step_s']:7.2f} {run['staleness_mean']:5.2f} "
                f"{run['spans_mean']:5.2f} {run['token_lag_mean']:7.2f} "
                f"{run['trainer_bubble_frac']:7.2f} "
                f"{'   n/a' if idle is None else f'{idle:8.2f}'} {'  n/a' if hidden is None else f'{hidden:7.2f}'}"
            )
            for base in BASELINES:
                ratio = comparison["speedup"][run["schedule"]].get(base)
                row += f" {'' if ratio is None else f'{ratio:17.2f}x'}"
            lines.append(row)
        for base, bound in comparison["one_off_ideal"].items():
            share = comparison.get("one_off_share_of_ideal", {}).get(base)
            achieved = comparison["speedup"].get("one_off_pipeline", {}).get(base)
            if achieved is not None:
                lines.append(
                    f"  one_off_pipeline vs {base}: {achieved:.2f}x of an ideal {bound:.2f}x ({100 * share:.0f}%)"
                )
        for base, bound in comparison.get("minibatch_ideal", {}).items():
            share = comparison["minibatch_share_of_ideal"][base]
            achieved = comparison["speedup"]["minibatch_pipeline"][base]
            lines.append(
                f"  minibatch_pipeline vs {base}: {achieved:.2f}x of an on-policy ideal {bound:.2f}x ({100 * share:.0f}%)"
            )
        by_name = {r["schedule"]: r for r in runs if r["profile"] == profile}
        if "minibatch_ideal" in comparison and "verl_sync" in comparison["minibatch_ideal"] and "verl_separate_async" in by_name:
            floor = by_name["verl_sync"]["step_s"] / comparison["minibatch_ideal"]["verl_sync"]
            other = by_name["verl_separate_async"]
            lines.append(
                f"  on-policy floor {floor:.2f} s/step (from verl_sync's phases) vs verl_separate_async "
                f"{other['step_s']:.2f} s/step at staleness {other['staleness_mean']:.2f}"
            )
        lines.extend(_in_flight_lines(by_name))
    lines.append(f"wall time {report['wall_s']:.0f} s; runs in {report['out_dir']}")
    if report.get("timeline_png"):
        lines.append(f"schedules side by side: {report['timeline_png']}")
    return "\n".join(lines)
