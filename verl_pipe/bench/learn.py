"""``verl-pipe bench learn`` / ``make bench-learn``: does each trainer mode learn, and how soon on the cluster's clock?

A speed-up is only worth having if the same accuracy comes sooner. Each trainer mode trains SmolLM2-135M-Instruct
with GRPO+ through verl's real trainer on the generated one-function problems (:mod:`verl_pipe.data.function_family`:
200 training items, 120 validation items the model has never seen) for the same number of samples, validating
greedily every ``val_every`` steps. Accuracy is the share of validation items whose program passes every test in
the sandbox, with a Wilson 95% interval.

Two clocks: steps (learning per sample: a mode that trains on stale samples may learn less per step) and the
simulated cluster's hours. A CPU run cannot say how long a step takes on a GPU cluster, and the 2-core run's own
step times say nothing about one (every pool shares the same two cores). So the cluster clock is each step
count times that schedule's step time from the pipeline benchmark (coding profile; :mod:`verl_pipe.bench.pipeline`,
``make bench``), which runs the same trainers under a latency model of a 14B-on-H100 cluster. Time to target
combines the two: the first validation at or above the target accuracy, on the cluster's clock, as a ratio
against verl's ``sync``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from verl_pipe.quickstart import DATASETS
from verl_pipe.run_metrics import Validation, validations_from_verl_log

# Each trainer mode and the pipeline benchmark's schedule that prices its step (on the modelled cluster, whose
# engine semantics are the same whatever the CPU rollout).
MODE_SCHEDULES = {
    "sync": "verl_sync",
    "separate_async": "verl_separate_async",
    "one_off_pipeline": "one_off_pipeline",
    "minibatch_pipeline": "minibatch_pipeline",
    "in_flight_pipeline": "in_flight_pipeline",
}
BASELINE_MODE = "sync"
FUNCTIONS = DATASETS["functions"]  # the task's defaults, as `verl-pipe quickstart --data functions` runs it



@dataclass
class ModeRun:
    mode: str
    rollout: str
    rewards: list[float]  # mean training reward per step, steps 1..N
    validations: list[Validation]
    samples_trained: int
    wall_s: float
    run_dir: str
    cluster_s_per_step: float = math.nan  # the pipeline benchmark's step time on the modelled cluster

    def hours(self, step: float) -> float:
        return step * self.cluster_s_per_step / 3600.0


def steps_to_target(validations: list[Validation], target: float) -> Optional[int]:
    """The first validated step (after step 0) whose accuracy reaches ``target``; None when none does."""
    return next((v.step for v in sorted(validations, key=lambda v: v.step) if v.step > 0 and v.accuracy >= target),
                None)  # fmt: skip


def cluster_step_seconds(pipeline_report: dict[str, Any], profile: str = "coding") -> dict[str, float]:
    """Each trainer mode's step time on the modelled cluster, from a ``bench pipeline`` report: the mean over its
    blocks of the benchmark's step time in the cluster's seconds."""
    steps: dict[str, list[float]] = {}
    for run in pipeline_report["runs"]:
        if run["profile"] == profile:
            steps.setdefault(run["schedule"], []).append(run["step_s"])
    return {mode: sum(steps[s]) / len(steps[s]) for mode, s in MODE_SCHEDULES.items() if s in steps}


@dataclass
class LearnBenchConfig:
    modes: tuple[str, ...] = tuple(MODE_SCHEDULES)
    # 6 steps of 8x4 samples: every mode rose 14-24 points in the four runs measured (sync: 30.8% -> 48.3%, 45.0%
    # with shuffled batches, 50.8% and 51.7% in the task's order); the whole bench (five modes, validations at 0, 3
    # and 6, the pricing run) took 88.6 minutes on 2 cores with vLLM rollouts (93-97 with in_flight_pipeline on hf;
    # docs/learning.md).
    steps: int = 6
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    max_prompt_length: int = FUNCTIONS.max_prompt_length
    max_response_length: int = FUNCTIONS.max_response_length
    temperature: float = FUNCTIONS.temperature
    lr: float = FUNCTIONS.lr
    val_every: int = 3
    # The accuracy every mode should reach; None: the accuracy before training plus target_rise.
    target: Optional[float] = None
    target_rise: float = 0.10
    # vllm when this virtualenv has it, else hf; every mode runs on it (in_flight_pipeline's in-flight loads work on
    # both servers).
    rollout: Optional[str] = None
    # A ``verl-pipe bench pipeline --out`` report to price the steps with; None: run its coding profile first.
    pipeline_report: Optional[str] = None
    seed: int = 0
    out_dir: Optional[str] = None
    ray_address: Optional[str] = None

    @property
    def engine(self) -> str:
        return self.rollout or ("vllm" if importlib.util.find_spec("vllm") is not None else "hf")

    def validate(self) -> None:
        unknown = [m for m in self.modes if m not in MODE_SCHEDULES]
        if unknown:
            raise ValueError(f"unknown modes {unknown} (--modes); choose from {', '.join(MODE_SCHEDULES)}")
        if BASELINE_MODE not in self.modes:
            raise ValueError(f"--modes must include {BASELINE_MODE}: every time to target is a ratio against it")
        if self.steps < 1 or self.val_every < 1:
            raise ValueError(f"steps and val_every must be >= 1, got {self.steps} and {self.val_every}")
        if self.steps % self.val_every:
            raise ValueError(
                f"steps ({self.steps}) must be a multiple of val_every ({self.val_every}): verl validates every "
                "val_every steps and after the last, and the curves need evenly spaced points (--steps, --val-every)"
            )
        if self.target is not None and not 0 < self.target <= 1:
            raise ValueError(f"target must be an accuracy in (0, 1], got {self.target} (--target)")


def _quickstart_config(cfg: LearnBenchConfig, mode: str, run_dir: str, address: str, validate_first: bool):
    from verl_pipe.quickstart import QuickstartConfig

    return QuickstartConfig(
        model="smollm2",
        mode=mode,
        data="functions",
        steps=cfg.steps,
        prompts_per_step=cfg.prompts_per_step,
        samples_per_prompt=cfg.samples_per_prompt,
        max_prompt_length=cfg.max_prompt_length,
        max_response_length=cfg.max_response_length,
        temperature=cfg.temperature,
        lr=cfg.lr,
        rollout=cfg.engine,
        # The task's own order, as the demo reads it: every batch holds each family (shuffled batches of 8 miss
        # some, and sync's rise was then +14 to +18 points in two runs, against the demo's +22 in 5 steps).
        shuffle=FUNCTIONS.shuffle,
        seed=cfg.seed,
        out_dir=run_dir,
        ray_address=address,
        validate_at_start=validate_first,
        overrides=[f"trainer.test_freq={cfg.val_every}"],
    )


def train_mode(cfg: LearnBenchConfig, mode: str, out_dir: str, address: str, validate_first: bool) -> ModeRun:
    """One mode's run through ``verl-pipe quickstart``'s machinery (progress lines included)."""
    from verl_pipe.quickstart import follow_training, metrics_log_path, prepare, validation_items

    qs = _quickstart_config(cfg, mode, os.path.join(out_dir, mode), address, validate_first)
    run_dir, argv, env = prepare(qs)
    started = time.time()
    rc = follow_training(argv, env, run_dir, qs.steps)
    if rc != 0:
        raise RuntimeError(f"bench learn: {mode} failed (exit {rc}); see {os.path.join(run_dir, 'train.log')}")
    from verl_pipe.plot import load_verl_metrics

    steps = load_verl_metrics(metrics_log_path(run_dir))
    trained = sum(1 for _, data in steps if "actor/pg_loss" in data)
    return ModeRun(
        mode=mode,
        rollout=qs.rollout,
        rewards=[float(data["critic/score/mean"]) for _, data in steps],
        validations=validations_from_verl_log(metrics_log_path(run_dir), validation_items(run_dir)),
        samples_trained=trained * cfg.prompts_per_step * cfg.samples_per_prompt,
        wall_s=time.time() - started,
        run_dir=run_dir,
    )


def price_steps(cfg: LearnBenchConfig, out_dir: str, address: str, progress: Callable[[str], None]) -> dict:
    """The pipeline benchmark's report that prices each mode's step: the one given, or a fresh coding-profile run."""
    if cfg.pipeline_report:
        with open(cfg.pipeline_report, encoding="utf-8") as fh:
            return json.load(fh)
    from verl_pipe.bench.pipeline import BenchConfig, run_bench

    schedules = tuple(MODE_SCHEDULES[m] for m in cfg.modes)
    progress(f"pricing the steps: bench pipeline, coding profile, {', '.join(schedules)}")
    bench = BenchConfig(profiles=("coding",), schedules=schedules, blocks=1, sensitivity=False, ray_address=address,
                        out_dir=os.path.join(out_dir, "pipeline"))  # fmt: skip
    return run_bench(bench, progress=progress)


def compare_runs(runs: list[ModeRun], target: float) -> dict[str, Any]:
    """Per mode: the rise from before to after, steps and cluster hours to ``target``, and ratios against sync."""
    baseline = next(r for r in runs if r.mode == BASELINE_MODE)
    base_steps = steps_to_target(baseline.validations, target)
    base_hours = baseline.hours(base_steps) if base_steps else None
    table = {}
    for run in runs:
        before, after = run.validations[0], run.validations[-1]
        reached = steps_to_target(run.validations, target)
        hours = run.hours(reached) if reached else None
        table[run.mode] = {
            "before": before.accuracy,
            "after": after.accuracy,
            "rise": after.accuracy - before.accuracy,
            "intervals_apart": after.interval[0] > before.interval[1],
            "steps_to_target": reached,
            "hours_to_target": hours,
            # how much sooner than sync (>1: sooner); None when either never reached the target
            "speedup_to_target_vs_sync": base_hours / hours if hours and base_hours else None,
        }
    return table


def run_learn_bench(cfg: LearnBenchConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    from verl_pipe.bench.jobs import local_ray_head

    cfg.validate()
    out_dir = os.path.abspath(cfg.out_dir or os.path.join("runs", time.strftime("bench-learn-%Y%m%d-%H%M%S")))
    os.makedirs(out_dir, exist_ok=True)
    started = time.time()
    runs: list[ModeRun] = []
    # sync first: the target comes from its accuracy before training
    modes = [BASELINE_MODE] + [m for m in cfg.modes if m != BASELINE_MODE]
    head = contextlib.nullcontext(cfg.ray_address) if cfg.ray_address else local_ray_head(num_cpus=16)
    with head as address:
        report = price_steps(cfg, out_dir, address, progress)
        seconds = cluster_step_seconds(report)
        unpriced = [m for m in modes if m not in seconds]
        if unpriced:  # before an hour of training, not after it
            raise ValueError(
                f"the pipeline report has no coding-profile step time for {unpriced} (schedules "
                f"{[MODE_SCHEDULES[m] for m in unpriced]}): run `verl-pipe bench pipeline --profiles coding` with "
                "them, or leave out --pipeline-report"
            )
        before: Optional[Validation] = None  # the untrained model's greedy answers
        for index, mode in enumerate(modes, 1):
            progress(f"[{index}/{len(modes)}] {mode} ({cfg.engine} rollout, {cfg.steps} steps; "
                     f"{time.time() - started:.0f} s so far)")  # fmt: skip
            run = train_mode(cfg, mode, out_dir, address, validate_first=before is None)
            if before is None:
                before = run.validations[0]
            else:  # the same weights and the same greedy decoding: one validation serves every mode
                run.validations.insert(0, before)
            run.cluster_s_per_step = seconds[mode]
            runs.append(run)
            summary = ", ".join(f"step {v.step}: {100 * v.accuracy:.1f}%" for v in run.validations)
            progress(f"    {mode}: validation {summary} ({run.wall_s:.0f} s)")
    base_before = runs[0].validations[0].accuracy
    target = cfg.target if cfg.target is not None else base_before + cfg.target_rise
    result = {
        "config": asdict(cfg),
        "target": target,
        "runs": [asdict(r) | {"hours_per_step": r.hours(1)} for r in runs],
        "comparison": compare_runs(runs, target),
        "pipeline_report": cfg.pipeline_report or report.get("out_dir"),
        "wall_s": time.time() - started,
        "out_dir": out_dir,
    }
    from verl_pipe.plot import plot_learning

    result["png"] = plot_learning(result, os.path.join(out_dir, "learning.png"))
    with open(os.path.join(out_dir, "learning.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    result["json"] = os.path.join(out_dir, "learning.json")
    return result


def format_report(result: dict[str, Any]) -> str:
    items = result["runs"][0]["validations"][0]["items"]
    lines = [
        f"bench learn: SmolLM2-135M-Instruct, GRPO+, {result['config']['steps']} steps of "
        f"{result['config']['prompts_per_step']}x{result['config']['samples_per_prompt']} samples per mode; greedy "
        f"validation on {items} unseen function problems (95% Wilson intervals); target "
        f"{100 * result['target']:.1f}%",
        f"  {'mode':20s} {'engine':6s} {'before %':>16s} {'after %':>16s} {'rise':>6s} {'h/step':>7s} "
        f"{'steps→tgt':>9s} {'h→tgt':>7s} {'vs sync':>8s}",
    ]
    for run in result["runs"]:
        row = result["comparison"][run["mode"]]
        first, last = run["validations"][0], run["validations"][-1]

        def with_interval(record: dict) -> str:
            v = Validation(**record)
            low, high = v.interval
            return f"{100 * v.accuracy:4.1f} [{100 * low:4.1f},{100 * high:4.1f}]"

        hours = row["hours_to_target"]
        speedup = row["speedup_to_target_vs_sync"]
        lines.append(
            f"  {run['mode']:20s} {run['rollout']:6s} {with_interval(first):>16s} {with_interval(last):>16s} "
            f"{100 * row['rise']:+5.1f} {run['hours_per_step']:7.3f} {str(row['steps_to_target'] or '-'):>9s} "
            f"{'-' if hours is None else f'{hours:.3f}':>7s} {'-' if speedup is None else f'{speedup:.2f}x':>8s}"
        )
    sync = result["comparison"][BASELINE_MODE]
    verdict = "apart" if sync["intervals_apart"] else "OVERLAPPING"
    lines.append(f"sync: {100 * sync['rise']:+.1f} points, intervals before/after {verdict}")
    lines.append(f"curves: {result['png']}")
    lines.append(f"report: {result['json']}")
    return "\n".join(lines)
