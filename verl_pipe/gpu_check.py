"""``make gpu-check`` / ``verl-pipe gpu-check``: every trainer mode for a few steps on this machine's NVIDIA GPUs, with
verl's vLLM rollout and the nccl checkpoint engine, and what the CPU tier asserts, asserted on the GPU.

No GPU with verl, Ray and vLLM is reachable from where verl-pipe is built, so its GPU path is the CPU path's code
with only placement differing (docs/gpu.md). This is how a user with GPUs checks that claim (sized for about ten
minutes; not yet timed on a GPU):

* ``sync`` (colocated on every GPU) and ``separate_async``, ``one_off_pipeline``, ``minibatch_pipeline``,
  ``in_flight_pipeline`` (one GPU trains, the rest sample), :data:`STEPS` steps each, SmolLM2-135M-Instruct (the
  embedded model: no hub access needed) on the generated function problems, through ``python -m
  verl.trainer.main_ppo``, one run at a time;
* after each run, from its own records (verl's metrics file, the pipelined modes' ledger, the servers' prefill log
  and the engine's weight probe): the engine agrees with the actor on every step sampled from the trainer's weights;
  every weight sync changed the engine's weights; in ``in_flight_pipeline`` a load lands inside an answer (a trained
  sample spans two versions), no request is aborted or resubmitted, and no token lags more than the bound; every
  prompt is trained once (the ledger); nothing is left in /dev/shm;
* one table, step seconds included; the exit status is 1 when any check failed.

It refuses at once, naming the problem, on a machine with fewer than :data:`MIN_GPUS` NVIDIA GPUs. Its logic (the
override lists, which compose against verl's own schema for a GPU, the checks and the table) is tested on CPU in
tests/test_gpu_check_on_cpu.py; the runs themselves need GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from verl_pipe.rollout.prefill_log import PREFILL_LOG_ENV
from verl_pipe.trainer_modes import TRAINER_MODES

MIN_GPUS = 2
STEPS = 3
PROMPTS, SAMPLES, MINIBATCHES = 8, 4, 2
RESPONSE_TOKENS = 256
LR = 2e-5
MAX_LAG = 1
PRESET_SEARCHPATH = "hydra.searchpath=[pkg://verl_pipe.config]"
# verl's metrics this reads (verl.utils.debug.metrics, its off-policy metrics, the in-flight trainer's)
STALENESS = "training/off_policy/trajectory_staleness/max"
SPANNING, LAG_MAX = "in_flight/spanning_samples_share", "in_flight/token_lag/max"
ABORTED = "response/aborted_ratio"
# verl_pipe.rollout.vllm_worker.SYNC_PROBE_ENV (that module imports vLLM, which the check's own tests do without)
SYNC_PROBE_ENV = "VERL_PIPE_VLLM_SYNC_PROBE"


class GpuCheckError(RuntimeError):
    """The machine cannot run the check; the message says why and what to do."""


def count_gpus(run: Callable = subprocess.run) -> tuple[int, str]:
    """NVIDIA GPUs ``nvidia-smi -L`` lists, and what was found when there are none."""
    if shutil.which("nvidia-smi") is None and run is subprocess.run:
        return 0, "nvidia-smi is not installed (no NVIDIA driver)"
    try:
        done = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return 0, f"nvidia-smi failed: {error}"
    if done.returncode != 0:
        return 0, f"nvidia-smi failed: {(done.stderr or done.stdout).strip()[:200]}"
    gpus = [line for line in done.stdout.splitlines() if line.startswith("GPU ")]
    return len(gpus), f"{len(gpus)} NVIDIA GPU(s): " + "; ".join(line.split(" (UUID")[0] for line in gpus)


def preflight(min_gpus: int = MIN_GPUS, run: Callable = subprocess.run) -> int:
    """The number of GPUs, or :class:`GpuCheckError` when there are fewer than ``min_gpus``."""
    gpus, found = count_gpus(run)
    if gpus < min_gpus:
        raise GpuCheckError(
            f"make gpu-check needs a machine with {min_gpus} or more NVIDIA GPUs (one trains, the rest sample), and "
            f"found {found}. Run it on a GPU node with network access to the package index; on a machine without "
            "GPUs, `make test` runs the same code on the CPU backend"
        )
    return gpus


# --- the runs -----------------------------------------------------------------------------------------------------


def run_overrides(mode: str, gpus: int, model: str, train_file: str, val_file: str, run_dir: str) -> list[str]:
    """``python -m verl.trainer.main_ppo`` overrides of one mode's run on ``gpus`` GPUs of one node."""
    spec = TRAINER_MODES[mode]
    common = [
        PRESET_SEARCHPATH,
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={train_file}",
        f"data.val_files={val_file}",
        f"data.train_batch_size={PROMPTS}",
        "data.max_prompt_length=512",
        f"data.max_response_length={RESPONSE_TOKENS}",
        "data.filter_overlong_prompts=True",
        f"actor_rollout_ref.model.path={model}",
        # verl's default attention is flash-attention, a package built from source for most CUDA/torch pairs
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"actor_rollout_ref.actor.optim.lr={LR}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS // MINIBATCHES}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={SAMPLES}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        f"actor_rollout_ref.rollout.n={SAMPLES}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={SAMPLES}",
        # a reward that varies within every group, so every update moves the weights and a stale engine shows
        "reward.custom_reward_function.path=pkg://verl_pipe.gpu_check",
        "reward.custom_reward_function.name=length_reward",
        f"trainer.total_training_steps={STEPS}",
        "trainer.total_epochs=1000",
        "trainer.logger=[console,file]",
        "trainer.project_name=verl_pipe_gpu_check",
        f"trainer.experiment_name={mode}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={os.path.join(run_dir, 'checkpoints')}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={metrics_path(run_dir)}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{SYNC_PROBE_ENV}={os.path.join(run_dir, 'sync_probe.jsonl')}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{PREFILL_LOG_ENV}={os.path.join(run_dir, 'prefill.jsonl')}",
    ]
    if not spec.separate_pools:  # colocated: every GPU trains and samples in turn, verl's naive sync in place
        return common + ["trainer.use_v1=true", f"trainer.v1.trainer_mode={mode}", "trainer.nnodes=1",
                         f"trainer.n_gpus_per_node={gpus}"]  # fmt: skip
    layout = ["trainer.nnodes=1", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.nnodes=1",
              f"actor_rollout_ref.rollout.n_gpus_per_node={gpus - 1}"]  # fmt: skip
    if spec.from_plugin:  # the preset: V1, separate pools, nccl
        extra = [f"+verl_pipe_trainer={mode}"]
        if mode == "in_flight_pipeline":
            extra.append(f"+trainer.v1.in_flight_pipeline.max_lag={MAX_LAG}")
        return common + extra + layout
    return common + layout + [
        "trainer.use_v1=true", f"trainer.v1.trainer_mode={mode}", "actor_rollout_ref.hybrid_engine=false",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", f"{spec.parameter_sync_step_key}={MINIBATCHES}",
    ]  # fmt: skip


def length_reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """The check's reward: varies within every group of answers (their length mod 7), so GRPO's advantages and the
    updates are never zero. What is checked is the weight path, not learning; the code reward needs bubblewrap."""
    return {"score": (len(solution_str) % 7) / 6.0}


def metrics_path(run_dir: str) -> str:
    return os.path.join(run_dir, "verl_metrics.jsonl")


# --- the checks, on a finished run's records ---------------------------------------------------------------------


@dataclass
class RunRecords:
    """What a finished run left: verl's per-step records, the ledger (pipelined modes), the servers' prefill log and
    the engine's weight probe, and the /dev/shm bytes it added and left."""

    mode: str
    returncode: int
    steps: list[dict]  # verl's metrics per trained step, in order
    ledger: Optional[list[dict]] = None
    prefill: list[dict] = field(default_factory=list)
    probe: list[dict] = field(default_factory=list)
    shm_left_bytes: int = 0
    log_tail: str = ""


@dataclass
class ModeResult:
    mode: str
    steps: int
    step_s: Optional[float]
    cells: dict[str, str]  # check -> what it found ("ok ...", "FAIL ...", "n/a ...")
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures


CHECKS = ("engine agrees", "syncs reach engine", "load mid-answer", "lag bound", "prompts once", "/dev/shm")


def check_run(records: RunRecords, max_lag: int = MAX_LAG) -> ModeResult:
    """Every check of one run (see the module's docstring); a check that cannot apply to the mode says ``n/a``."""
    from verl_pipe.engine_agreement import disagreement

    cells, failures = {}, []

    def cell(name: str, ok: Optional[bool], text: str) -> None:
        cells[name] = f"{'n/a' if ok is None else 'ok' if ok else 'FAIL'} {text}".strip()
        if ok is False:
            failures.append(f"{name}: {text}")

    steps = records.steps
    if records.returncode != 0 or len(steps) < STEPS:
        failures.append(f"the run exited {records.returncode} after {len(steps)} of {STEPS} steps")
    fresh = [(i + 1, s) for i, s in enumerate(steps) if s.get(STALENESS, 0) == 0]
    gaps = [f"step {n}: {why}" for n, s in fresh if (why := disagreement(s))]
    if fresh:
        cell("engine agrees", not gaps, "; ".join(gaps) or f"{len(fresh)} step(s) sampled from the actor's weights")
    else:
        cell("engine agrees", None, "no step sampled from the trainer's own weights")
    by_replica: dict[str, list[float]] = {}
    for load in records.probe:  # each replica's engine appends its own loads, in order
        by_replica.setdefault(str(load.get("replica", "0")), []).append(load["checksum"])
    unchanged = {replica: sums for replica, sums in by_replica.items()
                 if len(sums) < 2 or any(a == b for a, b in zip(sums, sums[1:]))}  # fmt: skip
    loads = sum(len(sums) for sums in by_replica.values())
    cell("syncs reach engine", bool(by_replica) and not unchanged,
         f"{loads} load(s) on {len(by_replica)} replica(s), each changed the weights" if by_replica and not unchanged
         else f"checksums by replica {dict(list(unchanged.items())[:3]) or 'none recorded'}")
    if records.mode == "in_flight_pipeline":
        spans = max((s.get(SPANNING, 0.0) for s in steps), default=0.0)
        aborted = sum(1 for line in records.prefill if line.get("aborted")) + sum(s.get(ABORTED, 0) > 0 for s in steps)
        cell("load mid-answer", spans > 0 and aborted == 0,
             f"{spans:.0%} of samples span a load; {aborted} aborted or resubmitted")
        lag = max((s.get(LAG_MAX, 0.0) for s in steps), default=0.0)
        cell("lag bound", lag <= max_lag, f"max token lag {lag:g} (bound {max_lag})")
    else:
        cell("load mid-answer", None, "")
        cell("lag bound", None, "")
    if records.ledger is None:
        cell("prompts once", None, "verl's mode keeps no ledger")
    else:
        trained = [p for row in records.ledger for p in row.get("prompts_trained", [])]
        twice = len(trained) - len(set(trained))
        cell("prompts once", twice == 0 and len(trained) == STEPS * PROMPTS,
             f"{len(set(trained))} prompts, {twice} trained twice")
    cell("/dev/shm", records.shm_left_bytes == 0, f"{records.shm_left_bytes} bytes left")
    timed = [s["timing_s/step"] for s in steps[1:] if "timing_s/step" in s]  # the first step warms up
    return ModeResult(records.mode, len(steps), sum(timed) / len(timed) if timed else None, cells, failures)


def format_table(results: list[ModeResult], gpus: int) -> str:
    header = ["mode", "steps", "step s", *CHECKS]
    rows = [[f"`{r.mode}`", f"{r.steps}/{STEPS}", "-" if r.step_s is None else f"{r.step_s:.1f}",
             *(r.cells.get(name, "-") for name in CHECKS)] for r in results]  # fmt: skip
    lines = [f"verl-pipe gpu-check on {gpus} GPUs (step s: mean after the first step)",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]  # fmt: skip
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    failed = [f"{r.mode}: {failure}" for r in results for failure in r.failures]
    lines.append("all checks passed" if not failed else "FAILED:\n  " + "\n  ".join(failed))
    return "\n".join(lines)


# --- running it ---------------------------------------------------------------------------------------------------


def read_records(mode: str, run_dir: str, returncode: int, shm_left_bytes: int, log_tail: str = "") -> RunRecords:
    def lines(path: str) -> list[dict]:
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    steps = [r["data"] for r in lines(metrics_path(run_dir)) if "timing_s/step" in r.get("data", {})]
    ledger_path = os.path.join(run_dir, "checkpoints", "pipeline_ledger.jsonl")
    ledger = lines(ledger_path) if TRAINER_MODES[mode].from_plugin else None
    return RunRecords(mode, returncode, steps, ledger, lines(os.path.join(run_dir, "prefill.jsonl")),
                      lines(os.path.join(run_dir, "sync_probe.jsonl")), shm_left_bytes, log_tail)  # fmt: skip


def run_mode(mode: str, gpus: int, out_dir: str, model: str, timeout_s: float) -> RunRecords:
    from verl_pipe.chaos import shm_files, shm_left_since
    from verl_pipe.data.function_family import write_function_dataset

    run_dir = os.path.abspath(os.path.join(out_dir, mode))
    os.makedirs(run_dir, exist_ok=True)
    train_file, val_file = write_function_dataset(os.path.join(run_dir, "data"))
    overrides = run_overrides(mode, gpus, model, train_file, val_file, run_dir)
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}  # verl finds the GPUs itself
    env["VERL_FILE_LOGGER_PATH"] = metrics_path(run_dir)
    shm_before = shm_files()
    log_path = os.path.join(run_dir, "train.log")
    print(f"gpu-check: {mode} ({STEPS} steps; log {log_path})", flush=True)
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=run_dir, env=env,
                                stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = 124
    left = sum(shm_left_since(shm_before).values())
    with open(log_path, errors="replace") as handle:
        tail = "".join(handle.readlines()[-20:])
    return read_records(mode, run_dir, rc, left, tail)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="verl-pipe gpu-check",
        description="Every trainer mode for a few steps on this machine's NVIDIA GPUs (2 or more), with verl's vLLM "
        "rollout and the nccl checkpoint engine, checked as the CPU tier checks them; one table (docs/gpu.md).",
    )
    parser.add_argument("--modes", default=",".join(TRAINER_MODES), help="comma-separated (default: all five)")
    parser.add_argument("--out-dir", default=None, help="where the runs go (default: runs/gpu-check-<time>)")
    parser.add_argument("--model", default="smollm2", help="smollm2 (the embedded SmolLM2-135M-Instruct) or a path")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per run (default 600)")
    parser.add_argument("--preflight", action="store_true", help="only check that the machine has the GPUs")
    args = parser.parse_args(argv)
    try:
        gpus = preflight()
    except GpuCheckError as error:
        print(f"verl-pipe gpu-check: {error}", file=sys.stderr)
        return 2
    if args.preflight:
        print(f"gpu-check: {gpus} GPUs found")
        return 0
    unknown = [m for m in args.modes.split(",") if m not in TRAINER_MODES]
    if unknown:
        print(f"verl-pipe gpu-check: unknown mode {unknown[0]!r}; modes: {','.join(TRAINER_MODES)}", file=sys.stderr)
        return 2
    from verl_pipe.models import resolve_model_path

    model = resolve_model_path(args.model)
    out_dir = args.out_dir or os.path.join("runs", time.strftime("gpu-check-%Y%m%d-%H%M%S"))
    results = []
    for mode in args.modes.split(","):
        records = run_mode(mode, gpus, out_dir, model, args.timeout_s)
        result = check_run(records)
        if not result.passed and records.log_tail:
            print(f"{mode}: the log's last lines:\n{records.log_tail}", file=sys.stderr)
        results.append(result)
    table = format_table(results, gpus)
    print(table)
    with open(os.path.join(out_dir, "gpu_check.md"), "w", encoding="utf-8") as handle:
        handle.write(table + "\n")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
