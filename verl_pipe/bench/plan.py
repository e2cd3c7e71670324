"""Choose each trainer mode's layout and knobs on a cluster: the sampler/trainer split, the sync cadence, the loads.

For every mode (verl's ``sync`` and ``separate_async`` as well as ours) the planner prices each split of the
cluster's GPUs and each setting of the mode's own knobs with the what-if model (:mod:`.simulate`) over a few
seeds, and keeps the fastest. verl's modes are tuned the same way ours are, each on its own knobs of staleness
and cadence: ``separate_async`` may sync once a step or after every minibatch update (``parameter_sync_step``),
with a share of a batch to a batch and a half submitted ahead (``num_warmup_batches``); ``in_flight_pipeline``
may load once a step or after every update, under its lag bound of 1, or under a bound of 2 with one to two and a
quarter batches submitted and not yet trained (``max_untrained_prompts``). With a lag target the planner keeps each mode's
fastest setting within it, so staleness is traded for speed by every mode alike.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Optional

from verl_pipe.bench.cluster import Engine, Layout, NamedCluster, colocated, latency_model, split
from verl_pipe.bench.simulate import Scenario, Summary, over_seeds, simulate


@dataclass(frozen=True)
class Knobs:
    sync_every: int = 0  # separate_async: minibatch updates per sync (0: once a step)
    warmup_batches: float = 1.0  # separate_async: batches submitted ahead (num_warmup_batches)
    load_every_update: bool = False  # in_flight_pipeline: a load after every minibatch update
    max_lag: int = 1  # in_flight_pipeline's lag bound
    # in_flight_pipeline: prompt groups submitted and not yet trained, in batches (max_untrained_prompts = this x
    # train_batch_size); 0: only the lag bound limits them
    untrained_batches: float = 0.0
    abort_on_sync: bool = True  # separate_async; False only in the what-if of its sync without the abort

    def describe(self, schedule: str) -> str:
        if schedule == "separate_async":
            cadence = "sync every update" if self.sync_every == 1 else "sync once a step"
            if self.warmup_batches != 1.0:
                cadence += f", {self.warmup_batches:g} batches ahead"
            return cadence if self.abort_on_sync else cadence + ", no abort (what-if)"
        if schedule == "in_flight_pipeline":
            loads = "a load every update" if self.load_every_update else "a load a step"
            batches = "batch" if self.untrained_batches == 1 else "batches"
            cap = f", {self.untrained_batches:g} {batches} untrained" if self.untrained_batches else ""
            return f"lag {self.max_lag}, {loads}{cap}"
        return ""

    def max_untrained_prompts(self, train_batch_size: int) -> int:
        """in_flight_pipeline's cap on prompt groups submitted and not yet trained, for this batch (0: none)."""
        return max(1, round(self.untrained_batches * train_batch_size)) if self.untrained_batches else 0

    def warmup_prompts(self, train_batch_size: int) -> int:
        """The prompt groups separate_async submits ahead of its first batch (verl rounds down to whole prompts)."""
        return int(self.warmup_batches * train_batch_size + 1e-9)


# separate_async's batches ahead and in_flight_pipeline's groups not yet trained, in batches: the planner's grid of
# each mode's staleness (in eighths of a batch, the benchmark's prompts per step). A separate_async step starts
# with its batch and its warm-up untrained, 1 + warmup_batches; the grids span the same range of that.
WARMUP_BATCHES = (0.75, 1.0, 1.25, 1.5)
UNTRAINED_BATCHES = tuple(eighths / 8 for eighths in range(8, 19))


def knob_grid(schedule: str) -> tuple[Knobs, ...]:
    """Every setting of a mode's own knobs the planner prices."""
    if schedule == "separate_async":
        return tuple(Knobs(sync_every=every, warmup_batches=ahead) for every in (0, 1) for ahead in WARMUP_BATCHES)
    if schedule == "in_flight_pipeline":
        # lag bound 1 (its deadlines admit a batch per sync), or a bound of 2 with a cap on the untrained groups
        bounded = tuple(Knobs(load_every_update=every) for every in (False, True))
        return bounded + tuple(Knobs(load_every_update=True, max_lag=2, untrained_batches=share)
                               for share in UNTRAINED_BATCHES)  # fmt: skip
    return (Knobs(),)


# verl's separate_async with each sync an in-flight load: a what-if bound, tuned like the real one.
NO_ABORT_KNOBS = tuple(replace(knobs, abort_on_sync=False) for knobs in knob_grid("separate_async"))


@dataclass(frozen=True)
class Plan:
    schedule: str  # simulate.SCHEDULES name (verl's modes without the verl_ prefix)
    layout: Layout
    knobs: Knobs
    step_s: float  # the mean over the search's seeds, modelled seconds
    token_lag: float = 0.0  # the what-if token lag, same seeds
    # False: the plan was asked for a token lag no setting of the schedule reaches, and is its least-lagged setting
    meets_lag_target: bool = True


def scenario(cluster: NamedCluster, engine: Engine, schedule: str, layout: Layout, knobs: Knobs,
             prompts: int, samples: int) -> Scenario:  # fmt: skip
    """The what-if scenario of one mode on one layout, for a benchmark of ``prompts`` x ``samples`` requests."""
    model = latency_model(cluster, layout, engine, prompts * samples)
    return Scenario(schedule, model, prompts=prompts, samples=samples, minibatches=cluster.workload.minibatches,
                    sync_every=knobs.sync_every, max_lag=knobs.max_lag, load_every_update=knobs.load_every_update,
                    max_untrained=knobs.max_untrained_prompts(prompts),
                    warmup_batches=knobs.warmup_prompts(prompts) / prompts, abort_on_sync=knobs.abort_on_sync)


def layouts(cluster: NamedCluster, schedule: str) -> list[Layout]:
    if schedule == "sync":
        return [colocated(cluster)]
    return [split(cluster, sampler) for sampler, _ in cluster.splits()]


# The token lag every mode is planned at unless told otherwise: one policy version, what one-step off-policy
# training (verl's one_step_off_policy, our one_off_pipeline) trains at. Each mode has a knob that trades staleness
# for speed (batches ahead, groups generating at once), so "each mode's fastest setting" without a bound would be
# its stalest one; a bound makes a faster mode faster at equal or lower token lag.
DEFAULT_LAG_TARGET = 1.0


def lag_target_arg(text: str) -> Optional[float]:
    """``--lag-target``'s value: a token lag in policy versions (>= 0), or ``none`` for each mode's fastest setting
    whatever its staleness."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"--lag-target takes a token lag in policy versions (>= 0) or 'none', got {text!r}")
    return value


def held_to_verl_lag(lag_target: Optional[float], verl_lag: Optional[float]) -> Optional[float]:
    """The lag bound a verl-pipe schedule is planned at when it is held to verl's tuned separate_async: the target,
    or verl's expected lag where that is lower (None for either: the other)."""
    if verl_lag is None:
        return lag_target
    return verl_lag if lag_target is None else min(lag_target, verl_lag)


FINALISTS = 3  # candidates the first, one-seed pass keeps for the full comparison
# One seed's token lag is noisy: the first pass keeps a candidate this far over a lag target, the full pass decides.
SHORTLIST_LAG_SLACK = 0.05


def plan(cluster: NamedCluster, engine: Engine, schedule: str, prompts: int, samples: int, seeds: int = 3,
         steps: int = 12, warmup_steps: int = 3, knob_options: Optional[tuple[Knobs, ...]] = None,
         max_token_lag: Optional[float] = None) -> Plan:  # fmt: skip
    """The fastest layout and knobs of ``schedule`` on the cluster, by the what-if model's mean over ``seeds``: every
    candidate on one seed first, then the fastest few on all of them. ``knob_options``: the settings to try
    (default: the schedule's own, :func:`knob_grid`). ``max_token_lag``: only settings whose token lag is at most
    this count, so that schedules compared on it are compared at equal or lower token lag (a faster setting that
    trains on staler tokens is not a faster schedule); when none reaches it, the least-lagged setting, marked."""

    def priced(layout: Layout, knobs: Knobs, seed_count: int, slack: float = 0.0) -> Plan:
        what_if = scenario(cluster, engine, schedule, layout, knobs, prompts, samples)
        runs = [simulate(what_if, seed=seed, steps=steps, warmup_steps=warmup_steps) for seed in range(seed_count)]
        lag = statistics.mean(run.token_lag for run in runs)
        return Plan(schedule, layout, knobs, statistics.mean(run.step_s for run in runs), token_lag=lag,
                    meets_lag_target=max_token_lag is None or lag <= max_token_lag + slack)  # fmt: skip

    def best(plans: list[Plan]) -> list[Plan]:
        """Fastest first among those within the target; with none within it, least lagged first."""
        within = sorted((p for p in plans if p.meets_lag_target), key=lambda p: p.step_s)
        return within or sorted(plans, key=lambda p: (p.token_lag, p.step_s))

    candidates = [(layout, knobs) for layout in layouts(cluster, schedule)
                  for knobs in knob_options or knob_grid(schedule)]  # fmt: skip
    if len(candidates) <= FINALISTS:
        return best([priced(layout, knobs, seeds) for layout, knobs in candidates])[0]
    # one seed each; then the fastest few on every seed, and the next few while none of those is within the target
    # on every seed (one seed's lag is noisy: a setting just inside the target on it may be just outside)
    ranked = best([priced(layout, knobs, seed_count=1, slack=SHORTLIST_LAG_SLACK) for layout, knobs in candidates])
    finals: list[Plan] = []
    for start in range(0, len(ranked), FINALISTS):
        finals += [priced(p.layout, p.knobs, seeds) for p in ranked[start : start + FINALISTS]]
        if max_token_lag is None or any(p.meets_lag_target for p in finals):
            break
    return best(finals)[0]


def expectation(cluster: NamedCluster, engine: Engine, chosen: Plan, prompts: int, samples: int,
                seeds: int = 30) -> Summary:  # fmt: skip
    """The chosen plan's noise-free expectation over ``seeds`` draws of response lengths."""
    return over_seeds(scenario(cluster, engine, chosen.schedule, chosen.layout, chosen.knobs, prompts, samples),
                      seeds=seeds)  # fmt: skip


# --- the planner users run: every mode on their cluster ---------------------------------------------------------

MODES = ("sync", "separate_async", "one_off_pipeline", "minibatch_pipeline", "in_flight_pipeline")
MAX_SIMULATED_REQUESTS = 64  # requests per step the what-if model runs; each stands for the cluster's rest


def simulated_batch(cluster: NamedCluster) -> tuple[int, int]:
    """(prompts, samples) the what-if model runs for the cluster's batch: the fewest prompts that keep a whole
    number of the cluster's prompts behind each and the minibatches whole, at most MAX_SIMULATED_REQUESTS
    requests (the same load per GPU: each request stands for request_multiplicity of the cluster's)."""
    work = cluster.workload
    for share in range(1, work.prompts + 1):
        prompts = work.prompts // share
        fits = prompts * work.samples <= MAX_SIMULATED_REQUESTS
        if work.prompts % share == 0 and prompts % work.minibatches == 0 and fits:
            return prompts, work.samples
    return work.prompts, work.samples


@dataclass(frozen=True)
class ModePlan:
    chosen: Plan
    expected: Summary


def plan_modes(cluster: NamedCluster, engine: Engine, seeds: int = 5,
               max_token_lag: Optional[float] = DEFAULT_LAG_TARGET) -> dict[str, ModePlan]:  # fmt: skip
    prompts, samples = simulated_batch(cluster)
    plans = {}
    for mode in MODES:
        chosen = plan(cluster, engine, mode, prompts, samples, max_token_lag=max_token_lag)
        plans[mode] = ModePlan(chosen, expectation(cluster, engine, chosen, prompts, samples, seeds=seeds))
    return plans


def pool_overrides(gpus: int, gpus_per_node: int, prefix: str) -> list[str]:
    """A pool of ``gpus`` as whole nodes, or as a share of one node."""
    nodes, per_node = (gpus // gpus_per_node, gpus_per_node) if gpus % gpus_per_node == 0 else (1, gpus)
    return [f"{prefix}.nnodes={nodes}", f"{prefix}.n_gpus_per_node={per_node}"]


def hydra_overrides(mode: str, chosen: Plan, gpus_per_node: int, prompts: int, minibatches: int) -> list[str]:
    """What to add to a verl command line to run ``mode`` the way the plan prices it, on the cluster's batch of
    ``prompts`` prompt groups in ``minibatches`` updates a step."""
    layout, knobs = chosen.layout, chosen.knobs
    if layout.colocated:
        return ["trainer.v1.trainer_mode=sync", "actor_rollout_ref.hybrid_engine=True",
                *pool_overrides(layout.gpus, gpus_per_node, "trainer")]  # fmt: skip
    pools = [*pool_overrides(layout.trainer_gpus, gpus_per_node, "trainer"),
             *pool_overrides(layout.sampler_gpus, gpus_per_node, "actor_rollout_ref.rollout")]  # fmt: skip
    if mode == "separate_async":
        # a sync after every update makes each minibatch a verl step (train_batch_size = ppo_mini_batch_size), and
        # verl counts its warm-up in those batches
        every_update = knobs.sync_every == 1
        cadence = "1" if every_update else f"{minibatches}"
        ahead = knobs.warmup_prompts(prompts) / (prompts // minibatches if every_update else prompts)
        return ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.hybrid_engine=False",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                f"trainer.v1.separate_async.parameter_sync_step={cadence}",
                f"trainer.v1.separate_async.num_warmup_batches={ahead:g}", *pools]  # fmt: skip
    extra = []
    if mode == "in_flight_pipeline":
        cap = knobs.max_untrained_prompts(prompts)
        extra = [f"+trainer.v1.in_flight_pipeline.load_every_update={str(knobs.load_every_update).lower()}",
                 f"+trainer.v1.in_flight_pipeline.max_lag={knobs.max_lag}",
                 *([f"+trainer.v1.in_flight_pipeline.max_untrained_prompts={cap}"] if cap else [])]  # fmt: skip
    return ["'hydra.searchpath=[pkg://verl_pipe.config]'", f"+verl_pipe_trainer={mode}", *extra, *pools]


def format_plans(cluster: NamedCluster, engine: Engine, plans: dict[str, ModePlan], gpus_per_node: int,
                 max_token_lag: Optional[float] = None) -> str:  # fmt: skip
    work = cluster.workload
    sync_step = plans["sync"].expected.step_s
    target = ("; each mode's fastest setting, whatever its token lag" if max_token_lag is None
              else f"; each mode's fastest setting at token lag <= {max_token_lag:g}")  # fmt: skip
    lines = [
        f"{cluster.shape} on {cluster.gpus} x {cluster.gpu} (TP-{cluster.tp}), {work.prompts} prompts x {work.samples} "
        f"samples, responses median {work.median_response_tokens} / sigma {work.response_sigma} / cap "
        f"{work.max_response_tokens}, reward {work.reward_s:g} s per sample; engine {engine.name} ({engine.summary})"
        f"{target}",
        *(f"  {name}: {value} ({source})" for name, value, source in cluster.roofline().sources()),
        "",
        f"  {'mode':20s} {'layout':24s} {'knobs':28s} {'step s':>12s} {'vs sync':>8s} {'smp busy':>8s} "
        f"{'trn busy':>8s} {'tok lag':>7s}",
    ]
    for mode, planned in plans.items():
        c, e = planned.chosen, planned.expected
        lines.append(
            f"  {mode:20s} {c.layout.describe():24s} {c.knobs.describe(mode) or '-':28s} "
            f"{e.step_s:7.1f} ±{e.step_s_sd:4.1f} {sync_step / e.step_s:7.2f}x {e.sampler_busy:8.0%} "
            f"{e.trainer_busy:8.0%} {e.token_lag:7.2f}" + ("" if c.meets_lag_target else "  (none of its settings is "
                                                          "within the lag target: its least lagged)")
        )
    lines += ["", "  hydra overrides (add to your verl command line):"]
    for mode, planned in plans.items():
        args = hydra_overrides(mode, planned.chosen, gpus_per_node, work.prompts, work.minibatches)
        lines.append(f"  {mode}: {' '.join(args)}")
    lines.append(f"  (what-if model, {plans['sync'].expected.seeds} seeds; step times in seconds on the cluster; "
                 "verl-pipe's docs/bench.md says what it does not model)")  # fmt: skip
    return "\n".join(lines)
