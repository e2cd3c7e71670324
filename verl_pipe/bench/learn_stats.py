"""The learning bench's statistics: accuracy curves over seeds, item-by-item paired differences against verl's
``sync`` at equal steps (non-inferiority), and time to a target accuracy on the modelled cluster's clock.

Every interval is a 95% percentile bootstrap that resamples what varies between repeats of the experiment: the
seeds (runs), the validation items (the same resampled items for both modes: the comparison is paired), and, for
times, the pricing benchmark's paired blocks. Time to target is where the seed-mean accuracy curve first crosses
the target, interpolated linearly between validations (so it is not a step function of the validation interval),
times the mode's mean step price. A resample in which a mode never reaches the target counts as infinitely slow,
so such resamples widen the interval instead of being dropped.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from verl_pipe.run_metrics import wilson_interval

Verdicts = dict[int, dict[str, int]]  # step -> item -> 1 when it passed


def crossing_step(steps: np.ndarray, accuracy: np.ndarray, target: float) -> float:
    """The first step at which ``accuracy`` (validated at ``steps``, step 0 first) reaches ``target``, linearly
    interpolated from the validation before; inf when it never does."""
    for j in range(1, len(steps)):
        if accuracy[j] >= target:
            before = accuracy[j - 1]
            if before >= target:  # only when the target is at or below the untrained accuracy
                return float(steps[j - 1])
            return float(steps[j - 1] + (target - before) / (accuracy[j] - before) * (steps[j] - steps[j - 1]))
    return math.inf


def _cube(runs: dict[tuple[str, int], Verdicts], mode: str, seeds: list[int], steps: list[int],
          items: list[str]) -> np.ndarray:  # fmt: skip
    """(seeds, steps, items) array of one mode's verdicts."""
    return np.array([[[runs[(mode, seed)][step][item] for item in items] for step in steps] for seed in seeds],
                    dtype=np.float64)  # fmt: skip


def _resampled_curves(cube: np.ndarray, seed_idx: np.ndarray, item_idx: np.ndarray) -> np.ndarray:
    """(resamples, steps) accuracy: each resample's seeds and items, the same indices for every mode."""
    per_seed = cube[:, :, item_idx].mean(axis=3)  # (seeds, steps, resamples)
    chosen = per_seed[seed_idx, :, np.arange(seed_idx.shape[0])[:, None]]  # (resamples, drawn seeds, steps)
    return chosen.mean(axis=1)


def _interval(values: np.ndarray) -> list[float]:
    low, high = np.percentile(values, [2.5, 97.5], method="inverted_cdf")  # no interpolation: inf stays inf
    return [float(low), float(high)]


def compare_modes(runs: dict[tuple[str, int], Verdicts], price_s: dict[str, list[float]], baseline: str,
                  target: Optional[float], target_margin: float, margin: float, resamples: int,
                  rng_seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """The analysis of every mode against ``baseline``, paired over the seeds both ran; ``price_s``: each mode's
    cluster seconds per step, one value per pricing block (blocks paired across modes)."""
    modes = sorted({mode for mode, _ in runs}, key=lambda m: (m != baseline, m))
    untrained = next(iter(runs.values()))[0]
    items = sorted(untrained)
    for (mode, seed), verdicts in runs.items():
        if verdicts[0] != untrained or any(sorted(v) != items for v in verdicts.values()):
            raise ValueError(f"{mode} seed {seed}: its validations are not of the same items from the same start")
    steps = sorted(set.intersection(*(set(v) for v in runs.values())))
    passed0 = sum(untrained.values())
    low0, high0 = wilson_interval(passed0, len(items))
    if target is None:
        target = high0 + target_margin
    if target <= passed0 / len(items):
        raise ValueError(f"target {target:.3f} is not above the untrained accuracy {passed0 / len(items):.3f}")

    rng = np.random.default_rng(rng_seed)
    item_idx = rng.integers(0, len(items), size=(resamples, len(items)))
    blocks = min(len(p) for p in price_s.values())
    block_idx = rng.integers(0, blocks, size=(resamples, blocks))
    steps_axis = np.array(steps, dtype=np.float64)

    def hours(mode: str, crossing: np.ndarray, drawn_blocks: Optional[np.ndarray] = None) -> np.ndarray:
        prices = np.array(price_s[mode][:blocks])
        mean_price = prices[drawn_blocks].mean(axis=1) if drawn_blocks is not None else prices.mean()
        return crossing * mean_price / 3600.0

    base_seeds = sorted(seed for mode, seed in runs if mode == baseline)
    table: dict[str, Any] = {}
    for mode in modes:
        seeds = sorted(seed for m, seed in runs if m == mode and (baseline, seed) in runs)
        seed_idx = rng.integers(0, len(seeds), size=(resamples, len(seeds)))
        cube = _cube(runs, mode, seeds, steps, items)
        base = _cube(runs, baseline, seeds, steps, items)
        curves, base_curves = _resampled_curves(cube, seed_idx, item_idx), _resampled_curves(base, seed_idx, item_idx)
        mean_curve = cube.mean(axis=(0, 2))
        crossing = crossing_step(steps_axis, mean_curve, target)
        drawn = np.array([crossing_step(steps_axis, c, target) for c in curves])
        row: dict[str, Any] = {
            "seeds": seeds,
            "accuracy": [float(a) for a in mean_curve],
            "accuracy_interval": [_interval(curves[:, j]) for j in range(len(steps))],
            "accuracy_per_seed": [[float(a) for a in cube[s].mean(axis=1)] for s in range(len(seeds))],
            "steps_to_target": crossing,
            "steps_to_target_per_seed": [crossing_step(steps_axis, cube[s].mean(axis=1), target)
                                         for s in range(len(seeds))],  # fmt: skip
            "steps_to_target_interval": _interval(drawn),
            "reached_share": float(np.isfinite(drawn).mean()),
            "price_s": float(np.mean(price_s[mode][:blocks])),
            "hours_to_target": float(hours(mode, np.array(crossing))),
        }
        if mode != baseline:
            difference = curves - base_curves  # paired: the same seeds and items for both
            delta = cube - base  # (seeds, steps, items): +1 only this mode passed, -1 only sync
            row["difference"] = [float(d) for d in (cube.mean(axis=(0, 2)) - base.mean(axis=(0, 2)))]
            row["difference_interval"] = [_interval(difference[:, j]) for j in range(len(steps))]
            row["non_inferior"] = [bool(low > -margin) for low, _ in row["difference_interval"]]
            row["discordant"] = [[int((delta[:, j] > 0).sum()), int((delta[:, j] < 0).sum())] for j in range(len(steps))]
            base_cross = np.array([crossing_step(steps_axis, c, target) for c in base_curves])
            with np.errstate(divide="ignore", invalid="ignore"):
                speedups = hours(baseline, base_cross, block_idx) / hours(mode, drawn, block_idx)
            both_never = np.isnan(speedups)  # neither reached the target in this resample
            base_hours = hours(baseline, np.array(crossing_step(steps_axis, base.mean(axis=(0, 2)), target)))
            point = base_hours / row["hours_to_target"] if math.isfinite(row["hours_to_target"]) else 0.0
            row["speedup_vs_baseline"] = float(point) if math.isfinite(base_hours) else math.inf
            row["speedup_interval"] = _interval(speedups[~both_never]) if (~both_never).any() else [math.nan] * 2
            row["speedup_unresolved_share"] = float(both_never.mean())
            row["price_ratio_vs_baseline"] = float(np.mean(price_s[baseline][:blocks]) / row["price_s"])
        table[mode] = row
    return {
        "steps": steps,
        "items": len(items),
        "untrained": {"passed": passed0, "accuracy": passed0 / len(items), "interval": [low0, high0]},
        "target": target,
        "margin": margin,
        "resamples": resamples,
        "baseline_seeds": base_seeds,
        "modes": table,
    }


def format_analysis(analysis: dict[str, Any], baseline: str) -> list[str]:
    """The report's lines: accuracy per step, the paired differences, and time to target."""
    steps = analysis["steps"]
    untrained = analysis["untrained"]
    low, high = untrained["interval"]
    lines = [
        f"untrained: {100 * untrained['accuracy']:.1f}% [{100 * low:.1f}, {100 * high:.1f}] of {analysis['items']} "
        f"items; target {100 * analysis['target']:.1f}% (the upper bound + margin)",
        f"accuracy at each validated step, mean over seeds [95% bootstrap over seeds and items]:",
        "  " + f"{'mode':24s} {'seeds':>5s} " + " ".join(f"{'step ' + str(s):>20s}" for s in steps),
    ]
    for mode, row in analysis["modes"].items():
        cells = [f"{100 * a:5.1f} [{100 * lo:4.1f},{100 * hi:4.1f}]" for a, (lo, hi) in
                 zip(row["accuracy"], row["accuracy_interval"])]  # fmt: skip
        lines.append("  " + f"{mode:24s} {len(row['seeds']):5d} " + " ".join(f"{c:>20s}" for c in cells))
    lines.append(f"paired difference against {baseline}, points (same seeds, same items) [95%]; non-inferior: lower "
                 f"bound above -{100 * analysis['margin']:.0f} points (! where not shown)")  # fmt: skip
    for mode, row in analysis["modes"].items():
        if mode == baseline:
            continue
        cells = [f"{100 * d:+5.1f} [{100 * lo:+5.1f},{100 * hi:+5.1f}]{'' if ok else '!'}" for d, (lo, hi), ok in
                 zip(row["difference"], row["difference_interval"], row["non_inferior"])]  # fmt: skip
        lines.append("  " + f"{mode:24s} {'':5s} {'':>20s} " + " ".join(f"{c:>20s}" for c in cells[1:]))
    lines.append("time to target on the modelled cluster (steps x mean step price):")
    lines.append(f"  {'mode':24s} {'steps [95%]':>18s} {'per seed':>18s} {'reached':>8s} {'step s':>7s} {'hours':>7s} "
                 f"{'vs ' + baseline + ' [95%]':>22s}")  # fmt: skip
    for mode, row in analysis["modes"].items():
        s_low, s_high = row["steps_to_target_interval"]
        per_seed = ",".join(f"{s:.1f}" if math.isfinite(s) else "-" for s in row["steps_to_target_per_seed"])
        if row.get("unpriced"):  # a variant whose extra generation the step price leaves out: no clock for it
            speed, price, hours = "not priced", "-", "-"
        else:
            speed, price, hours = "-", f"{row['price_s']:7.1f}", f"{row['hours_to_target']:7.3f}"
        if mode != baseline and not row.get("unpriced"):
            lo, hi = row["speedup_interval"]
            speed = f"{row['speedup_vs_baseline']:.2f}x [{lo:.2f},{hi:.2f}]"
        lines.append(
            f"  {mode:24s} {row['steps_to_target']:5.1f} [{s_low:4.1f},{s_high:4.1f}] {per_seed:>18s} "
            f"{100 * row['reached_share']:7.0f}% {price:>7s} {hours:>7s} {speed:>22s}"
        )
    return lines


# --- training reward on the same prompts -----------------------------------------------------------------------

PromptRewards = dict[str, tuple[int, float]]  # trained prompt -> (step it trained at, mean reward of its group)


def same_prompt_rewards(runs: dict[tuple[str, int], PromptRewards], baseline: str, resamples: int,
                        rng_seed: int = 0) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Per mode against ``baseline``, per step the mode trained: its groups' reward beside the baseline's groups of
    the same prompts (same seed), and the paired difference with a 95% bootstrap over seeds and prompts.

    A step's training reward moves with the policy that sampled it and with which prompts the step trained. Pairing
    each group with the baseline's group of the same prompt takes the second out: a mode whose feeder hands a step
    the groups that finish first (short, easy answers) shows it as the baseline's reward on those prompts above
    the baseline's own step, and as the mean step the baseline trained them at (``baseline_step``) away from the
    mode's; a policy that samples worse shows it as a negative difference."""
    rng = np.random.default_rng(rng_seed)
    out: dict[str, list[dict[str, Any]]] = {}
    for mode in sorted({m for m, _ in runs if m != baseline}):
        seeds = sorted(seed for m, seed in runs if m == mode and (baseline, seed) in runs)
        pairs: dict[int, list[np.ndarray]] = {}  # step -> per seed: rows of (reward, baseline reward, its step)
        for seed in seeds:
            mine, base = runs[(mode, seed)], runs[(baseline, seed)]
            for step in sorted({s for s, _ in mine.values()}):
                rows = [(r, base[p][1], base[p][0]) for p, (s, r) in mine.items() if s == step and p in base]
                pairs.setdefault(step, []).append(np.array(rows, dtype=np.float64).reshape(-1, 3))
        out[mode] = [_paired_step(step, per_seed, rng, resamples) for step, per_seed in sorted(pairs.items())]
    return out


def _paired_step(step: int, per_seed: list[np.ndarray], rng: np.random.Generator, resamples: int) -> dict[str, Any]:
    per_seed = [rows for rows in per_seed if len(rows)]
    rows = np.concatenate(per_seed) if per_seed else np.zeros((0, 3))
    drawn = np.empty(resamples)
    for r in range(resamples):  # seeds with replacement, then each drawn seed's prompts with replacement
        picked = [per_seed[i] for i in rng.integers(0, len(per_seed), size=len(per_seed))]
        diffs = [(s[:, 0] - s[:, 1])[rng.integers(0, len(s), size=len(s))] for s in picked]
        drawn[r] = np.concatenate(diffs).mean() if diffs else math.nan
    return {
        "step": step,
        "pairs": int(len(rows)),
        "reward": float(rows[:, 0].mean()) if len(rows) else math.nan,
        "baseline_reward": float(rows[:, 1].mean()) if len(rows) else math.nan,
        "difference": float((rows[:, 0] - rows[:, 1]).mean()) if len(rows) else math.nan,
        "difference_interval": _interval(drawn) if len(rows) else [math.nan, math.nan],
        "baseline_step": float(rows[:, 2].mean()) if len(rows) else math.nan,
    }


def format_same_prompt_rewards(table: dict[str, list[dict[str, Any]]], baseline: str) -> list[str]:
    if not any(table.values()):
        return []
    lines = [f"training reward on the same prompts: each mode's groups against {baseline}'s groups of the same "
             f"prompts, same seed [95% bootstrap over seeds and prompts]; '{baseline} step' is when {baseline} "
             "trained them (the order the feeder handed them on)"]  # fmt: skip
    for mode, rows in table.items():
        lines.append(f"  {mode:24s} {'step':>4s} {'pairs':>5s} {'reward':>7s} {baseline:>7s} "
                     f"{'difference [95%]':>22s} {baseline + ' step':>10s}")  # fmt: skip
        for row in rows:
            lo, hi = row["difference_interval"]
            lines.append(f"  {'':24s} {row['step']:4d} {row['pairs']:5d} {row['reward']:7.3f} "
                         f"{row['baseline_reward']:7.3f} {row['difference']:+7.3f} [{lo:+6.3f},{hi:+6.3f}] "
                         f"{row['baseline_step']:10.2f}")  # fmt: skip
    return lines
