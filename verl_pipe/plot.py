"""Draw a run's per-step curves (``metrics.jsonl`` from :mod:`verl_pipe.run_metrics`) into one PNG."""

from __future__ import annotations

import math

from verl_pipe.run_metrics import load_summaries


def plot_metrics(metrics_path: str, out_png: str) -> str:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt
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
    fig, axes = plt.subplots(1, 5, figsize=(22, 4))
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
    fig.suptitle(f"verl-pipe run: {metrics_path}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png
