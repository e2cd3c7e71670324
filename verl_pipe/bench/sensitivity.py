"""How the benchmark's headline ratios move with what the cluster model assumes: the sensitivity table.

Each row changes one assumption of the profile's named cluster and re-plans every schedule (its split and knobs,
:mod:`.plan`) with the what-if model (:mod:`.simulate`), so a ratio that holds only under one setting shows it:

* the training time against generation (``train:gen``, verl ``sync``'s layout: 0.1 to 0.6);
* the weight sync between pools against generation (0.005 to 0.05);
* the spread of response lengths (log-normal sigma 0.3 to 0.9);
* the engine (``today``, and the ``staged`` what-if for every schedule).

Each row also prices verl's ``separate_async`` with every sync an in-flight load instead of an abort (tuned the same
way; no mode runs it): its speed over the real one is all that loading without an abort can win on verl's own
schedule, under that row's assumptions. Every row plans at the benchmark's lag target (and verl-pipe's schedules
at no more than verl's separate_async's lag, as the headline does), so its ratios are at equal or lower token lag.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Optional

from verl_pipe.bench import cluster as clusters
from verl_pipe.bench.plan import NO_ABORT_KNOBS, Knobs, held_to_verl_lag, plan, scenario
from verl_pipe.bench.simulate import simulate

SCHEDULES = ("sync", "separate_async", "one_off_pipeline", "minibatch_pipeline", "in_flight_pipeline")
TRAIN_SHARES = (0.1, 0.3, 0.6)
SYNC_SHARES = (0.005, 0.02, 0.05)
SIGMAS = (0.3, 0.9)
SEEDS, STEPS, WARMUP = 2, 8, 2  # small: the table runs in every `make bench` (each headline what-if has 30 seeds)


def _sync_phases(named: clusters.NamedCluster, prompts: int, samples: int) -> tuple[float, float, float]:
    """verl sync's (generation, training, sync between pools) on the cluster, modelled seconds (seed means)."""
    engine = clusters.engine("today")
    layout = clusters.colocated(named)
    model = clusters.latency_model(named, layout, engine, prompts * samples)
    runs = [simulate(scenario(named, engine, "sync", layout, Knobs(), prompts, samples), seed=seed, steps=STEPS,
                     warmup_steps=WARMUP) for seed in range(SEEDS)]  # fmt: skip
    step = statistics.mean(run.step_s for run in runs)
    train = statistics.mean(run.trainer_busy for run in runs) * step
    return step - train - model.sync_s, train, named.roofline().broadcast_sync_s


NO_ABORT = "separate_async_no_abort"


def _row(label: str, named: clusters.NamedCluster, engine: str, prompts: int, samples: int,
         lag_target: Optional[float] = None, match_verl_lag: bool = False) -> dict[str, Any]:  # fmt: skip
    """One row: every schedule's planned step at token lag <= ``lag_target``; with ``match_verl_lag`` verl-pipe's
    schedules at no more than the lag verl's separate_async is planned at, as the headline holds them."""

    def planned(schedule: str, target: Optional[float] = lag_target, **options):
        return plan(named, clusters.engine(engine), schedule, prompts, samples, seeds=SEEDS, steps=STEPS,
                    warmup_steps=WARMUP, max_token_lag=target, **options)  # fmt: skip

    verl = {s: planned(s) for s in ("sync", "separate_async")}
    ours_target = held_to_verl_lag(lag_target, verl["separate_async"].token_lag) if match_verl_lag else lag_target
    steps = {s: (verl[s] if s in verl else planned(s, ours_target)).step_s for s in SCHEDULES}
    steps[NO_ABORT] = planned("separate_async", knob_options=NO_ABORT_KNOBS).step_s
    return {"row": label, "step_s": steps}


def sensitivity_table(cluster_name: str, prompts: int, samples: int, lag_target: Optional[float] = None,
                      match_verl_lag: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """The rows for one named cluster, for a benchmark batch of ``prompts`` x ``samples``, every schedule planned at
    token lag <= ``lag_target`` (None: each one's fastest), ours also at verl's with ``match_verl_lag``."""
    named = clusters.cluster(cluster_name)
    gen, train, sync = _sync_phases(named, prompts, samples)

    def row(label: str, changed: clusters.NamedCluster, engine: str = "today") -> dict[str, Any]:
        return _row(label, changed, engine, prompts, samples, lag_target, match_verl_lag)

    rows = [row(f"as modelled (train:gen {train / gen:.2f}, sync:gen {sync / gen:.3f})", named)]
    rows += [row(f"train:gen {share:g}", replace(named, train_scale=share * gen / train)) for share in TRAIN_SHARES]
    rows += [row(f"sync:gen {share:g}", replace(named, sync_scale=share * gen / sync)) for share in SYNC_SHARES]
    rows += [row(f"length sigma {sigma:g}", clusters.with_workload(named, response_sigma=sigma)) for sigma in SIGMAS]
    rows.append(row("engine staged (what-if)", named, "staged"))
    return rows


def format_sensitivity(tables: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = ["sensitivity (what-if model, every schedule re-planned per row; ratios: speed vs verl's modes)"]
    for profile, rows in tables.items():
        lines.append(f"  {profile + ':':48s} {'sync s':>7s} {'s_async':>8s} {'one_off':>8s} {'minibatch':>9s} "
                     f"{'in_flight':>9s} {'in_flight/s_async':>18s} {'no-abort bound':>15s}")  # fmt: skip
        for row in rows:
            s = row["step_s"]
            ratio = {name: s["sync"] / s[name] for name in SCHEDULES}
            bound = f"{s['separate_async'] / s[NO_ABORT]:14.2f}x" if NO_ABORT in s else f"{'-':>15s}"
            lines.append(
                f"    {row['row']:46s} {s['sync']:7.1f} {ratio['separate_async']:7.2f}x "
                f"{ratio['one_off_pipeline']:7.2f}x {ratio['minibatch_pipeline']:8.2f}x "
                f"{ratio['in_flight_pipeline']:8.2f}x {s['separate_async'] / s['in_flight_pipeline']:17.2f}x {bound}"
            )
    lines.append("  no-abort bound: verl's separate_async, each sync an in-flight load instead of an abort (what-if, "
                 "tuned alike), over the real one: the most a load without abort can win on its schedule")  # fmt: skip
    return lines
