"""``verl-pipe bench learn`` / ``make bench-learn``: does a pipelined mode learn as much per step as verl's ``sync``,
and does it reach a target accuracy sooner on the modelled cluster's clock?

The experiment: each trainer mode trains SmolLM2-135M-Instruct with GRPO+ through verl's real trainer on the
generated one-function problems (:mod:`verl_pipe.data.function_family`: 200 training items, 120 validation items
the model has never seen), once per seed, validating greedily every ``val_every`` steps. The problems are the same
for every run (``data_seed``); a seed changes the sampling. Each validation records every item's verdict, so the
modes are compared item by item at equal steps (:mod:`verl_pipe.bench.learn_stats`).

A mode may carry a variant, ``<mode>+dapo``: the same mode with DAPO's dynamic sampling (``algorithm.filter_groups``,
uniform groups dropped and refilled, at most 3 batches generated a step). Compared against ``--baseline <mode>``, it
answers whether the refill buys learning per step, and each run records what it generated for what it trained.

Two clocks. Steps measure learning per sample. The cluster's clock prices each step from the pipeline benchmark
(:mod:`verl_pipe.bench.pipeline`, coding profile: DeepCoder-14B on 32 H100, equal GPUs) run at the batch shape the
learning runs train (prompts x samples per step, the profile's minibatches per step) and with the knobs its
planner chose for each schedule, which the learning runs then train with, at the token lag the pricing run measured
(``train_lag``: in_flight_pipeline's cap resized, :func:`knobs_at_priced_lag`). A 2-core run's own step times say
nothing about a cluster (every pool shares the same two cores).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Optional

from verl_pipe.bench.pipeline import PROFILES, SCHEDULES, BenchConfig, knob_overrides, run_bench, verl_steps_per_step
from verl_pipe.quickstart import DATASETS
from verl_pipe.run_metrics import Validation, validations_from_verl_log

# Each trainer mode and the pipeline benchmark's schedule that prices its step (on the modelled cluster, whose
# engine semantics are the same whatever the CPU rollout).
MODE_SCHEDULES = {schedule.trainer_mode: name for name, schedule in SCHEDULES.items()}
BASELINE_MODE = "sync"
PRICING_PROFILE = "coding"
FUNCTIONS = DATASETS["functions"]  # the task's defaults, as `verl-pipe quickstart --data functions` runs it
RUN_RECORD = "run.json"  # a finished run's record in its folder: a rerun into the same --out-dir skips it
# ``<mode>+<variant>``: the mode trained with these overrides. Its knobs are the mode's; the step price would be too,
# without what the variant adds to generation, so the report gives it no clock (its runs record the generation).
VARIANTS = {
    "dapo": ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=reward",
             "algorithm.filter_groups.max_num_gen_batches=3"),
}  # fmt: skip
TRAIN_LAGS = ("priced", "planned")  # --train-lag


def base_mode(name: str) -> str:
    """The trainer mode of a ``--modes`` entry (``minibatch_pipeline+dapo`` -> ``minibatch_pipeline``)."""
    return name.partition("+")[0]


def variant_overrides(name: str) -> tuple[str, ...]:
    return VARIANTS[name.partition("+")[2]] if "+" in name else ()


def pricing_minibatches() -> int:
    """Minibatch updates per step of the pricing profile's cluster: the learning runs train with as many."""
    from verl_pipe.bench import cluster as clusters

    return clusters.cluster(PROFILES[PRICING_PROFILE].cluster).workload.minibatches


@dataclass
class LearnBenchConfig:
    # verl's sync and the pipelined mode of ours that the equal-GPU bench found fastest on the coding profile.
    modes: tuple[str, ...] = (BASELINE_MODE, "in_flight_pipeline")
    baseline: str = BASELINE_MODE  # every other mode is compared with it, paired by seed
    seeds: tuple[int, ...] = (0, 1, 2)
    data_seed: int = 0  # the problems every run trains and validates on
    # 5 steps validated after each: the smoke run (in_flight_pipeline, 2 minibatches a step) went 30.8% -> 43.3%
    # -> 48.3% in two steps, so the target is crossed early and every step's validation resolves it.
    steps: int = 5
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    max_prompt_length: int = FUNCTIONS.max_prompt_length
    max_response_length: int = FUNCTIONS.max_response_length
    temperature: float = FUNCTIONS.temperature
    lr: float = FUNCTIONS.lr
    val_every: int = 1
    # The accuracy to reach; None: the untrained model's upper 95% bound plus target_margin (set before the runs).
    target: Optional[float] = None
    target_margin: float = 0.10
    # A pipelined mode is non-inferior at a step when the lower 95% bound of its paired accuracy difference
    # against sync is above -non_inferiority_margin.
    non_inferiority_margin: float = 0.05
    bootstrap: int = 4000
    # Paired blocks of the pricing run (bench pipeline, coding profile, at this batch shape).
    pricing_blocks: int = 3
    # vllm when this virtualenv has it, else hf; every mode runs on it.
    rollout: Optional[str] = None
    # A ``verl-pipe bench pipeline --out`` report to price the steps with (at this batch shape); None: run one.
    pipeline_report: Optional[str] = None
    # The token lag the learning runs train at. "priced": in_flight_pipeline's cap on untrained groups is resized so
    # that its CPU run trains at the lag the pricing run measured on the cluster (see knobs_at_priced_lag);
    # "planned": the planner's cap as priced, which a 2-core run keeps full, so it trains staler than priced.
    train_lag: str = "priced"
    out_dir: Optional[str] = None
    ray_address: Optional[str] = None

    @property
    def engine(self) -> str:
        return self.rollout or ("vllm" if importlib.util.find_spec("vllm") is not None else "hf")

    @property
    def minibatches(self) -> int:
        return pricing_minibatches()

    def validate(self) -> None:
        unknown = [m for m in self.modes if base_mode(m) not in MODE_SCHEDULES
                   or ("+" in m and m.partition("+")[2] not in VARIANTS)]  # fmt: skip
        if unknown:
            raise ValueError(
                f"unknown modes {unknown} (--modes); choose from {', '.join(MODE_SCHEDULES)}, each optionally with "
                f"a variant: {', '.join('+' + v for v in VARIANTS)}"
            )
        if len(set(self.modes)) != len(self.modes):
            raise ValueError(f"--modes names a mode twice: {self.modes}")
        if self.baseline not in self.modes or len(self.modes) < 2:
            raise ValueError(
                f"--modes must include the baseline {self.baseline} (--baseline) and a mode to compare with it"
            )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds} (--seeds)")
        if self.steps < 1 or self.val_every < 1:
            raise ValueError(f"steps and val_every must be >= 1, got {self.steps} and {self.val_every}")
        if self.steps % self.val_every:
            raise ValueError(
                f"steps ({self.steps}) must be a multiple of val_every ({self.val_every}): verl validates every "
                "val_every steps and after the last, and the curves need evenly spaced points (--steps, --val-every)"
            )
        if self.prompts_per_step % self.minibatches:
            raise ValueError(
                f"prompts_per_step={self.prompts_per_step} must split into the pricing cluster's {self.minibatches} "
                "minibatches per step (--prompts-per-step)"
            )
        if self.target is not None and not 0 < self.target <= 1:
            raise ValueError(f"target must be an accuracy in (0, 1], got {self.target} (--target)")
        if self.train_lag not in TRAIN_LAGS:
            raise ValueError(f"train_lag must be one of {', '.join(TRAIN_LAGS)}, got {self.train_lag!r} (--train-lag)")
        if self.bootstrap < 200:
            raise ValueError(f"bootstrap must be >= 200 resamples for a 95% interval, got {self.bootstrap}")


# --- pricing: the pipeline benchmark at the learning runs' batch shape ------------------------------------------


@dataclass
class Pricing:
    """Each mode's step on the modelled cluster, per paired block of the pipeline benchmark, and its knobs."""

    step_s: dict[str, list[float]]  # mode -> cluster seconds per step, one per block (blocks in the same order)
    knobs: dict[str, dict[str, Any]]  # mode -> the planner's Knobs as a dict
    layouts: dict[str, str]
    report: str  # where the benchmark's report is
    # mode -> the token lag the pricing run measured on the modelled cluster (mean over blocks, policy versions)
    token_lag: dict[str, float] = field(default_factory=dict)


def pricing_from_report(report: dict[str, Any], cfg: LearnBenchConfig) -> Pricing:
    """Read a ``bench pipeline`` report; refuse one run at another batch shape or without a mode's schedule."""
    meta = report["profiles"].get(PRICING_PROFILE, {})
    shape = (meta.get("prompts") or report["config"]["prompts"], meta.get("samples") or report["config"]["samples"])
    if shape != (cfg.prompts_per_step, cfg.samples_per_prompt):
        raise ValueError(
            f"the pipeline report was run at {shape[0]} prompts x {shape[1]} samples, and the learning runs train "
            f"{cfg.prompts_per_step} x {cfg.samples_per_prompt}: price them at the shape they train (run `verl-pipe "
            f"bench pipeline --profiles {PRICING_PROFILE} --prompts {cfg.prompts_per_step} --samples "
            f"{cfg.samples_per_prompt}`, or leave out --pipeline-report)"
        )
    profile = report["profiles"].get(PRICING_PROFILE)
    blocks: dict[str, dict[int, float]] = {}
    for run in report["runs"]:
        if run["profile"] == PRICING_PROFILE:
            blocks.setdefault(run["schedule"], {})[int(run["block"])] = float(run["step_s"])
    names = {mode: MODE_SCHEDULES[base_mode(mode)] for mode in cfg.modes}
    missing = [m for m in cfg.modes if names[m] not in blocks or profile is None]
    if missing:
        raise ValueError(
            f"the pipeline report has no {PRICING_PROFILE}-profile step time for {missing}: run `verl-pipe bench "
            f"pipeline --profiles {PRICING_PROFILE}` with their schedules, or leave out --pipeline-report"
        )
    plans = profile["plans"]  # by schedule name
    return Pricing(
        step_s={mode: [blocks[names[mode]][b] for b in sorted(blocks[names[mode]])] for mode in cfg.modes},
        knobs={mode: dict(plans[names[mode]].get("knob_values", {})) for mode in cfg.modes},
        layouts={mode: plans[names[mode]]["layout"] for mode in cfg.modes},
        report=report.get("out_dir", ""),
        token_lag=priced_token_lags(report, names),
    )


def priced_token_lags(report: dict[str, Any], schedules: dict[str, str]) -> dict[str, float]:
    """Per mode, the token lag its schedule ran at in the pricing report (mean over blocks; none when unrecorded)."""
    out = {}
    for mode, schedule in schedules.items():
        lags = [float(run["token_lag_mean"]) for run in report["runs"] if run["profile"] == PRICING_PROFILE
                and run["schedule"] == schedule and "token_lag_mean" in run]  # fmt: skip
        if lags:
            out[mode] = statistics.mean(lags)
    return out


def knobs_at_priced_lag(
    knobs: dict[str, Any], priced_lag: Optional[float], prompts: int, minibatches: int
) -> dict[str, Any]:
    """in_flight_pipeline's knobs with its cap on untrained prompt groups resized so that a 2-core run trains at the
    token lag the pricing run measured on the cluster.

    On 2 cores training is slow beside generation, so the feeder keeps its cap full, and by Little's law a group
    then waits (cap / groups trained a step) steps: the run trains at about the cap in batches (the 2026-12-02 runs,
    cap 1.875 batches: 1.83-1.87 versions from step 3 on; the 2026-12-06 runs, cap 1 batch: 1.00). On the cluster the trainer keeps up and the same cap is
    not full all the time, so the priced lag is lower. Resizing the cap to the priced lag (whole groups, at least a
    minibatch's, never above the planned cap) trains the learning runs at the lag their price was measured at, not
    at a staler one. Knobs without a cap, or a mode without a priced lag, are returned as they are.
    """
    untrained = float(knobs.get("untrained_batches") or 0.0)
    if not untrained or priced_lag is None:
        return dict(knobs)
    groups = max(prompts // minibatches, round(priced_lag * prompts))
    return {**knobs, "untrained_batches": min(untrained, groups / prompts)}


def training_knobs(cfg: LearnBenchConfig, pricing: Pricing) -> dict[str, dict[str, Any]]:
    """Per mode, the knobs its learning runs train with (``cfg.train_lag``)."""
    if cfg.train_lag == "planned":
        return {mode: dict(knobs) for mode, knobs in pricing.knobs.items()}
    return {mode: knobs_at_priced_lag(knobs, pricing.token_lag.get(mode), cfg.prompts_per_step, cfg.minibatches)
            for mode, knobs in pricing.knobs.items()}  # fmt: skip


def price_steps(cfg: LearnBenchConfig, out_dir: str, address: str, progress: Callable[[str], None]) -> Pricing:
    """The given report, the one a previous call left in ``out_dir``, or a fresh coding-profile run."""
    saved = os.path.join(out_dir, "pricing.json")
    path = cfg.pipeline_report or (saved if os.path.exists(saved) else None)
    if path:
        with open(path, encoding="utf-8") as fh:
            return pricing_from_report(json.load(fh), cfg)

    schedules = tuple(dict.fromkeys(MODE_SCHEDULES[base_mode(m)] for m in cfg.modes))
    progress(f"pricing the steps: bench pipeline, {PRICING_PROFILE} profile, {cfg.prompts_per_step} x "
             f"{cfg.samples_per_prompt} per step, {cfg.pricing_blocks} blocks of {', '.join(schedules)}")  # fmt: skip
    bench = BenchConfig(profiles=(PRICING_PROFILE,), schedules=schedules, blocks=cfg.pricing_blocks,
                        prompts=cfg.prompts_per_step, samples=cfg.samples_per_prompt, sensitivity=False,
                        ray_address=address, out_dir=os.path.join(out_dir, "pipeline"))  # fmt: skip
    report = run_bench(bench, progress=progress)
    with open(saved, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    return pricing_from_report(report, cfg)


# --- one training run ----------------------------------------------------------------------------------------


@dataclass
class SeedRun:
    mode: str
    seed: int
    rollout: str
    rewards: list[float]  # mean training reward per step
    validations: list[Validation]
    # step -> validation item (its prompt) -> 1 when its program passed every test
    verdicts: dict[int, dict[str, int]]
    samples_trained: int
    wall_s: float
    run_dir: str
    knobs: dict[str, Any] = field(default_factory=dict)
    # what the run generated for what it trained: prompt groups generated (trained or dropped; our modes' count,
    # else the trained ones) and, with dynamic sampling, each step's share of response tokens thrown away
    groups_generated: int = 0
    dropped_token_frac: list[float] = field(default_factory=list)
    token_lag: list[float] = field(default_factory=list)  # per step, policy versions (step_token_lags)
    # trained prompt -> [step it trained at, mean reward of its group] (trained_prompt_rewards)
    prompt_rewards: dict[str, list[float]] = field(default_factory=dict)


def step_token_lags(steps: list[tuple[int, dict]], per_verl_step: int = 1) -> list[float]:
    """Each step's token lag, in policy versions behind the weights it trains, from verl's metrics log (verl steps
    grouped ``per_verl_step`` to a step): in_flight_pipeline's token-weighted measure where it logs one, else verl's
    per-sample ``trajectory_staleness`` (by the sample's freshest version: exact for a sample one version generated,
    a lower bound for one that spans several)."""
    per_step: dict[int, list[float]] = {}
    for verl_step, data in steps:
        lag = data.get("in_flight/token_lag/mean", data.get("training/off_policy/trajectory_staleness/mean"))
        if lag is not None:
            per_step.setdefault((verl_step - 1) // per_verl_step, []).append(float(lag) / per_verl_step)
    return [statistics.mean(lags) for _, lags in sorted(per_step.items())]


def dump_records(directory: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every record of verl's JSONL dumps in ``directory`` (rollouts or validations), with the file it is in."""
    for path in glob.glob(os.path.join(directory, "*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield path, json.loads(line)


def trained_prompt_rewards(rollout_dir: str, per_verl_step: int = 1) -> dict[str, list[float]]:
    """Each trained prompt's step and its group's mean reward, from verl's rollout dump (``trainer.rollout_data_dir``:
    one JSONL per verl step, a line per trained sample); verl steps grouped ``per_verl_step`` to a step. A prompt
    trained at two steps (a second epoch) keeps its first."""
    scores: dict[str, dict[int, list[float]]] = {}  # prompt -> step -> its samples' scores
    for path, sample in dump_records(rollout_dir):
        if "score" not in sample or "input" not in sample:
            raise ValueError(f"{path}: a rollout sample without verl's 'input' and 'score' fields: {sample}")
        step = (int(sample["step"]) + per_verl_step - 1) // per_verl_step
        scores.setdefault(sample["input"], {}).setdefault(step, []).append(float(sample["score"]))
    first = {prompt: min(by_step) for prompt, by_step in scores.items()}
    return {prompt: [first[prompt], statistics.mean(by_step[first[prompt]])] for prompt, by_step in scores.items()}


def item_verdicts(validation_dir: str, per_verl_step: int = 1) -> dict[int, dict[str, int]]:
    """Every validation's verdict per item, from verl's validation dump (``trainer.validation_data_dir``: one
    JSONL per validation, a line per item with the reward's extra fields); keyed by step (verl steps over
    ``per_verl_step``) and the item's prompt."""
    verdicts: dict[int, dict[str, int]] = {}
    for path, answer in dump_records(validation_dir):
        if "passed" not in answer:
            raise ValueError(f"{path}: a validation answer without the reward's 'passed' field: {answer}")
        step = int(answer["step"]) // per_verl_step
        items = verdicts.setdefault(step, {})
        if answer["input"] in items:
            raise ValueError(f"{path}: step {step} scores the same prompt twice; items must be distinct")
        items[answer["input"]] = int(bool(answer["passed"]))
    return dict(sorted(verdicts.items()))


def train_run(cfg: LearnBenchConfig, mode: str, seed: int, knobs: dict[str, Any], out_dir: str, address: str,
              validate_first: bool) -> SeedRun:  # fmt: skip
    """One mode at one seed through ``verl-pipe quickstart``'s machinery (progress lines included)."""
    from verl_pipe.bench.plan import Knobs
    from verl_pipe.plot import load_verl_metrics
    from verl_pipe.quickstart import QuickstartConfig, follow_training, metrics_log_path, prepare

    planned = Knobs(**knobs)
    trainer_mode = base_mode(mode)
    # separate_async syncing after every minibatch trains each minibatch as a verl step of its own
    per_verl_step = verl_steps_per_step(trainer_mode, planned, cfg.minibatches)
    run_dir = os.path.join(out_dir, f"{mode}-seed{seed}")
    validation_dir = os.path.join(run_dir, "validation")
    shutil.rmtree(validation_dir, ignore_errors=True)  # an earlier attempt's dumps would count twice
    qs = QuickstartConfig(
        model="smollm2", mode=trainer_mode, data="functions",
        steps=cfg.steps * per_verl_step,
        prompts_per_step=cfg.prompts_per_step // per_verl_step,
        samples_per_prompt=cfg.samples_per_prompt,
        minibatches=cfg.minibatches // per_verl_step,
        max_prompt_length=cfg.max_prompt_length, max_response_length=cfg.max_response_length,
        temperature=cfg.temperature, lr=cfg.lr, rollout=cfg.engine,
        # The task's own order, as the demo reads it: every batch holds each family.
        shuffle=FUNCTIONS.shuffle,
        seed=seed, data_seed=cfg.data_seed,
        out_dir=run_dir, ray_address=address, validate_at_start=validate_first,
        overrides=[f"trainer.test_freq={cfg.val_every * per_verl_step}",
                   f"trainer.validation_data_dir={validation_dir}",
                   *knob_overrides(trainer_mode, planned, cfg.minibatches, cfg.prompts_per_step),
                   *variant_overrides(mode)],
    )  # fmt: skip
    run_dir, argv, env = prepare(qs)
    started = time.time()
    rc = follow_training(argv, env, run_dir, qs.steps)
    if rc != 0:
        raise RuntimeError(f"bench learn: {mode} seed {seed} failed (exit {rc}); see {run_dir}/train.log")
    steps = load_verl_metrics(metrics_log_path(run_dir))
    verdicts = item_verdicts(validation_dir, per_verl_step)
    validations = [Validation(step, sum(items.values()), len(items)) for step, items in verdicts.items()]
    logged = [v.step // per_verl_step for v in validations_from_verl_log(metrics_log_path(run_dir), 1)]
    if logged != list(verdicts):  # the dump and verl's own metric must agree on which steps were validated
        raise RuntimeError(f"{run_dir}: validations logged at {logged}, dumped at {list(verdicts)}")
    trained = sum(1 for _, data in steps if "actor/pg_loss" in data)
    generated = sum(int(data.get("pipeline/prompts_consumed", qs.prompts_per_step)) for _, data in steps
                    if "timing_s/step" in data)  # fmt: skip
    run = SeedRun(
        mode=mode, seed=seed, rollout=qs.rollout,
        rewards=[float(data["critic/score/mean"]) for _, data in steps],
        validations=validations, verdicts=verdicts,
        samples_trained=trained * qs.prompts_per_step * qs.samples_per_prompt,
        wall_s=time.time() - started, run_dir=run_dir, knobs=knobs, groups_generated=generated,
        dropped_token_frac=[float(data["pipeline/dapo/dropped_token_frac"]) for _, data in steps
                            if "pipeline/dapo/dropped_token_frac" in data],
        token_lag=step_token_lags(steps, per_verl_step),
        prompt_rewards=trained_prompt_rewards(os.path.join(run_dir, "rollouts"), per_verl_step),
    )  # fmt: skip
    with open(os.path.join(run_dir, RUN_RECORD), "w", encoding="utf-8") as fh:
        json.dump(asdict(run), fh)
    return run


def load_run(run_dir: str) -> Optional[SeedRun]:
    path = os.path.join(run_dir, RUN_RECORD)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        record = json.load(fh)
    record["validations"] = [Validation(**v) for v in record["validations"]]
    record["verdicts"] = {int(step): items for step, items in record["verdicts"].items()}
    run = SeedRun(**record)
    run.run_dir = os.path.abspath(run_dir)  # where it is now: a folder moved since keeps its logs beside its record
    if run.token_lag and run.prompt_rewards:
        return run
    # recorded by an earlier version, without its lag or its prompts' rewards: read them from the run's own logs
    from verl_pipe.bench.plan import Knobs
    from verl_pipe.plot import load_verl_metrics
    from verl_pipe.quickstart import metrics_log_path

    per_verl_step = verl_steps_per_step(base_mode(run.mode), Knobs(**run.knobs), pricing_minibatches())
    log = metrics_log_path(run.run_dir)
    if not run.token_lag and os.path.exists(log):
        run.token_lag = step_token_lags(load_verl_metrics(log), per_verl_step)
    rollouts = os.path.join(run.run_dir, "rollouts")
    if not run.prompt_rewards and os.path.isdir(rollouts):
        run.prompt_rewards = trained_prompt_rewards(rollouts, per_verl_step)
    return run


def check_recorded(run: SeedRun, cfg: LearnBenchConfig, knobs: Optional[dict[str, Any]] = None) -> None:
    """A run kept from an earlier call must be a run of this experiment: validated at the same steps and, given the
    knobs this call trains the mode with, trained with them."""
    expected = list(range(cfg.val_every, cfg.steps + 1, cfg.val_every))
    recorded = [step for step in run.verdicts if step > 0]
    if recorded != expected:
        raise ValueError(
            f"{run.run_dir} was recorded with validations at steps {recorded}, and this bench validates at "
            f"{expected}: give a new --out-dir, or the --steps and --val-every it was run with"
        )
    if knobs is not None and run.knobs != knobs:
        raise ValueError(
            f"{run.run_dir} was trained with knobs {run.knobs}, and this bench trains {run.mode} with {knobs}: give "
            "a new --out-dir, or the --train-lag it was run with"
        )


# --- the whole experiment ------------------------------------------------------------------------------------


def run_learn_bench(cfg: LearnBenchConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Price the steps, then train every (seed, mode) pair, seed by seed so that a cut-short bench still holds
    complete pairs; runs already recorded in ``out_dir`` are kept. Returns the analysed result."""
    from verl_pipe.local_jobs import local_ray_head

    cfg.validate()
    out_dir = os.path.abspath(cfg.out_dir or os.path.join("runs", time.strftime("bench-learn-%Y%m%d-%H%M%S")))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(asdict(cfg), fh, indent=1)
    started = time.time()
    runs: list[SeedRun] = []
    modes = [cfg.baseline, *(m for m in cfg.modes if m != cfg.baseline)]
    order = [(seed, mode) for seed in cfg.seeds for mode in modes]
    head = contextlib.nullcontext(cfg.ray_address) if cfg.ray_address else local_ray_head(num_cpus=16)
    with head as address:
        pricing = price_steps(cfg, out_dir, address, progress)
        knobs = training_knobs(cfg, pricing)
        for index, (seed, mode) in enumerate(order, 1):
            # the untrained model is validated once: the same weights, problems and greedy decoding in every run
            validate_first = index == 1
            run = load_run(os.path.join(out_dir, f"{mode}-seed{seed}"))
            if run is not None:
                check_recorded(run, cfg, knobs[mode])
            else:
                progress(f"[{index}/{len(order)}] {mode}, seed {seed} ({cfg.engine} rollout, {cfg.steps} steps, "
                         f"knobs {knobs[mode] or '-'}; {time.time() - started:.0f} s so far)")  # fmt: skip
                run = train_run(cfg, mode, seed, knobs[mode], out_dir, address, validate_first)
            summary = ", ".join(f"step {v.step}: {100 * v.accuracy:.1f}%" for v in run.validations)
            progress(f"    {mode} seed {seed}: validation {summary} ({run.wall_s:.0f} s)")
            runs.append(run)
    result = analyse(cfg, runs, pricing, out_dir)
    result["wall_s"] = time.time() - started
    return write_result(result, out_dir)


def analyse(cfg: LearnBenchConfig, runs: list[SeedRun], pricing: Pricing, out_dir: str) -> dict[str, Any]:
    from verl_pipe.bench import learn_stats

    untrained = next(r.verdicts[0] for r in runs if 0 in r.verdicts)
    for run in runs:
        run.verdicts.setdefault(0, untrained)
    analysis = learn_stats.compare_modes(
        {(r.mode, r.seed): r.verdicts for r in runs}, pricing.step_s, baseline=cfg.baseline,
        target=cfg.target, target_margin=cfg.target_margin, margin=cfg.non_inferiority_margin,
        resamples=cfg.bootstrap,
    )
    mark_variants_unpriced(analysis)
    return {
        "config": asdict(cfg),
        "pricing": asdict(pricing),
        "runs": [asdict(r) for r in runs],
        "analysis": analysis,
        "generation": generation_per_mode(runs, cfg),
        "token_lag": token_lag_per_mode(runs, pricing),
        "knobs_trained": training_knobs(cfg, pricing),
        "same_prompt_rewards": learn_stats.same_prompt_rewards(
            {(r.mode, r.seed): {p: (int(step), reward) for p, (step, reward) in r.prompt_rewards.items()}
             for r in runs}, cfg.baseline, resamples=cfg.bootstrap),
        "out_dir": out_dir,
    }


def mark_variants_unpriced(analysis: dict[str, Any]) -> None:
    """A variant is priced as its mode, without its extra generation: its hours and speedup would flatter it, so the
    report shows learning per step for it and no clock."""
    for mode, row in analysis["modes"].items():
        if "+" in mode:
            row["unpriced"] = True
            for key in ("hours_to_target", "speedup_vs_baseline", "price_ratio_vs_baseline"):
                row.pop(key, None)
            row.pop("speedup_interval", None)


def generation_per_mode(runs: list[SeedRun], cfg: LearnBenchConfig) -> dict[str, dict[str, float]]:
    """Per mode, over its seeds: prompt groups generated per group trained (1 without dynamic sampling), and the
    mean share of a step's response tokens spent on groups thrown away."""
    out = {}
    for mode in dict.fromkeys(r.mode for r in runs):
        mine = [r for r in runs if r.mode == mode]
        fracs = [f for r in mine for f in r.dropped_token_frac]
        out[mode] = {
            "groups_per_trained_group": sum(r.groups_generated for r in mine) / (len(mine) * cfg.steps
                                                                                * cfg.prompts_per_step),
            "dropped_token_frac": sum(fracs) / len(fracs) if fracs else 0.0,
        }  # fmt: skip
    return out


def token_lag_per_mode(runs: list[SeedRun], pricing: Pricing) -> dict[str, dict[str, Optional[float]]]:
    """Per mode, the token lag its learning runs trained at (mean over steps and seeds; None when its runs logged
    none) beside the one its step was priced at."""
    out = {}
    for mode in dict.fromkeys(r.mode for r in runs):
        lags = [lag for r in runs if r.mode == mode for lag in r.token_lag]
        out[mode] = {"trained": statistics.mean(lags) if lags else None,
                     "trained_max": max(lags) if lags else None, "priced": pricing.token_lag.get(mode)}  # fmt: skip
    return out


def format_token_lag(lags: dict[str, dict[str, Optional[float]]]) -> list[str]:
    def shown(value: Optional[float]) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    if not lags:
        return []
    lines = ["token lag, policy versions behind the trained weights (learning runs: mean over steps and seeds, worst "
             "step; pricing run on the cluster):"]  # fmt: skip
    for mode, row in lags.items():
        lines.append(f"  {mode:24s} trained at {shown(row['trained'])} (worst step {shown(row['trained_max'])}), "
                     f"priced at {shown(row['priced'])}")  # fmt: skip
    return lines


def format_knobs_trained(result: dict[str, Any]) -> list[str]:
    """A line per mode whose learning runs trained with other knobs than its step was priced with."""
    from verl_pipe.bench.plan import Knobs

    lines = []
    for mode, trained in result.get("knobs_trained", {}).items():
        priced = result["pricing"]["knobs"].get(mode, {})
        if trained != priced:
            schedule = base_mode(mode)
            lines.append(f"{mode} trained with {Knobs(**trained).describe(schedule)} (priced with "
                         f"{Knobs(**priced).describe(schedule)}): --train-lag {result['config'].get('train_lag')}, "
                         "a cap its 2-core runs keep full at the lag its price was measured at")  # fmt: skip
    return lines


def write_result(result: dict[str, Any], out_dir: str) -> dict[str, Any]:
    from verl_pipe.plot import plot_learning

    result["png"] = plot_learning(result, os.path.join(out_dir, "learning.png"))
    result["json"] = os.path.join(out_dir, "learning.json")
    with open(result["json"], "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    return result


def format_generation(generation: dict[str, dict[str, float]]) -> list[str]:
    if not any(row["groups_per_trained_group"] > 1 or row["dropped_token_frac"] for row in generation.values()):
        return []
    lines = ["generation per step (a variant's refills are why the clock above does not price it):"]
    for mode, row in generation.items():
        lines.append(f"  {mode:24s} {row['groups_per_trained_group']:.2f} groups generated per group trained, "
                     f"{100 * row['dropped_token_frac']:.1f}% of response tokens thrown away")  # fmt: skip
    return lines


def format_report(result: dict[str, Any]) -> str:
    from verl_pipe.bench.learn_stats import format_analysis, format_same_prompt_rewards

    cfg, pricing = result["config"], result["pricing"]
    minibatches = pricing_minibatches()
    lines = [
        f"bench learn: SmolLM2-135M-Instruct, GRPO+, {cfg['steps']} steps of {cfg['prompts_per_step']} prompts x "
        f"{cfg['samples_per_prompt']} samples ({minibatches} minibatch updates a step), seeds "
        f"{','.join(map(str, cfg['seeds']))}; greedy validation every {cfg['val_every']} steps",
        f"priced by bench pipeline ({PRICING_PROFILE} profile, the same batch shape, "
        f"{len(next(iter(pricing['step_s'].values())))} blocks): "
        + "; ".join(f"{mode} {pricing['layouts'][mode]} {sum(s) / len(s):.1f} s/step"
                    for mode, s in pricing["step_s"].items()),
        *format_analysis(result["analysis"], cfg.get("baseline", BASELINE_MODE)),
        *format_generation(result.get("generation", {})),
        *format_token_lag(result.get("token_lag", {})),
        *format_knobs_trained(result),
        *format_same_prompt_rewards(result.get("same_prompt_rewards", {}), cfg.get("baseline", BASELINE_MODE)),
        f"curves: {result['png']}",
        f"report: {result['json']}",
    ]
    return "\n".join(lines)
