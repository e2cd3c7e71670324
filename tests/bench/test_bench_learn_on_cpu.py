"""``verl-pipe bench learn``: its statistics on hand-made verdicts (each property shown failing when it breaks),
reading verl's validation dump and a pricing report, the report and picture it writes, and its config errors. (The
runs themselves are verl's trainer through the quickstart, which the end-to-end tests cover; the experiment is
`make bench-learn`, docs/learning.md.)"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest

from verl_pipe.bench.learn import (
    MODE_SCHEDULES,
    VARIANTS,
    LearnBenchConfig,
    Pricing,
    SeedRun,
    check_recorded,
    format_generation,
    format_knobs_trained,
    format_report,
    format_token_lag,
    generation_per_mode,
    mark_variants_unpriced,
    item_verdicts,
    knobs_at_priced_lag,
    load_run,
    pricing_from_report,
    pricing_minibatches,
    step_token_lags,
    token_lag_per_mode,
    trained_prompt_rewards,
    training_knobs,
    variant_overrides,
    write_result,
)
from verl_pipe.bench.learn_stats import (
    compare_modes,
    crossing_step,
    format_analysis,
    format_same_prompt_rewards,
    same_prompt_rewards,
)
from verl_pipe.cli import build_parser
from verl_pipe.compat import SetupError
from verl_pipe.run_metrics import Validation, validations_from_verl_log, wilson_interval

ITEMS = [f"problem {i}" for i in range(120)]
STEPS = (0, 2, 4, 6)


def test_wilson_interval_matches_its_closed_forms():
    z2 = 1.959964**2
    low, high = wilson_interval(0, 10)  # at 0 successes the upper bound is z^2 / (n + z^2)
    assert low == 0.0 and high == pytest.approx(z2 / (10 + z2))
    assert wilson_interval(50, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)  # the textbook 50/100
    for k in range(0, 121, 7):  # symmetric under swapping successes and failures
        low, high = wilson_interval(k, 120)
        mirror_low, mirror_high = wilson_interval(120 - k, 120)
        assert low == pytest.approx(1 - mirror_high) and high == pytest.approx(1 - mirror_low)
        assert low <= k / 120 <= high
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(5, 4)


def test_validations_are_read_from_verls_log_as_counts(tmp_path):
    path = tmp_path / "m.jsonl"
    rate = {"val-aux/verl_pipe/easy_code/passed/mean@1": 37 / 120, "val-core/verl_pipe/easy_code/reward/mean@1": 0.3}
    path.write_text(json.dumps({"step": 0, "data": rate}) + "\n"
                    + json.dumps({"step": 1, "data": {"critic/score/mean": 0.2}}) + "\n")  # fmt: skip
    assert validations_from_verl_log(str(path), 120) == [Validation(0, 37, 120)]


def test_crossing_is_interpolated_between_validations():
    steps = np.array([0, 2, 4, 6.0])
    assert crossing_step(steps, np.array([0.3, 0.4, 0.5, 0.6]), 0.45) == pytest.approx(3.0)
    assert crossing_step(steps, np.array([0.3, 0.5, 0.4, 0.6]), 0.5) == pytest.approx(2.0)  # at the target counts
    assert crossing_step(steps, np.array([0.3, 0.35, 0.4, 0.42]), 0.45) == math.inf
    # a dip after the crossing does not move it; only the first crossing counts
    assert crossing_step(steps, np.array([0.3, 0.6, 0.2, 0.2]), 0.45) == pytest.approx(2 * 0.15 / 0.3)


def _verdicts(rng, rates, untrained):
    """One run's verdicts: the untrained ones at step 0, then items passing with the given rate per step; each
    item's chance follows its difficulty, as real items do (easy items pass under every mode)."""
    out = {0: untrained}
    difficulty = np.linspace(-1.5, 1.5, len(ITEMS))
    for step, rate in zip(STEPS[1:], rates):
        p = 1 / (1 + np.exp(12 * (difficulty - (rate - 0.5) * 3)))
        out[step] = {item: int(rng.random() < p[i]) for i, item in enumerate(ITEMS)}
    return out


def _experiment(pipelined_rates, seeds=(0, 1, 2), rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    untrained = {item: int(i % 13 < 4) for i, item in enumerate(ITEMS)}  # 39 of 120 (32.5%)
    runs = {}
    for seed in seeds:
        runs[("sync", seed)] = _verdicts(rng, (0.42, 0.50, 0.55), untrained)
        runs[("in_flight_pipeline", seed)] = _verdicts(rng, pipelined_rates, untrained)
    return runs


PRICES = {"sync": [190.0, 186.0, 194.0], "in_flight_pipeline": [128.0, 131.0, 125.0]}


def _analyse(runs, **kwargs):
    options = dict(baseline="sync", target=None, target_margin=0.05, margin=0.05, resamples=1000) | kwargs
    return compare_modes(runs, PRICES, **options)


def test_a_mode_that_learns_as_sync_is_non_inferior_and_its_speedup_is_the_price_ratio():
    runs = _experiment((0.42, 0.50, 0.55))
    same = {("in_flight_pipeline", seed): verdicts for (mode, seed), verdicts in runs.items() if mode == "sync"}
    analysis = _analyse({**{k: v for k, v in runs.items() if k[0] == "sync"}, **same})
    row = analysis["modes"]["in_flight_pipeline"]
    assert row["difference"] == [0.0] * 4 and all(row["non_inferior"])
    assert all(interval == [0.0, 0.0] for interval in row["difference_interval"])  # paired: identical verdicts
    assert row["speedup_vs_baseline"] == pytest.approx(190.0 / 128.0)
    assert row["price_ratio_vs_baseline"] == pytest.approx(190.0 / 128.0)
    low, high = row["speedup_interval"]  # only the pricing blocks vary
    assert 186.0 / 131.0 - 1e-9 <= low <= high <= 194.0 / 125.0 + 1e-9
    untrained = analysis["untrained"]
    assert untrained["passed"] == 39 and analysis["target"] == pytest.approx(untrained["interval"][1] + 0.05)


def test_a_mode_that_learns_much_less_is_not_non_inferior():
    """The negative control: a mode 15 points behind sync after training is flagged, and its time to target is
    slower than its price alone would say."""
    good = _analyse(_experiment((0.42, 0.50, 0.55)))["modes"]["in_flight_pipeline"]
    bad = _analyse(_experiment((0.34, 0.37, 0.40)))["modes"]["in_flight_pipeline"]
    assert all(good["non_inferior"][1:])
    assert not any(bad["non_inferior"][1:])
    assert bad["difference"][-1] < -0.10 and bad["difference_interval"][-1][1] < 0
    assert bad["speedup_vs_baseline"] < good["speedup_vs_baseline"]
    assert bad["reached_share"] < 0.5  # it rarely reaches the target within the steps


def test_pairing_narrows_the_difference_interval():
    """Item-paired resampling: the same items for both modes. Resampling them independently (the control)
    gives a wider interval for the same data, because item difficulty is shared."""
    runs = _experiment((0.42, 0.50, 0.55))
    paired = _analyse(runs)["modes"]["in_flight_pipeline"]["difference_interval"][-1]
    rng = np.random.default_rng(5)
    sync = np.array([[runs[("sync", s)][6][i] for i in ITEMS] for s in (0, 1, 2)])
    other = np.array([[runs[("in_flight_pipeline", s)][6][i] for i in ITEMS] for s in (0, 1, 2)])
    unpaired = [other[:, rng.integers(0, 120, 120)].mean() - sync[:, rng.integers(0, 120, 120)].mean()
                for _ in range(1000)]  # fmt: skip
    assert paired[1] - paired[0] < 0.8 * (np.percentile(unpaired, 97.5) - np.percentile(unpaired, 2.5))


def test_runs_must_validate_the_same_items_from_the_same_start():
    runs = _experiment((0.42, 0.50, 0.55))
    runs[("in_flight_pipeline", 1)][4] = {f"other {i}": 0 for i in range(120)}
    with pytest.raises(ValueError, match="in_flight_pipeline seed 1"):
        _analyse(runs)
    with pytest.raises(ValueError, match="not above the untrained accuracy"):
        _analyse(_experiment((0.42, 0.50, 0.55)), target=0.2)


def test_verdicts_are_read_from_verls_validation_dump(tmp_path):
    def dump(step, passed, name):
        with open(tmp_path / name, "w") as fh:
            for i, item in enumerate(ITEMS[:10]):
                fh.write(json.dumps({"input": item, "step": step, "score": 1.0, "passed": i < passed}) + "\n")

    dump(0, 3, "0.jsonl")
    dump(4, 7, "4.jsonl")
    verdicts = item_verdicts(str(tmp_path), per_verl_step=2)  # separate_async's verl steps: two per step
    assert list(verdicts) == [0, 2] and sum(verdicts[2].values()) == 7 and verdicts[0]["problem 2"] == 1
    with open(tmp_path / "4.jsonl", "a") as fh:
        fh.write(json.dumps({"input": ITEMS[0], "step": 4, "passed": False}) + "\n")
    with pytest.raises(ValueError, match="the same prompt twice"):
        item_verdicts(str(tmp_path))
    (tmp_path / "4.jsonl").write_text(json.dumps({"input": "x", "step": 4, "score": 0.0}) + "\n")
    with pytest.raises(ValueError, match="'passed'"):
        item_verdicts(str(tmp_path))


def _pipeline_report(prompts=8, samples=4):
    runs = [{"profile": "coding", "schedule": schedule, "block": block, "step_s": price,
             "token_lag_mean": 0.0 if mode == "sync" else 0.9 + 0.1 * block}
            for schedule, mode in (("verl_sync", "sync"), ("in_flight_pipeline", "in_flight_pipeline"))
            for block, price in enumerate(PRICES[mode])]  # fmt: skip
    runs.append({"profile": "math", "schedule": "verl_sync", "block": 0, "step_s": 1.0})
    plans = {"verl_sync": {"layout": "32 colocated", "knob_values": {"sync_every": 0, "load_every_update": False,
                                                                "max_lag": 1}},
             "in_flight_pipeline": {"layout": "22+10", "knob_values": {"sync_every": 0, "load_every_update": True,
                                                                       "max_lag": 1}}}  # fmt: skip
    return {"config": {"prompts": prompts, "samples": samples}, "profiles": {"coding": {"plans": plans}},
            "runs": runs, "out_dir": "/bench"}  # fmt: skip


def test_pricing_reads_each_modes_blocks_and_knobs_from_a_pipeline_report():
    pricing = pricing_from_report(_pipeline_report(), LearnBenchConfig())
    assert pricing.step_s == PRICES
    assert pricing.knobs["in_flight_pipeline"]["load_every_update"] is True
    assert pricing.layouts["in_flight_pipeline"] == "22+10"
    assert pricing.token_lag == {"sync": 0.0, "in_flight_pipeline": pytest.approx(1.0)}


def test_a_report_of_another_batch_shape_or_without_a_mode_is_refused():
    with pytest.raises(ValueError, match=r"run at 8 prompts x 8 samples.*--prompts 8 --samples 4"):
        pricing_from_report(_pipeline_report(samples=8), LearnBenchConfig())
    with pytest.raises(ValueError, match=r"no coding-profile step time for \['one_off_pipeline'\]"):
        pricing_from_report(_pipeline_report(), LearnBenchConfig(modes=("sync", "one_off_pipeline")))


def _result(tmp_path):
    runs = _experiment((0.42, 0.50, 0.55))
    cfg = LearnBenchConfig()
    pricing = Pricing(step_s=PRICES, knobs={}, layouts={"sync": "32", "in_flight_pipeline": "22+10"}, report="/b")
    seed_runs = [SeedRun(mode=mode, seed=seed, rollout="vllm", rewards=[0.3, 0.4, 0.5, 0.5, 0.6, 0.6],
                         validations=[], verdicts=verdicts, samples_trained=192, wall_s=1.0, run_dir="/x")
                 for (mode, seed), verdicts in runs.items()]  # fmt: skip
    return {
        "config": {**cfg.__dict__, "seeds": list(cfg.seeds)},
        "pricing": pricing.__dict__,
        "runs": [r.__dict__ for r in seed_runs],
        "analysis": _analyse(runs),
        "out_dir": str(tmp_path),
    }


def test_report_and_picture(tmp_path):
    result = write_result(_result(tmp_path), str(tmp_path))
    assert os.path.getsize(result["png"]) > 10_000
    with open(result["json"]) as fh:
        assert json.load(fh)["analysis"]["items"] == 120
    text = format_report(result)
    analysis = result["analysis"]
    low, high = analysis["untrained"]["interval"]
    assert f"untrained: 32.5% [{100 * low:.1f}, {100 * high:.1f}] of 120 items" in text
    row = analysis["modes"]["in_flight_pipeline"]
    lo, hi = row["speedup_interval"]
    assert f"{row['speedup_vs_baseline']:.2f}x [{lo:.2f},{hi:.2f}]" in text
    assert f"{pricing_minibatches()} minibatch updates a step" in text and "22+10 128.0 s/step" in text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"modes": ("sync", "async")}, "unknown modes ['async'] (--modes)"),
        ({"modes": ("one_off_pipeline",)}, "--modes must include the baseline sync (--baseline)"),
        ({"modes": ("sync", "minibatch_pipeline+dapp")}, "unknown modes ['minibatch_pipeline+dapp'] (--modes)"),
        ({"modes": ("sync", "one_off_pipeline", "one_off_pipeline")}, "--modes names a mode twice"),
        ({"modes": ("sync", "one_off_pipeline+dapo"), "baseline": "one_off_pipeline"}, "baseline one_off_pipeline"),
        ({"modes": ("sync",)}, "and a mode to compare with it"),
        ({"seeds": (1, 1)}, "(--seeds)"),
        ({"steps": 6, "val_every": 4}, "(--steps, --val-every)"),
        ({"prompts_per_step": 7}, "(--prompts-per-step)"),
        ({"target": 45.0}, "(--target)"),
        ({"train_lag": "cluster"}, "(--train-lag)"),
    ],
)
def test_bad_settings_name_the_flag(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LearnBenchConfig(**kwargs).validate()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--modes", "sync,one_off"], "unknown modes ['one_off']"),
        (["--seeds", "0,one"], "--seeds takes comma-separated integers"),
    ],
)
def test_cli_turns_a_bad_setting_into_a_setup_error(argv, message):
    args = build_parser().parse_args(["bench", "learn", *argv])
    with pytest.raises(SetupError, match=re.escape(message)):
        args.func(args)


def test_every_trainer_mode_is_priced_by_a_pipeline_schedule():
    from verl_pipe.bench.pipeline import SCHEDULES
    from verl_pipe.quickstart import TRAINER_MODES

    assert set(MODE_SCHEDULES) == set(TRAINER_MODES)
    for mode, schedule in MODE_SCHEDULES.items():
        assert SCHEDULES[schedule].trainer_mode == mode
    LearnBenchConfig().validate()  # the defaults are a valid bench


def test_the_learning_runs_train_with_the_knobs_their_price_was_measured_with():
    """The planner's knobs travel through the report (as a dict) into the same overrides the pipeline benchmark
    gave the schedule."""
    from dataclasses import asdict

    from verl_pipe.bench.pipeline import knob_overrides
    from verl_pipe.bench.plan import Knobs

    planned = Knobs(load_every_update=True, max_lag=2, untrained_batches=1.375)
    overrides = knob_overrides("in_flight_pipeline", Knobs(**asdict(planned)), minibatches=2, prompts=8)
    assert overrides == ["+trainer.v1.in_flight_pipeline.load_every_update=true",
                         "+trainer.v1.in_flight_pipeline.max_lag=2",
                         "+trainer.v1.in_flight_pipeline.max_untrained_prompts=11"]  # fmt: skip
    # the cap is a share of the batch: a run of 16 prompts a step gets twice the groups
    assert "+trainer.v1.in_flight_pipeline.max_untrained_prompts=22" in knob_overrides(
        "in_flight_pipeline", planned, minibatches=2, prompts=16)
    # without a cap, the bound's own (nothing passed)
    assert not any("max_untrained" in o for o in knob_overrides("in_flight_pipeline", Knobs(), 2, prompts=8))
    # separate_async syncing after every update trains each minibatch as a verl step: one update per verl step,
    # and its warm-up counted in those (half) batches
    every = knob_overrides("separate_async", Knobs(sync_every=1, warmup_batches=1.25), 2, prompts=8)
    assert every == ["trainer.v1.separate_async.parameter_sync_step=1",
                     "trainer.v1.separate_async.num_warmup_batches=2.5"]  # fmt: skip
    assert knob_overrides("separate_async", Knobs(), 2, prompts=8) == [
        "trainer.v1.separate_async.parameter_sync_step=2", "trainer.v1.separate_async.num_warmup_batches=1"]
    assert knob_overrides("sync", Knobs(), 2, prompts=8) == []


PLANNED = {"sync_every": 0, "warmup_batches": 1.0, "load_every_update": True, "max_lag": 2,
           "untrained_batches": 1.875, "abort_on_sync": True}


def test_in_flight_trains_at_the_token_lag_its_step_was_priced_at():
    """A 2-core run keeps in_flight_pipeline's cap full and trains at about the cap in batches (Little's law; the
    2026-12-02 runs at cap 1.875 trained at 1.83-1.87), so the cap is resized to the priced lag, in whole groups."""
    resized = knobs_at_priced_lag(PLANNED, 1.18, prompts=8, minibatches=2)
    assert resized == {**PLANNED, "untrained_batches": 1.125}  # 9 groups of 8: round(1.18 x 8)
    assert knobs_at_priced_lag(PLANNED, 1.18, prompts=16, minibatches=2)["untrained_batches"] == 19 / 16
    # never below a minibatch's groups (the trainer refuses such a cap), never above the planned cap
    assert knobs_at_priced_lag(PLANNED, 0.2, prompts=8, minibatches=2)["untrained_batches"] == 0.5
    assert knobs_at_priced_lag(PLANNED, 2.6, prompts=8, minibatches=2) == PLANNED
    # no cap to resize, or no priced lag: as planned
    assert knobs_at_priced_lag({"max_lag": 1}, 1.18, prompts=8, minibatches=2) == {"max_lag": 1}
    assert knobs_at_priced_lag(PLANNED, None, prompts=8, minibatches=2) == PLANNED

    pricing = Pricing(step_s={}, knobs={"sync": {}, "in_flight_pipeline": PLANNED}, layouts={}, report="",
                      token_lag={"sync": 0.0, "in_flight_pipeline": 1.18})  # fmt: skip
    trained = training_knobs(LearnBenchConfig(), pricing)
    assert trained == {"sync": {}, "in_flight_pipeline": resized}
    # the control: --train-lag planned trains with the priced knobs, whose cap the 2-core run would keep full
    assert training_knobs(LearnBenchConfig(train_lag="planned"), pricing) == pricing.knobs
    from verl_pipe.bench.pipeline import knob_overrides
    from verl_pipe.bench.plan import Knobs

    assert "+trainer.v1.in_flight_pipeline.max_untrained_prompts=9" in knob_overrides(
        "in_flight_pipeline", Knobs(**trained["in_flight_pipeline"]), minibatches=2, prompts=8)
    result = {"knobs_trained": trained, "pricing": {"knobs": pricing.knobs}, "config": {"train_lag": "priced"}}
    assert format_knobs_trained(result) == [
        "in_flight_pipeline trained with lag 2, a load every update, 1.125 batches untrained (priced with lag 2, a "
        "load every update, 1.875 batches untrained): --train-lag priced, a cap its 2-core runs keep full at the "
        "lag its price was measured at"]
    assert format_knobs_trained({**result, "knobs_trained": pricing.knobs}) == []
    one = knobs_at_priced_lag(PLANNED, 0.98, prompts=8, minibatches=2)  # the 2026-12-06 pricing run's lag
    assert Knobs(**one).describe("in_flight_pipeline") == "lag 2, a load every update, 1 batch untrained"


def test_a_bench_cut_short_keeps_its_runs_and_refuses_a_run_of_another_experiment(tmp_path):
    verdicts = _experiment((0.42, 0.50, 0.55))[("sync", 0)]
    run = SeedRun(mode="sync", seed=0, rollout="vllm", rewards=[0.2] * 6, validations=[Validation(6, 60, 120)],
                  verdicts=verdicts, samples_trained=192, wall_s=1.0, run_dir=str(tmp_path))  # fmt: skip
    with open(tmp_path / "run.json", "w") as fh:
        json.dump(run.__dict__ | {"validations": [v.__dict__ for v in run.validations]}, fh)
    kept = load_run(str(tmp_path))
    assert kept == run  # the verdicts' steps come back as integers
    check_recorded(kept, LearnBenchConfig(steps=6, val_every=2))
    with pytest.raises(ValueError, match=r"validations at steps \[2, 4, 6\].*\[1, 2, 3, 4, 5\].*--out-dir"):
        check_recorded(kept, LearnBenchConfig())
    # a run trained with other knobs than this call's (another --train-lag) is refused, not mixed in
    check_recorded(kept, LearnBenchConfig(steps=6, val_every=2), knobs={})
    with pytest.raises(ValueError, match=r"trained with knobs \{\}.*with \{'max_lag': 2\}.*--train-lag"):
        check_recorded(kept, LearnBenchConfig(steps=6, val_every=2), knobs={"max_lag": 2})
    assert load_run(str(tmp_path / "missing")) is None


def test_a_dapo_variant_trains_its_mode_with_dynamic_sampling_priced_as_that_mode():
    """``<mode>+dapo`` against ``--baseline <mode>``: the question is whether the refill buys learning per step; its
    step price is read as the mode's for the knobs, but the report gives it no clock (its refills are not priced)."""
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose, initialize_config_dir

    from verl_pipe.trainers.dynamic_sampling import DynamicSamplingConfig

    cfg = LearnBenchConfig(modes=("in_flight_pipeline", "in_flight_pipeline+dapo"), baseline="in_flight_pipeline")
    cfg.validate()
    pricing = pricing_from_report(_pipeline_report(), cfg)
    priced = PRICES["in_flight_pipeline"]
    assert pricing.step_s["in_flight_pipeline+dapo"] == pricing.step_s["in_flight_pipeline"] == priced
    assert pricing.knobs["in_flight_pipeline+dapo"] == pricing.knobs["in_flight_pipeline"]
    # the variant's overrides turn on verl's own keys, which our trainers read (3 batches generated a step at most)
    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[*variant_overrides("in_flight_pipeline+dapo"),
                                                                "actor_rollout_ref.rollout.n=4"])  # fmt: skip
    dynamic = DynamicSamplingConfig.from_verl(config)
    assert dynamic is not None and dynamic.metric == "reward" and dynamic.max_num_gen_batches == 3
    assert variant_overrides("in_flight_pipeline") == () and set(VARIANTS) == {"dapo"}


def test_the_report_says_what_each_mode_generated_for_what_it_trained():
    def run(mode, generated, fracs):
        return SeedRun(mode=mode, seed=0, rollout="hf", rewards=[], validations=[], verdicts={}, samples_trained=0,
                       wall_s=1.0, run_dir="/x", groups_generated=generated, dropped_token_frac=fracs)  # fmt: skip

    cfg = LearnBenchConfig(steps=5, prompts_per_step=8)
    plain, dapo = "minibatch_pipeline", "minibatch_pipeline+dapo"
    generation = generation_per_mode([run(plain, 40, []), run(dapo, 60, [0.2, 0.4]), run(dapo, 80, [0.6])], cfg)
    assert generation[plain] == {"groups_per_trained_group": 1.0, "dropped_token_frac": 0.0}
    assert generation[dapo] == {"groups_per_trained_group": 1.75, "dropped_token_frac": pytest.approx(0.4)}
    # the variant's clock would be its mode's price, without its refills: the report gives it no hours and no ratio
    analysis = _analyse(_experiment((0.42, 0.50, 0.55)))
    analysis["modes"][dapo] = dict(analysis["modes"]["in_flight_pipeline"])
    mark_variants_unpriced(analysis)
    assert analysis["modes"][dapo]["unpriced"] and "speedup_vs_baseline" not in analysis["modes"][dapo]
    assert "speedup_vs_baseline" in analysis["modes"]["in_flight_pipeline"]
    clock = [line for line in format_analysis(analysis, "sync") if line.lstrip().startswith(dapo)][-1]
    assert clock.rstrip().endswith("not priced") and "x [" not in clock
    text = "\n".join(format_generation(generation))
    assert "1.75 groups generated per group trained, 40.0% of response tokens thrown away" in text
    assert format_generation({plain: generation[plain]}) == []  # nothing to say without dynamic sampling


def test_each_steps_token_lag_is_read_from_verls_log_in_policy_versions():
    # in_flight_pipeline logs its token-weighted lag beside verl's per-sample staleness (by a sample's freshest
    # version, which misses the older tokens of a sample that spans versions): the token-weighted one is read
    in_flight = [(1, {"in_flight/token_lag/mean": 0.0, "training/off_policy/trajectory_staleness/mean": 0.0}),
                 (2, {"in_flight/token_lag/mean": 1.25, "training/off_policy/trajectory_staleness/mean": 0.5}),
                 (3, {"in_flight/token_lag/mean": 0.75, "training/off_policy/trajectory_staleness/mean": 0.25})]
    assert step_token_lags(in_flight) == [0.0, 1.25, 0.75]
    # verl's own modes log only the staleness; separate_async syncing every update counts it in verl steps, one per
    # minibatch (2 here): a step's lag is in whole steps, the mean of its verl steps' over 2
    per_update = [(step, {"training/off_policy/trajectory_staleness/mean": lag})
                  for step, lag in enumerate((0.0, 1.0, 2.0, 2.0, 3.0, 1.0), 1)]  # fmt: skip
    assert step_token_lags(per_update, per_verl_step=2) == [0.25, 1.0, 1.0]
    assert step_token_lags(per_update) == [0.0, 1.0, 2.0, 2.0, 3.0, 1.0]  # the control: read per verl step
    assert step_token_lags([(1, {"timing_s/step": 3.0})]) == []  # a mode that logs neither has no lag


def test_the_report_says_the_token_lag_each_mode_trained_and_was_priced_at():
    def run(mode, lags):
        return SeedRun(mode=mode, seed=0, rollout="hf", rewards=[], validations=[], verdicts={}, samples_trained=0,
                       wall_s=1.0, run_dir="/x", token_lag=lags)  # fmt: skip

    pricing = pricing_from_report(_pipeline_report(), LearnBenchConfig())
    lags = token_lag_per_mode([run("sync", [0.0, 0.0]), run("in_flight_pipeline", [0.0, 1.5]),
                               run("in_flight_pipeline", [1.0, 1.5])], pricing)  # fmt: skip
    assert lags["in_flight_pipeline"] == {"trained": 1.0, "trained_max": 1.5, "priced": pytest.approx(1.0)}
    assert lags["sync"] == {"trained": 0.0, "trained_max": 0.0, "priced": 0.0}
    text = "\n".join(format_token_lag(lags))
    assert "in_flight_pipeline       trained at 1.00 (worst step 1.50), priced at 1.00" in text
    unlogged = token_lag_per_mode([run("one_off_pipeline", [])], Pricing({}, {}, {}, ""))
    assert "trained at n/a (worst step n/a), priced at n/a" in "\n".join(format_token_lag(unlogged))


def test_a_run_recorded_without_its_lag_reads_it_from_its_metrics_log(tmp_path):
    from verl_pipe.quickstart import metrics_log_path

    run_dir = tmp_path / "in_flight_pipeline-seed0"
    record = SeedRun(mode="in_flight_pipeline", seed=0, rollout="vllm", rewards=[], validations=[], verdicts={},
                     samples_trained=0, wall_s=1.0, run_dir=str(run_dir), knobs={"max_lag": 2})  # fmt: skip
    log = metrics_log_path(str(run_dir))
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as fh:
        for step, lag in ((1, 0.0), (2, 1.5)):
            fh.write(json.dumps({"step": step, "data": {"timing_s/step": 1.0, "in_flight/token_lag/mean": lag}}) + "\n")
    record_dict = record.__dict__ | {"token_lag": []}
    del record_dict["token_lag"]  # as an earlier version wrote it
    with open(run_dir / "run.json", "w") as fh:
        json.dump(record_dict, fh)
    assert load_run(str(run_dir)).token_lag == [0.0, 1.5]
    _rollout_dump(run_dir / "rollouts" / "1.jsonl", 1, {"p0": [1.0, 0.0]})
    record_dict["token_lag"] = [0.0, 1.5]  # a run recorded with its lag, before it kept its prompts' rewards
    with open(run_dir / "run.json", "w") as fh:
        json.dump(record_dict, fh)
    assert load_run(str(run_dir)).prompt_rewards == {"p0": [1, 0.5]}
    moved = tmp_path / "kept" / "in_flight_pipeline-seed0"
    os.renames(run_dir, moved)  # a run folder moved aside reads its logs where it is now
    assert load_run(str(moved)).prompt_rewards == {"p0": [1, 0.5]} and load_run(str(moved)).run_dir == str(moved)


def _rollout_dump(path, verl_step, groups):
    """verl's rollout dump (``trainer.rollout_data_dir``): a line per trained sample."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        for prompt, scores in groups.items():
            for i, score in enumerate(scores):
                fh.write(json.dumps({"input": prompt, "output": f"answer {i}", "gts": "[]", "score": score,
                                     "step": verl_step, "uid": f"{prompt}-{i}"}) + "\n")  # fmt: skip


def test_each_trained_prompts_step_and_reward_are_read_from_verls_rollout_dump(tmp_path):
    _rollout_dump(tmp_path / "1.jsonl", 1, {"a": [1.0, 0.0, 0.0, 1.0]})
    _rollout_dump(tmp_path / "2.jsonl", 2, {"b": [0.0, 0.0, 0.0, 1.0]})
    _rollout_dump(tmp_path / "3.jsonl", 3, {"c": [1.0] * 4, "a": [1.0] * 4})  # "a" again: a second epoch
    # separate_async syncing every update: two verl steps to a step
    assert trained_prompt_rewards(str(tmp_path), per_verl_step=2) == {"a": [1, 0.5], "b": [1, 0.25], "c": [2, 1.0]}
    assert trained_prompt_rewards(str(tmp_path))["b"] == [2, 0.25]  # the control: read per verl step
    (tmp_path / "4.jsonl").write_text(json.dumps({"input": "d", "step": 4}) + "\n")
    with pytest.raises(ValueError, match="'input' and 'score'"):
        trained_prompt_rewards(str(tmp_path))


def _trained_prompts(order, rewards, shift=None):
    """A run's prompt -> (step, group reward): prompts trained 8 a step in ``order``, ``shift`` added by step."""
    return {p: (i // 8 + 1, rewards[p] + (shift or {}).get(i // 8 + 1, 0.0)) for i, p in enumerate(order)}


def test_same_prompt_rewards_tell_a_worse_policy_from_the_order_prompts_were_trained_in():
    rng = np.random.default_rng(3)
    prompts = [f"p{i}" for i in range(40)]
    runs = {}
    for seed in range(3):
        rewards = {p: float(rng.choice([0.0, 0.25, 0.75, 1.0])) for p in prompts}
        runs[("sync", seed)] = _trained_prompts(prompts, rewards)
        easy_first = sorted(prompts, key=lambda p: -rewards[p])  # a feeder handing on what finished first
        runs[("reordered", seed)] = _trained_prompts(easy_first, rewards)
        runs[("worse", seed)] = _trained_prompts(prompts, rewards, shift={4: -0.25, 5: -0.25})
    table = same_prompt_rewards(runs, "sync", resamples=1000)
    # reordered: its own step reward falls from easy to hard, the same prompts' under sync falls with it
    steps = table["reordered"]
    assert steps[0]["reward"] - steps[-1]["reward"] > 0.5
    assert all(row["difference"] == pytest.approx(0.0) for row in steps)
    assert steps[0]["baseline_step"] != pytest.approx(1.0)  # the order it trained them in differs from sync's
    sync_step_reward = [np.mean([r for s, r in runs[("sync", seed)].values() if s == 1]) for seed in range(3)]
    assert steps[0]["reward"] - np.mean(sync_step_reward) > 0.3  # the control: unpaired, it looks like a change
    # worse: the same order, a policy that samples 0.25 worse from step 4 on
    for row in table["worse"]:
        low, high = row["difference_interval"]
        if row["step"] >= 4:
            assert row["difference"] == pytest.approx(-0.25) and high < 0
        else:
            assert low <= 0 <= high and row["baseline_step"] == pytest.approx(row["step"])
    text = "\n".join(format_same_prompt_rewards(table, "sync"))
    row = table["worse"][3]
    assert f"{row['reward']:7.3f} {row['baseline_reward']:7.3f} {row['difference']:+7.3f}" in text
    assert format_same_prompt_rewards({}, "sync") == []
