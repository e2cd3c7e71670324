"""``verl-pipe chaos`` / ``make chaos``: each trainer mode through verl's real dataflow on CPU, with a fault injected
into its rollout engine, its reward workers, its checkpoint disk, its sampler's node or its driver, and what became
of the run.

Every case is ``python -m verl.trainer.main_ppo`` on the CPU backend (the tiny model, 2 prompts x 2 samples, 3
steps) on one private Ray head. The engine faults come from the servers' timing slot
(:mod:`verl_pipe.backends.cpu.faults`), after each replica has served ``--after`` requests:

* ``stall``: the engine stops making progress, its server up and answering;
* ``kill``: the server's process is killed (SIGKILL) in the middle of a request;

the process kills once a step is trained, in runs of 6 steps (so that later steps need what was killed):

* ``vllm_server_kill``: verl's vLLM replica actor (``vLLMHttpServer``) is SIGKILLed;
* ``engine_kill``: its engine process (``VLLM::EngineCore``, where the model runs on CPU) is SIGKILLed; these two
  use verl's vLLM rollout and SmolLM2 (vLLM's CPU attention cannot serve the tiny model), and need vLLM importable
  (``make chaos`` runs from .venv-vllm);
* ``reward_kill``: verl's reward worker actor (``RewardLoopWorker``) is SIGKILLed;
* ``scoring_kill``: one of the interleaved reward manager's scoring processes is SIGKILLed;

and the disk, node and driver faults:

* ``full_disk``: the checkpoints go to a tmpfs with room for one (root only), saved after every step, so the second
  save meets a real ENOSPC;
* ``node_loss``: the sampler pool runs on a second Ray node of this machine (``VERL_PIPE_POOL_NODES``), which is
  lost (its raylet and every process on it killed at once) after two trained steps. Modes with separate pools only;
* ``driver_kill``: the trainer's driver is SIGKILLed after two trained steps (a checkpoint saved after each), then
  the same command is run again: it resumes from the last checkpoint. The prompts the two runs trained (the
  pipelined modes' ledger) are compared with those of an uninterrupted run: none may be lost or trained twice;
* ``save_kill``: the same, but the trainer (verl's TaskRunner actor, whose loop writes the checkpoint tracker) and the
  driver are SIGKILLed the moment the third step's checkpoint folder appears, before its save is complete; the resume
  must start from step 2 and ignore the half-written folder. If the save completed first (its tracker names step 3),
  the case reads ``not injected``.

Each run ends one of six ways: ``finished`` (every step trained), ``recovered`` (it trained every step through the
kill of a process), ``resumed`` (after the driver's or trainer's kill, the rerun trained every step), ``stopped`` (it
ended with one of verl-pipe's diagnoses: the stall watch's, the failed checkpoint save's, the lost node's, or the
dead engine's), ``failed`` (it ended with another error), or ``hung`` (still running ``--hang-after`` seconds after
the fault: then killed; a fault the harness injects mid-run must come within ``--fault-within`` seconds of the
start, and the faults that come from the start count from it); a run that ended before its fault came says so
(``stopped before the fault``, ``hung before the fault``), and one that finished without it reads ``not injected``. The table gives the seconds to the end, the step a resume would start
from, the half-written checkpoints, the processes and /dev/shm bytes the run left, and for the resumed faults the
prompts lost or trained twice. Our modes carry the stall watch (``stall_timeout_s``); verl's ``sync`` and
``separate_async`` are the reference.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

from verl_pipe.backends.cpu.faults import AFTER_REQUESTS_ENV, FAULT_ENV, FAULTS
from verl_pipe.backends.cpu.generation_timing import GENERATION_TIMING_ENV
from verl_pipe.pool_nodes import POOL_NODES_ENV
from verl_pipe.local_jobs import job_env, read_steps, stop_process_group
from verl_pipe.trainer_modes import TRAINER_MODES

# The lines with which verl-pipe stops a run it diagnosed (trainers.stall_watch, .checkpoint_guard, .lost_nodes).
DIAGNOSES = (
    "the sampler made no progress for",
    "an actor of the sampler's died while the trainer waited",
    "prompt groups failed in a row while the trainer waited",
    "CheckpointSaveError: the checkpoint of step",
    "LostNodeError: Ray node",
    "RolloutReplicaDiedError: ",
)
STEPS = 3
FULL_DISK, NODE_LOSS, DRIVER_KILL, SAVE_KILL = "full_disk", "node_loss", "driver_kill", "save_kill"
REWARD_KILL, SCORING_KILL = "reward_kill", "scoring_kill"
VLLM_SERVER_KILL, ENGINE_KILL = "vllm_server_kill", "engine_kill"
VLLM_FAULTS = (VLLM_SERVER_KILL, ENGINE_KILL)  # run on verl's vLLM rollout
CHAOS_FAULTS = (*FAULTS, *VLLM_FAULTS, REWARD_KILL, SCORING_KILL, FULL_DISK, NODE_LOSS, DRIVER_KILL, SAVE_KILL)
RESUMED_FAULTS = (DRIVER_KILL, SAVE_KILL)  # the run is killed, then the same command resumes it
REWARD_WORKER_TITLE = "ray::RewardLoopWorker"  # what Ray names verl's reward worker actors' processes
ENGINE_TITLE = "VLLM::EngineCore"  # what vLLM names its engine's process (the model runs in it on CPU)
# verl's vLLM replica actor, the engine's parent (vLLMHttpServer; the CPU backend's subclass is CPUvLLMHttpServer)
VLLM_SERVER_TITLE = re.compile(r"ray::\w*vLLMHttpServer\b")
TRAINER_TITLE = "ray::TaskRunner"  # verl's TaskRunner actor (TaskRunnerV1 in the V1 trainers): the trainer's loop
VLLM_START_ALLOWANCE_S = 240.0  # added to --fault-within (and to --hang-after where it counts from the start)
VLLM_STALL_TIMEOUT_S = 120.0  # the least stall_timeout_s of the vLLM cases
SAVE_KILL_STEP = 3  # the step whose checkpoint save the save_kill fault interrupts (saves are made every step)
NO_FAULT = "none"  # the uninterrupted run the driver_kill cases' prompts are compared with
REFERENCE_MODE = "one_off_pipeline"  # every mode consumes the dataloader in the same order: one reference serves all
LEDGER = os.path.join("checkpoints", "pipeline_ledger.jsonl")  # where the pipelined modes write theirs
TRAINER_NODE, SAMPLER_NODE = "verl_pipe_trainer_node", "verl_pipe_sampler_node"
# A step of the tiny model takes under a second: a node-loss run goes through the embedded set's 40 prompts once, so
# it cannot be over before the loss tells.
NODE_LOSS_STEPS = 20
# The reward faults come once a step is trained; by then a pipelined mode may have scored the next two steps' groups
# already, so the run goes on long enough that later steps need the reward path after the kill.
REWARD_FAULT_STEPS = 6
MID_RUN_KILLS = (*VLLM_FAULTS, REWARD_KILL, SCORING_KILL)  # a process SIGKILLed once a step is trained
STEPS_OF_FAULT = {NODE_LOSS: NODE_LOSS_STEPS, **{fault: REWARD_FAULT_STEPS for fault in MID_RUN_KILLS}}
# Room for the first checkpoint of the tiny model (1.6 MB) and the run's ledger, not for the second.
SMALL_DISK = "2500k"


@dataclass
class CaseResult:
    mode: str
    fault: str
    outcome: str  # finished | recovered | resumed | stopped | failed | hung (| not injected: no target was found)
    seconds: float  # from the start to the end (or to the kill, when hung)
    steps_trained: int
    leftover_processes: int  # processes of the run still alive after it ended
    leftover_shm_bytes: int  # /dev/shm bytes the run added and left
    error: str = ""  # the run's last error line
    resumes_from: int | None = None  # the step its tracker names (None: no tracker); driver_kill: the rerun's start
    partial_checkpoints: int = 0  # global_step_<N> folders newer than the tracker's: half-written saves left behind
    steps_planned: int = STEPS
    # Against the uninterrupted run (driver_kill; None where not compared, or where the mode keeps no ledger):
    prompts_lost: int | None = None  # trained by it, never by the faulted run
    prompts_twice: int | None = None  # trained more than once by the faulted run and its resume
    prompts_foreign: int | None = None  # trained by the faulted run, never by it
    after_fault_s: float | None = None  # from the fault to the end (node and reward faults, which come mid-run)


def start_faulted_run(
    run_dir: str, model: str, ray_address: str, mode: str, fault: str, after_requests: int = 0,
    stall_timeout_s: float | None = 10.0, steps: int = STEPS,
) -> tuple[subprocess.Popen, str]:  # fmt: skip
    """Start ``main_ppo`` in ``mode`` with ``fault``; return the process (its own session) and its log."""
    from verl_pipe.data.embedded import write_embedded_dataset
    from verl_pipe.quickstart import QuickstartConfig, training_overrides

    rollout = "vllm" if fault in VLLM_FAULTS else "hf"
    cfg = QuickstartConfig(data="embedded", model=model, mode=mode, rollout=rollout, algorithm="grpo", steps=steps,
                           prompts_per_step=2, samples_per_prompt=2, max_response_length=8, validate_at_end=False,
                           ray_address=ray_address, out_dir=run_dir)  # fmt: skip
    train_file, val_file = write_embedded_dataset(os.path.join(run_dir, "data"))
    worker_env = {}
    if fault in FAULTS:  # the engine's, through the servers' timing slot (the count quoted: hydra would pass a
        # number, and Ray takes only strings)
        worker_env = {GENERATION_TIMING_ENV: "verl_pipe.backends.cpu.faults:engine_fault", FAULT_ENV: fault,
                      AFTER_REQUESTS_ENV: f"'{after_requests}'"}  # fmt: skip
    if fault == FULL_DISK:
        mount_small_disk(os.path.join(run_dir, "checkpoints"))
    if fault == NODE_LOSS:
        worker_env = {POOL_NODES_ENV: f"'trainer={TRAINER_NODE},sampler={SAMPLER_NODE}'"}
    overrides = training_overrides(cfg, model, train_file, val_file, run_dir) + [
        "trainer.val_before_train=False",
        *(f"+ray_kwargs.ray_init.runtime_env.env_vars.{name}={value}" for name, value in worker_env.items()),
    ]
    if fault in (FULL_DISK, *RESUMED_FAULTS):
        overrides.append("trainer.save_freq=1")
    if TRAINER_MODES[mode].from_plugin:
        timeout = "null" if stall_timeout_s is None else stall_timeout_s
        overrides.append(f"+trainer.v1.{mode}.stall_timeout_s={timeout}")
    log_path = os.path.join(run_dir, "train.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=run_dir,
                                   env=dict(os.environ, **job_env(run_dir)), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    return process, log_path


def mount_small_disk(path: str, size: str = SMALL_DISK) -> None:
    """A tmpfs of ``size`` (e.g. ``"2500k"``) at ``path``: a disk that fills with a real ENOSPC. Needs root."""
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True)
    if done.returncode != 0:
        reason = done.stderr.decode().strip()
        raise PermissionError(f"a small disk at {path} is a tmpfs mount, which needs root: {reason}")


def resize_small_disk(path: str, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", path], check=True, capture_output=True)


def unmount(path: str) -> None:
    if os.path.ismount(path):
        subprocess.run(["umount", "--lazy", path], capture_output=True)


def shm_files() -> dict[str, int]:
    found = {}
    for name in os.listdir("/dev/shm"):
        try:
            found[name] = os.stat(os.path.join("/dev/shm", name)).st_size
        except OSError:
            pass
    return found


def shm_added_since(before: dict[str, int]) -> dict[str, int]:
    """/dev/shm files that appeared or changed size since ``before`` (:func:`shm_files`), with their sizes."""
    return {name: size for name, size in shm_files().items() if before.get(name) != size}


def shm_left_since(before: dict[str, int], within_s: float = 10.0) -> dict[str, int]:
    """What :func:`shm_added_since` still finds once the run's processes had ``within_s`` to remove their files."""
    deadline = time.monotonic() + within_s
    while (added := shm_added_since(before)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return added


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process of this machine."""
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue
        table[int(pid)] = (parent, cmdline)
    return table


def reward_workers(table: dict[int, tuple[int, str]]) -> list[int]:
    """verl's reward worker actors (``RewardLoopWorker``), by their process title."""
    return [pid for pid, (_, cmdline) in table.items() if cmdline.startswith(REWARD_WORKER_TITLE)]



def scoring_processes(table: dict[int, tuple[int, str]]) -> list[int]:
    """The interleaved reward manager's scoring processes: the children of a reward worker's fork server
    (:mod:`verl_pipe.reward_manager.scoring_child`, which they share a command line with)."""
    from verl_pipe.reward_manager.scoring_processes import CHILD_MODULE

    workers = set(reward_workers(table))
    servers = {pid for pid, (parent, cmdline) in table.items() if parent in workers and CHILD_MODULE in cmdline}
    return [pid for pid, (parent, cmdline) in table.items() if parent in servers and CHILD_MODULE in cmdline]


def of_the_run(pid: int, run_dir: str) -> bool:
    """Whether process ``pid`` belongs to the verl job in ``run_dir``: its command line or working folder names the
    folder, or its environment does. Every Ray worker of the job (TaskRunner, reward workers, rollout servers,
    agent-loop workers) has the job's runtime_env in its environment, and the quickstart overrides put the run's
    metrics file there (``VERL_FILE_LOGGER_PATH``); their command lines (``ray::RewardLoopWorker``) and working
    folders (the raylet's) name nothing of the run."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().decode(errors="replace")
        if run_dir in cmdline or os.readlink(f"/proc/{pid}/cwd") == run_dir:
            return True
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return run_dir.encode() in fh.read()
    except OSError:  # gone meanwhile, or not ours to read
        return False


def job_processes(run_dir: str) -> int:
    """Processes still alive that belong to the run (:func:`of_the_run`)."""
    return sum(of_the_run(int(pid), run_dir) for pid in filter(str.isdigit, os.listdir("/proc")))


def processes_left(run_dir: str, within_s: float = 10.0) -> int:
    """The run's processes still alive once Ray had ``within_s`` to reap them (it does so after the driver is gone)."""
    deadline = time.monotonic() + within_s
    while (alive := job_processes(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def _checkpoints_left(checkpoint_dir: str) -> tuple[int | None, int]:
    """The step a resume would start from, and how many newer (half-written) checkpoint folders lie beside it."""
    from verl_pipe.trainers.checkpoint_guard import CheckpointTrackerError, read_tracker

    if not os.path.isdir(checkpoint_dir):
        return None, 0
    try:
        resumes_from = read_tracker(checkpoint_dir)
    except CheckpointTrackerError:
        resumes_from = None
    steps = [int(name.rsplit("_", 1)[1]) for name in os.listdir(checkpoint_dir) if name.startswith("global_step_")]
    return resumes_from, sum(step > (resumes_from or 0) for step in steps)


def _last_error(log_path: str) -> str:
    with open(log_path, errors="replace") as fh:
        lines = [line.strip() for line in fh if "Error" in line and "Warning" not in line]
    return lines[-1][-300:] if lines else ""


def _trained_step_numbers(run_dir: str) -> set[int]:
    return {record["step"] for record in read_steps(run_dir) if "timing_s/step" in record["data"]}


def _trained_steps(run_dir: str) -> int:
    return len(_trained_step_numbers(run_dir))


def trained_prompts(run_dir: str) -> list | None:
    """The dataset indices of the prompts a pipelined run trained, step by step (a resumed run's record of a step
    replaces the stopped run's); None where the mode keeps no ledger."""
    path = os.path.join(run_dir, LEDGER)
    if not os.path.exists(path):
        return None
    by_step = {}
    with open(path) as fh:
        for line in filter(str.strip, fh):
            record = json.loads(line)
            by_step[record["step"]] = record["prompts"]
    return [prompt for step in sorted(by_step) for prompt in by_step[step]]


def compare_prompts(trained: list, uninterrupted: list) -> tuple[int, int, int]:
    """(lost, twice, foreign): prompts the uninterrupted run trained and ``trained`` did not, prompts ``trained``
    holds more than once, prompts it holds that the uninterrupted run did not train."""
    return (len(set(uninterrupted) - set(trained)), len(trained) - len(set(trained)),
            len(set(trained) - set(uninterrupted)))  # fmt: skip


def _wait_for_steps(process: subprocess.Popen, run_dir: str, steps: int, timeout_s: float) -> None:
    """Until the run has trained ``steps``, has ended, or ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while _trained_steps(run_dir) < steps and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)


def kill_after_steps(process: subprocess.Popen, run_dir: str, steps: int, timeout_s: float,
                pick: Callable[[dict], list[int]]) -> tuple[int, float | None]:  # fmt: skip
    """Once ``steps`` are trained and ``pick`` finds processes in the process table, SIGKILL them; how many, and
    when (``time.monotonic()``; None if never)."""
    deadline = time.monotonic() + timeout_s
    _wait_for_steps(process, run_dir, steps, timeout_s)
    while process.poll() is None and time.monotonic() < deadline:
        targets = pick(process_table())
        if targets:
            for pid in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return len(targets), time.monotonic()
        time.sleep(0.1)
    return 0, None


def _kill_the_driver_after(process: subprocess.Popen, run_dir: str, steps: int, timeout_s: float) -> None:
    _wait_for_steps(process, run_dir, steps, timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)  # the driver alone: Ray reaps the job's actors once it is gone
    process.wait()


def engine_processes(table: dict[int, tuple[int, str]]) -> list[int]:
    """vLLM's engine processes, by their process title."""
    return [pid for pid, (_, cmdline) in table.items() if cmdline.startswith(ENGINE_TITLE)]


def vllm_servers(table: dict[int, tuple[int, str]]) -> list[int]:
    """verl's vLLM replica actors, by their process title."""
    return [pid for pid, (_, cmdline) in table.items() if VLLM_SERVER_TITLE.match(cmdline)]


def trainer_processes(table: dict[int, tuple[int, str]]) -> list[int]:
    """verl's TaskRunner actor (the trainer's loop), by its process title."""
    return [pid for pid, (_, cmdline) in table.items() if cmdline.startswith(TRAINER_TITLE)]


def _kill_the_trainer_mid_save(process: subprocess.Popen, run_dir: str, step: int, timeout_s: float) -> bool:
    """SIGKILL the trainer and the driver as soon as the folder of ``step``'s checkpoint appears; whether that was
    before its save completed (the tracker, which verl writes last, never named ``step``)."""
    from verl_pipe.trainers.checkpoint_guard import CheckpointTrackerError, read_tracker

    checkpoints = os.path.join(run_dir, "checkpoints")
    folder = os.path.join(checkpoints, f"global_step_{step}")
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline and not os.path.isdir(folder):
        time.sleep(0.005)  # a save of the tiny model takes a few hundred milliseconds
    for pid in trainer_processes(process_table()) + [process.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()
    try:
        return os.path.isdir(folder) and read_tracker(checkpoints) != step
    except CheckpointTrackerError:
        return True


def _lose_the_sampler_node_after(process: subprocess.Popen, run_dir: str, node: subprocess.Popen, steps: int,
                                 timeout_s: float) -> float:  # fmt: skip
    """Lose ``node`` once ``steps`` are trained; when (``time.monotonic()``)."""
    _wait_for_steps(process, run_dir, steps, timeout_s)
    lose_node(node)
    return time.monotonic()


def lose_node(node: subprocess.Popen) -> None:
    """Lose a node of :func:`verl_pipe.local_jobs.joined_ray_node` as a machine is lost: its raylet and every process
    on it SIGKILLed at once, none given the chance to tell the cluster (a SIGTERM would let the raylet say goodbye)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.pid, signal.SIGKILL)
    node.wait()


def classify_outcome(rc: int | None, trained: int, steps: int, fault: str, killed: int | None,
                     diagnosed: bool) -> str:  # fmt: skip
    """What became of a run: ``rc`` its exit code (None: still running at its bound, then killed), ``trained`` its
    steps, ``killed`` how many processes the harness killed (None: the fault is not a kill of the harness's; 0: the
    kill never came), ``diagnosed`` whether its log ends with one of verl-pipe's diagnoses (:data:`DIAGNOSES`)."""
    before = " before the fault" if killed == 0 else ""  # the cell must not pass for the fault's outcome
    if rc is None:
        return f"hung{before}"
    if rc == 0 and trained == steps:
        if killed == 0:
            return "not injected"
        if fault in RESUMED_FAULTS:
            return "resumed"
        return "recovered" if killed else "finished"
    return f"{'stopped' if diagnosed else 'failed'}{before}"


def run_case(mode: str, fault: str, model: str, ray_address: str, out_dir: str, after_requests: int,
             stall_timeout_s: float, hang_after_s: float, uninterrupted: list | None = None,
             fault_within_s: float = 600.0) -> CaseResult:  # fmt: skip
    """One cell. A fault the harness injects mid-run (a kill once a step is trained, a node lost) must come within
    ``fault_within_s`` of the start, and the run is hung if it still runs ``hang_after_s`` after the fault: a slow
    start-up neither passes for a hang nor hides one. A fault that comes from the start (the engine's, through its
    timing slot; the full disk) and the resume of a killed run count ``hang_after_s`` from their start."""
    from verl_pipe.local_jobs import joined_ray_node

    run_dir = os.path.abspath(os.path.join(out_dir, f"{mode}-{fault}"))
    os.makedirs(run_dir, exist_ok=True)
    steps = STEPS_OF_FAULT.get(fault, STEPS)
    shm_before = shm_files()
    if fault in VLLM_FAULTS:
        # vLLM's engine takes a minute or two to start on 2 cores, and its first answers are slow (the tiny model's
        # hf server: seconds); a dead replica is caught by the watch's check for dead actors, not by its timeout
        fault_within_s += VLLM_START_ALLOWANCE_S
        stall_timeout_s = max(stall_timeout_s, VLLM_STALL_TIMEOUT_S)
    running: list[subprocess.Popen] = []
    with contextlib.ExitStack() as stack:
        if fault == NODE_LOSS:  # a fresh sampler node for each case: the last one was lost
            node = stack.enter_context(joined_ray_node(ray_address, num_cpus=8, resources={SAMPLER_NODE: 1000}))
        # however the case ends (an interrupted `make chaos` included), its job goes: it runs in a session of its own
        stack.callback(lambda: running and stop_process_group(running[-1], grace_s=30.0))
        started = time.monotonic()
        process, log_path = start_faulted_run(run_dir, model, ray_address, mode, fault, after_requests,
                                              stall_timeout_s, steps=steps)  # fmt: skip
        running.append(process)
        killed, fault_at, left_by_the_killed, trained_by_the_killed = None, None, 0, set()
        if fault == NODE_LOSS:
            fault_at = _lose_the_sampler_node_after(process, run_dir, node, 2, fault_within_s)
        elif fault in MID_RUN_KILLS:
            pick = {VLLM_SERVER_KILL: vllm_servers, ENGINE_KILL: engine_processes, REWARD_KILL: reward_workers,
                    SCORING_KILL: scoring_processes}[fault]
            killed, fault_at = kill_after_steps(process, run_dir, 1, fault_within_s,
                                           lambda table: [p for p in pick(table) if of_the_run(p, run_dir)][:1])
        elif fault in RESUMED_FAULTS:
            if fault == DRIVER_KILL:
                _kill_the_driver_after(process, run_dir, 2, fault_within_s)
            else:
                killed = int(_kill_the_trainer_mid_save(process, run_dir, SAVE_KILL_STEP, fault_within_s))
            left_by_the_killed = processes_left(run_dir)
            trained_by_the_killed = _trained_step_numbers(run_dir)  # verl's file logger starts afresh on the rerun
            os.replace(log_path, os.path.join(run_dir, "train_killed.log"))
            started = time.monotonic()  # the resume: the same command again
            process, log_path = start_faulted_run(run_dir, model, ray_address, mode, fault, after_requests,
                                                  stall_timeout_s, steps=steps)  # fmt: skip
            running.append(process)
        hang_from = fault_at if fault_at is not None else started
        if fault in VLLM_FAULTS and fault_at is None:  # the fault never came: vLLM's start-up is in the window
            hang_from += VLLM_START_ALLOWANCE_S
        try:
            rc = process.wait(timeout=max(1.0, hang_from + hang_after_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = None
        ended = time.monotonic()
        seconds = ended - started
    with open(log_path, errors="replace") as fh:
        text = fh.read()
    diagnosed = any(line in text for line in DIAGNOSES)
    trained = len(_trained_step_numbers(run_dir) | trained_by_the_killed)
    outcome = classify_outcome(rc, trained, steps, fault, killed, diagnosed)
    left = max(processes_left(run_dir), left_by_the_killed)  # Ray reaps the job's actors once its driver is gone
    added = shm_left_since(shm_before)
    resumed = re.search(r"Resuming from \S*global_step_(\d+)", text) if fault in RESUMED_FAULTS else None
    checkpoint_step, partial = _checkpoints_left(os.path.join(run_dir, "checkpoints"))
    error = "" if outcome in ("finished", "recovered", "resumed") else _last_error(log_path)
    resumes_from = int(resumed.group(1)) if resumed else checkpoint_step
    result = CaseResult(mode, fault, outcome, round(seconds, 1), trained, left, sum(added.values()), error,
                        resumes_from, partial, steps_planned=steps)  # fmt: skip
    if fault_at is not None:
        result.after_fault_s = round(ended - fault_at, 1)
    prompts = trained_prompts(run_dir)
    if uninterrupted is not None and prompts is not None:
        result.prompts_lost, result.prompts_twice, result.prompts_foreign = compare_prompts(prompts, uninterrupted)
    unmount(os.path.join(run_dir, "checkpoints"))
    return result


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.0f} MiB" if n_bytes >= 2**20 else f"{n_bytes} bytes"  # a stray semaphore is 32


def format_table(results: list[CaseResult]) -> str:
    faults = sorted({r.fault for r in results}, key=CHAOS_FAULTS.index)
    modes = [m for m in TRAINER_MODES if any(r.mode == m for r in results)]
    cell = {(r.mode, r.fault): r for r in results}
    header = "| mode | " + " | ".join(f"{fault}" for fault in faults) + " |"
    lines = [header, "|---" * (len(faults) + 1) + "|"]
    for mode in modes:
        cells = []
        for fault in faults:
            r = cell.get((mode, fault))
            if r is None:
                cells.append("-")
                continue
            left = f"; left {r.leftover_processes} processes" if r.leftover_processes else ""
            shm = f"; left {_size(r.leftover_shm_bytes)} in /dev/shm" if r.leftover_shm_bytes else ""
            saved = f"; resumes from step {r.resumes_from}" if r.resumes_from else ""
            if r.fault in RESUMED_FAULTS:
                saved = f"; resumed from step {r.resumes_from}" if r.resumes_from else "; no resume"
                if r.fault == SAVE_KILL and r.outcome == "resumed":
                    saved = f"; killed mid-save of step {SAVE_KILL_STEP}{saved}"
            partial = f"; left {r.partial_checkpoints} half-written checkpoint" if r.partial_checkpoints else ""
            evidence = f"{r.steps_trained}/{r.steps_planned} steps{saved}{partial}{left}{shm}{_data_evidence(r)}"
            since = f", {r.after_fault_s:.0f} s after the fault" if r.after_fault_s is not None else ""
            cells.append(f"{r.outcome} after {r.seconds:.0f} s{since} ({evidence})")
        lines.append(f"| `{mode}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _data_evidence(r: CaseResult) -> str:
    if r.fault not in RESUMED_FAULTS:
        return ""
    if r.prompts_lost is None:
        return "; prompts not compared (the mode keeps no ledger)"
    foreign = f", {r.prompts_foreign} not in it" if r.prompts_foreign else ""
    return f"; against an uninterrupted run: {r.prompts_lost} prompts lost, {r.prompts_twice} trained twice{foreign}"


def uninterrupted_prompts(model: str, ray_address: str, out_dir: str, timeout_s: float) -> list:
    """The prompts an uninterrupted pipelined run trains (the driver_kill cases are compared with them)."""
    run_dir = os.path.abspath(os.path.join(out_dir, f"{REFERENCE_MODE}-{NO_FAULT}"))
    os.makedirs(run_dir, exist_ok=True)
    process, log_path = start_faulted_run(run_dir, model, ray_address, REFERENCE_MODE, NO_FAULT)
    try:
        rc = process.wait(timeout=timeout_s)
    finally:
        stop_process_group(process, grace_s=30.0)
    prompts = trained_prompts(run_dir)
    if rc != 0 or not prompts:
        raise RuntimeError(f"the uninterrupted {REFERENCE_MODE} run failed (exit code {rc}); see {log_path}")
    return prompts


def run_chaos(modes: list[str], faults: list[str], out_dir: str, after_requests: int = 2,
              stall_timeout_s: float = 10.0, hang_after_s: float = 180.0,
              fault_within_s: float = 600.0) -> list[CaseResult]:  # fmt: skip
    from verl_pipe.local_jobs import local_ray_head, sigterm_unwinds
    from verl_pipe.models import build_tiny_qwen2, resolve_model_path

    unknown = [m for m in modes if m not in TRAINER_MODES] + [f for f in faults if f not in CHAOS_FAULTS]
    if unknown:
        raise ValueError(
            f"unknown mode or fault {unknown[0]!r}: modes {list(TRAINER_MODES)}, faults {list(CHAOS_FAULTS)}"
        )
    if FULL_DISK in faults and os.geteuid() != 0:
        raise ValueError(f"the {FULL_DISK} fault mounts a small tmpfs, which needs root: run as root or leave it out "
                         f"(--faults {','.join(f for f in faults if f != FULL_DISK) or 'stall,kill'})")  # fmt: skip
    wanted = [f for f in faults if f in VLLM_FAULTS]
    if wanted and importlib.util.find_spec("vllm") is None:
        faults = [f for f in faults if f not in VLLM_FAULTS]
        print(f"{','.join(wanted)}: left out: vLLM is not importable from {sys.executable}; `make chaos` runs from "
              f".venv-vllm (or: .venv-vllm/bin/verl-pipe chaos --faults {','.join(wanted)})", flush=True)  # fmt: skip
        if not faults:
            raise ValueError(f"the {','.join(wanted)} faults need vLLM: run `make install-vllm`, then "
                             f".venv-vllm/bin/verl-pipe chaos --faults {','.join(wanted)}")  # fmt: skip
    model = build_tiny_qwen2()
    vllm_model = resolve_model_path("smollm2") if any(f in VLLM_FAULTS for f in faults) else None
    results = []
    # the head carries the trainer's node resource: the node_loss cases place their trainer pool by it
    with sigterm_unwinds(), local_ray_head(num_cpus=16, resources={TRAINER_NODE: 1000}) as address:
        resumes = any(fault in RESUMED_FAULTS for fault in faults)
        uninterrupted = uninterrupted_prompts(model, address, out_dir, hang_after_s) if resumes else None
        for fault in faults:
            for mode in modes:
                if fault == NODE_LOSS and not TRAINER_MODES[mode].separate_pools:
                    continue  # one pool: there is no sampler's node to lose
                result = run_case(mode, fault, vllm_model if fault in VLLM_FAULTS else model, address, out_dir,
                                  after_requests, stall_timeout_s, hang_after_s, uninterrupted,
                                  fault_within_s)  # fmt: skip
                print(f"{mode} / {fault}: {result.outcome} after {result.seconds:.0f} s", flush=True)
                results.append(result)
    with open(os.path.join(out_dir, "chaos.json"), "w") as fh:
        json.dump([asdict(r) for r in results], fh, indent=2)
    return results
