"""Every picture verl-pipe draws (matplotlib, one PNG each), behind ``verl-pipe plot`` and the commands that plot:

* training curves of a quickstart run (its ``metrics.jsonl``, :mod:`verl_pipe.run_metrics`) or of any verl run
  (the ``file`` logger's ``VERL_FILE_LOGGER_PATH``): reward, pass rate, response length, entropy, groups skipped
  and the time per phase;
* a pipelined run's timeline (its chrome trace, :mod:`verl_pipe.trainers.timeline`) as a Gantt chart;
* the pipeline benchmark's schedules side by side (lanes rebuilt by :mod:`verl_pipe.bench.schedule_lanes`);
* the learning benchmark's accuracy and reward curves (:mod:`verl_pipe.bench.learn`).

What to draw comes from the module that owns the data; this one only draws.
"""

from __future__ import annotations

import json
import math
import os
from typing import Sequence

from verl_pipe.run_metrics import load_summaries
from verl_pipe.trainers.timeline import TRACKS, Interval, lanes, load_trace


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


# --- training curves of a quickstart run -------------------------------------------------------------------------


def plot_metrics(metrics_path: str, out_png: str, validations: Sequence = ()) -> str:
    """A quickstart run's curves; with ``validations`` (:class:`verl_pipe.run_metrics.Validation`, step 0 the
    untrained model) a panel of greedy validation accuracy with Wilson 95% bars as well."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    rows = load_summaries(metrics_path)
    if not rows:
        raise ValueError(f"{metrics_path} has no steps to plot")
    steps = [r["step"] for r in rows]

    def series(key):
        return [float("nan") if r.get(key) is None else r[key] for r in rows]

    phase_names = [p for p in rows[-1]["phases_s"] if p != "step"]
    panels = [
        ("reward mean", series("reward_mean")),
        ("pass rate", series("pass_rate")),
        ("format rate", series("format_rate")),
        ("response length (tokens)", series("response_length_mean")),
    ]
    fig, axes = plt.subplots(1, 6 if validations else 5, figsize=(26.4 if validations else 22, 4))
    for ax, (title, ys) in zip(axes, panels):
        ax.plot(steps, ys, marker="o")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    bottom = [0.0] * len(rows)
    for name in phase_names:
        secs = [r["phases_s"].get(name, 0.0) for r in rows]
        secs = [0.0 if math.isnan(s) else s for s in secs]
        axes[4].bar(steps, secs, bottom=bottom, label=name)
        bottom = [b + s for b, s in zip(bottom, secs)]
    axes[4].set_title("time per phase (s)")
    axes[4].set_xlabel("step")
    axes[4].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[4].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if validations:
        ax = axes[5]
        accuracy = [100 * v.accuracy for v in validations]
        low = [a - 100 * v.interval[0] for a, v in zip(accuracy, validations)]
        high = [100 * v.interval[1] - a for a, v in zip(accuracy, validations)]
        ax.errorbar([v.step for v in validations], accuracy, yerr=[low, high], marker="o", capsize=4)
        for v, a in zip(validations, accuracy):
            ax.annotate(f"{a:.1f}%", (v.step, a), textcoords="offset points", xytext=(6, -3), fontsize=8)
        ax.set_title(f"greedy validation accuracy (%), {validations[0].items} problems")
        ax.set_xlabel("step (0: before training)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    fig.suptitle(f"verl-pipe run: {metrics_path}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png


# --- training curves from verl's own metrics log ----------------------------------------------------------------

# (panel title, metric keys tried in order); the first key present in a run is drawn.
VERL_CURVES = (
    ("reward (mean score)", ("critic/score/mean",)),
    ("pass rate", ("reward/outcome/pass",)),
    ("response length (tokens)", ("response_length/mean",)),
    ("entropy", ("actor/entropy",)),
    ("groups skipped", ("pipeline/filter/uniform_groups_skipped", "grpo_plus/groups_degenerate")),
)
_PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "save_checkpoint", "testing")


def load_verl_metrics(path: str) -> list[tuple[int, dict]]:
    """verl's ``file`` logger output (one ``{"step", "data"}`` record per line), training steps only, by step."""
    with open(path, encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    if records and not all(isinstance(r, dict) and "step" in r and "data" in r for r in records):
        raise ValueError(f"{path} is not verl's file-logger output: each line must be {{'step': N, 'data': {{...}}}}")
    steps: dict[int, dict] = {}
    for record in records:
        if "timing_s/step" in record["data"]:  # validation-only records carry no step timing
            steps[int(record["step"])] = record["data"]  # a resumed run re-logs a step: keep the last
    return sorted(steps.items())


def is_verl_metrics(path: str) -> bool:
    with open(path, encoding="utf-8") as fh:
        first = next((line for line in fh if line.strip()), "")
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and "data" in record and "step" in record


def plot_verl_metrics(metrics_path: str, out_png: str) -> str:
    """Training curves of any verl run (its ``VERL_FILE_LOGGER_PATH`` file) and the time per phase, in one PNG."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    rows = load_verl_metrics(metrics_path)
    if not rows:
        raise ValueError(f"{metrics_path} has no training steps to plot")
    steps = [step for step, _ in rows]
    fig, axes = plt.subplots(1, len(VERL_CURVES) + 1, figsize=(4.2 * (len(VERL_CURVES) + 1), 4))
    for ax, (title, keys) in zip(axes, VERL_CURVES):
        key = next((k for k in keys if any(k in data for _, data in rows)), None)
        if key is None:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        else:
            ax.plot(steps, [float(data.get(key, math.nan)) for _, data in rows], marker="o")
            ax.set_ylabel(key, fontsize=7)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    bottom = [0.0] * len(rows)
    for phase in _PHASES:
        secs = [float(data.get(f"timing_s/{phase}", 0.0)) for _, data in rows]
        if any(secs):
            axes[-1].bar(steps, secs, bottom=bottom, label=phase)
            bottom = [b + s for b, s in zip(bottom, secs)]
    axes[-1].plot(steps, [float(data["timing_s/step"]) for _, data in rows], "k.", label="step")
    axes[-1].set_title("time per phase (s)")
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"verl run: {metrics_path}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png


# --- the learning benchmark: accuracy against steps and against the modelled cluster's hours ------------------


def plot_learning(result: dict, out_png: str) -> str:
    """``bench learn``'s report: each mode's validation accuracy (the mean over seeds with its 95% bootstrap band,
    each seed thin) and training reward, against steps and against the modelled cluster's hours, with the target
    accuracy as a line."""
    plt = _pyplot()

    analysis = result["analysis"]
    steps = analysis["steps"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), sharey="row")
    for mode, row in analysis["modes"].items():
        hours_per_step = row["price_s"] / 3600.0
        rewards = [run["rewards"] for run in result["runs"] if run["mode"] == mode]
        for column, scale in ((0, 1.0), (1, hours_per_step)):
            if column == 1 and row.get("unpriced"):  # a variant has no clock (learn.mark_variants_unpriced)
                continue
            x = [s * scale for s in steps]
            line = axes[0][column].plot(x, [100 * a for a in row["accuracy"]], marker="o", label=mode)[0]
            colour = line.get_color()
            axes[0][column].fill_between(x, [100 * lo for lo, _ in row["accuracy_interval"]],
                                         [100 * hi for _, hi in row["accuracy_interval"]], color=colour, alpha=0.15)
            for per_seed in row["accuracy_per_seed"]:
                axes[0][column].plot(x, [100 * a for a in per_seed], color=colour, linewidth=0.6, alpha=0.5)
            for seed_rewards in rewards:
                axes[1][column].plot([(s + 1) * scale for s in range(len(seed_rewards))], seed_rewards, marker=".",
                                     color=colour, linewidth=0.8, label=mode if seed_rewards is rewards[0] else None)
    for column, xlabel in ((0, "step"), (1, "modelled cluster hours (step price from bench pipeline, coding)")):
        axes[0][column].axhline(100 * analysis["target"], color="k", linestyle="--", linewidth=0.8, label="target")
        axes[0][column].set_title("greedy validation accuracy (%): seed mean, 95% band; thin: seeds")
        axes[1][column].set_title("training reward (mean score, T=%.1f), each seed" % result["config"]["temperature"])
        for row_axes in (0, 1):
            axes[row_axes][column].set_xlabel(xlabel)
            axes[row_axes][column].grid(alpha=0.3)
    axes[0][1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"verl-pipe bench learn: {result['out_dir']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png


# --- a pipelined run's timeline -----------------------------------------------------------------------------------

_TIMELINE_COLOURS = {"wait for samples": "#d62728", "train": "#1f77b4", "sync": "#ff7f0e", "validate": "#9467bd"}


def plot_trace(trace_path: str, out_png: str) -> str:
    """Gantt chart of a trace: one band per track, one row per overlapping lane."""
    plt = _pyplot()
    intervals = load_trace(trace_path)
    if not intervals:
        raise ValueError(f"{trace_path} has no intervals to draw")
    rows: list[tuple[str, list[Interval]]] = []
    for track in TRACKS:
        items = sorted((i for i in intervals if i.track == track), key=lambda i: (i.start, i.end))
        track_lanes = lanes(items)
        for lane in range(max(track_lanes, default=-1) + 1):
            label = f"{track} {lane}" if max(track_lanes) else track
            rows.append((label, [i for i, l in zip(items, track_lanes) if l == lane]))
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.35 * len(rows)))
    for y, (_, items) in enumerate(reversed(rows)):
        for i in items:
            colour = _TIMELINE_COLOURS.get(i.name, "#2ca02c" if i.track == "sampler" else "#8c564b")
            ax.broken_barh([(i.start, max(i.end - i.start, 1e-3))], (y - 0.4, 0.8), color=colour)
    ax.set_yticks(range(len(rows)), [label for label, _ in reversed(rows)])
    ax.set_xlabel("seconds since the first event")
    ax.set_title(os.path.basename(trace_path))
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in [*_TIMELINE_COLOURS.values(), "#2ca02c", "#8c564b"]]
    ax.legend(
        handles,
        [*_TIMELINE_COLOURS, "generate batch", "score sample"],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35 if len(rows) < 6 else -0.12),
        fontsize=7,
        ncol=6,
        frameon=False,
    )
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


# --- the pipeline benchmark's schedules --------------------------------------------------------------------------

_SCHEDULE_COLOURS = {
    "wait for samples": "#d9d9d9",
    "train": "#1f77b4",
    "sync": "#d62728",
    "generate": "#2ca02c",
}


def plot_schedules(panels: Sequence[tuple[str, float, list[Interval]]], out_png: str) -> str:
    """One panel per ``(title, origin, intervals)`` (a schedule's trainer and sampler lanes), all on the same
    seconds-since-``origin`` axis."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 1.1 * len(panels) + 1.0), sharex=True, squeeze=False)
    for ax, (title, origin, intervals) in zip(axes[:, 0], panels):
        for lane, track in enumerate(("trainer", "sampler")):
            for item in (i for i in intervals if i.track == track):
                ax.broken_barh([(item.start - origin, max(item.end - item.start, 1e-3))], (lane - 0.4, 0.8),
                               color=_SCHEDULE_COLOURS.get(item.name, "#8c564b"))  # fmt: skip
        ax.set_yticks([0, 1], ["trainer", "sampler"])
        ax.set_title(title, fontsize=8, loc="left")
    axes[-1, 0].set_xlabel("seconds since the first measured step began")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _SCHEDULE_COLOURS.values()]
    fig.legend(handles, list(_SCHEDULE_COLOURS), loc="lower center", ncol=len(_SCHEDULE_COLOURS), fontsize=7,
               frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
