"""``verl-pipe chaos``'s table and its refusal of names it does not know (its runs are ``make chaos``; the suite's
fault cases are tests/e2e/test_stalled_engine_on_cpu.py, which starts its runs with the same function)."""

from __future__ import annotations

import os
import time

import pytest

from verl_pipe.chaos import CaseResult, _checkpoints_left, format_table, run_chaos


def test_the_table_has_a_row_per_mode_and_a_cell_per_fault(tmp_path):
    results = [
        CaseResult("sync", "stall", "hung", 180.4, 0, 0, 0),
        CaseResult("one_off_pipeline", "stall", "stopped", 61.0, 0, 0, 0),
        CaseResult("one_off_pipeline", "kill", "stopped", 58.2, 0, 2, 3 * 2**20),
        CaseResult("minibatch_pipeline", "stall", "stopped", 60.0, 0, 0, 32),
    ]
    table = format_table(results).splitlines()
    assert table[0] == "| mode | stall | kill |"
    assert table[2] == "| `sync` | hung after 180 s (0/3 steps) | - |"
    assert table[3] == ("| `one_off_pipeline` | stopped after 61 s (0/3 steps) | stopped after 58 s (0/3 steps; left 2 "
                        "processes; left 3 MiB in /dev/shm) |")  # fmt: skip
    assert table[4] == "| `minibatch_pipeline` | stopped after 60 s (0/3 steps; left 32 bytes in /dev/shm) | - |"


@pytest.mark.parametrize("modes, faults, name", [(["async"], ["stall"], "async"), (["sync"], ["melt"], "melt")])
def test_an_unknown_mode_or_fault_is_named(tmp_path, modes, faults, name):
    with pytest.raises(ValueError, match=f"unknown mode or fault '{name}'"):
        run_chaos(modes, faults, str(tmp_path))


def test_the_full_disk_cells_say_where_a_resume_starts_and_what_was_left_half_written(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    for step in (1, 2):
        (checkpoints / f"global_step_{step}" / "actor").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("1")
    assert _checkpoints_left(str(checkpoints)) == (1, 1)  # step 2's save failed half-way
    results = [
        CaseResult("sync", "full_disk", "failed", 48.0, 1, 0, 0, "RuntimeError", *_checkpoints_left(str(checkpoints))),
        CaseResult("one_off_pipeline", "full_disk", "stopped", 46.0, 1, 0, 0, "CheckpointSaveError", 1, 0),
    ]
    table = format_table(results).splitlines()
    assert table[2] == "| `sync` | failed after 48 s (1/3 steps; resumes from step 1; left 1 half-written checkpoint) |"
    assert table[3] == "| `one_off_pipeline` | stopped after 46 s (1/3 steps; resumes from step 1) |"
    assert _checkpoints_left(str(tmp_path / "none")) == (None, 0)


def test_a_node_loss_cell_counts_its_own_steps_and_a_one_pool_mode_has_none():
    results = [
        CaseResult("sync", "stall", "hung", 180.0, 0, 0, 0),
        CaseResult("one_off_pipeline", "node_loss", "stopped", 52.0, 3, 0, 0, "LostNodeError", steps_planned=20,
                   after_fault_s=18.2),  # fmt: skip
    ]
    table = format_table(results).splitlines()
    assert table[0] == "| mode | stall | node_loss |"
    assert table[2] == "| `sync` | hung after 180 s (0/3 steps) | - |"
    assert table[3] == "| `one_off_pipeline` | - | stopped after 52 s, 18 s after the fault (3/20 steps) |"


def _write_ledger(run_dir, rows) -> None:
    """Ledger lines in the pipelined modes' schema (trainers/step_ledger.py), trimmed to the fields chaos reads."""
    import json
    import os

    os.makedirs(run_dir / "checkpoints", exist_ok=True)
    with open(run_dir / "checkpoints" / "pipeline_ledger.jsonl", "w") as fh:
        for step, prompts in rows:
            fh.write(json.dumps({"step": step, "mode": "one_off_pipeline", "prompts": prompts}) + "\n")


def test_a_resumed_ledger_is_compared_with_the_uninterrupted_run(tmp_path):
    from verl_pipe.chaos import compare_prompts, trained_prompts

    uninterrupted = [0, 1, 2, 3, 4, 5]
    # killed after step 2, resumed from step 1: step 2 is trained again, and its second record is the one that counts
    _write_ledger(tmp_path, [(1, [0, 1]), (2, [2, 3]), (2, [2, 3]), (3, [4, 5])])
    assert trained_prompts(str(tmp_path)) == uninterrupted
    assert compare_prompts(trained_prompts(str(tmp_path)), uninterrupted) == (0, 0, 0)
    # the control: a resume that read the dataloader from the start trains step 1's prompts again and loses 4 and 5
    _write_ledger(tmp_path, [(1, [0, 1]), (2, [2, 3]), (3, [0, 1])])
    assert compare_prompts(trained_prompts(str(tmp_path)), uninterrupted) == (2, 2, 0)
    assert compare_prompts([0, 1, 2, 3, 4, 9], uninterrupted) == (1, 0, 1)
    assert trained_prompts(str(tmp_path / "no_ledger")) is None  # verl's own modes keep none


def test_a_driver_kill_cell_says_where_the_rerun_resumed_and_what_it_lost():
    results = [
        CaseResult("sync", "driver_kill", "resumed", 51.0, 3, 0, 0, resumes_from=2),
        CaseResult("one_off_pipeline", "driver_kill", "resumed", 47.0, 3, 0, 0, resumes_from=2, prompts_lost=0,
                   prompts_twice=0, prompts_foreign=0),  # fmt: skip
        CaseResult("in_flight_pipeline", "driver_kill", "failed", 30.0, 2, 0, 0, "ValueError", prompts_lost=2,
                   prompts_twice=1, prompts_foreign=1),  # fmt: skip
    ]
    table = format_table(results).splitlines()
    assert table[0] == "| mode | driver_kill |"
    assert table[2] == ("| `sync` | resumed after 51 s (3/3 steps; resumed from step 2; prompts not compared (the mode "
                        "keeps no ledger)) |")  # fmt: skip
    assert table[3] == ("| `one_off_pipeline` | resumed after 47 s (3/3 steps; resumed from step 2; against an "
                        "uninterrupted run: 0 prompts lost, 0 trained twice) |")  # fmt: skip
    assert table[4] == ("| `in_flight_pipeline` | failed after 30 s (2/3 steps; no resume; against an uninterrupted "
                        "run: 2 prompts lost, 1 trained twice, 1 not in it) |")  # fmt: skip




def test_a_save_kill_cell_says_the_save_was_interrupted_only_when_it_was():
    results = [
        CaseResult("minibatch_pipeline", "save_kill", "resumed", 50.0, 3, 0, 0, resumes_from=2, prompts_lost=0,
                   prompts_twice=0, prompts_foreign=0),  # fmt: skip
        CaseResult("sync", "save_kill", "not injected", 40.0, 3, 0, 0, resumes_from=3),  # the save beat the kill
    ]
    table = format_table(results).splitlines()
    assert table[2] == ("| `sync` | not injected after 40 s (3/3 steps; resumed from step 3; prompts not compared (the "
                        "mode keeps no ledger)) |")  # fmt: skip
    assert table[3] == ("| `minibatch_pipeline` | resumed after 50 s (3/3 steps; killed mid-save of step 3; resumed "
                        "from step 2; against an uninterrupted run: 0 prompts lost, 0 trained twice) |")  # fmt: skip


def test_the_process_kills_pick_the_trainers_loop_vllms_replica_and_its_engine():
    from verl_pipe.chaos import engine_processes, trainer_processes, vllm_servers

    table = {
        10: (1, "ray::TaskRunnerV1.run"),
        11: (1, "ray::TaskRunner"),
        12: (1, "ray::RewardLoopWorker"),
        13: (10, "python -m verl_pipe.reward_manager.scoring_child 7"),
        14: (1, "/venv/bin/python -m verl.trainer.main_ppo ray::TaskRunner"),  # the driver: killed by pid, separately
        20: (1, "ray::vLLMHttpServer.generate"),
        21: (20, "VLLM::EngineCore"),
        22: (1, "ray::CPUvLLMHttpServer"),  # the CPU backend's subclass
        23: (22, "VLLM::EngineCore_DP1"),
        24: (1, "/venv/bin/python -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=vllm"),
        25: (1, "ray::vLLMHttpServerless"),
    }
    assert trainer_processes(table) == [10, 11]
    assert vllm_servers(table) == [20, 22]
    assert engine_processes(table) == [21, 23]

def test_the_reward_faults_pick_the_reward_worker_and_its_scoring_processes():
    from verl_pipe.chaos import reward_workers, scoring_processes

    scoring = "/venv/bin/python -m verl_pipe.reward_manager.scoring_child 7"  # its fork server, and what it forks
    table = {  # pid -> (parent pid, command line), as /proc has them in a run
        100: (1, "ray::RewardLoopWorker"),
        101: (1, "ray::RewardLoopWorker.run_single"),  # busy: Ray adds the method it runs
        110: (100, scoring),  # worker 100's fork server
        111: (101, scoring),  # worker 101's
        102: (110, scoring),
        103: (111, scoring),
        104: (102, "bwrap --unshare-all ... python3 solution.py"),  # a sandbox the score started: not ours to kill
        200: (1, "ray::AgentLoopWorkerTQ"),
        201: (200, scoring),  # another actor's child
        202: (201, scoring),
        300: (1, "/venv/bin/python -m verl.trainer.main_ppo reward.num_workers=1"),
    }
    assert reward_workers(table) == [100, 101]
    assert scoring_processes(table) == [102, 103]


@pytest.mark.parametrize(("rc", "trained", "fault", "killed", "diagnosed", "outcome"), [
    (0, 6, "reward_kill", 1, False, "recovered"),  # trained every step through the kill
    (1, 2, "reward_kill", 1, True, "stopped"),  # one of our diagnoses
    (1, 2, "reward_kill", 1, False, "failed"),  # another error
    (None, 3, "reward_kill", 1, False, "hung"),  # still running hang_after_s after the fault
    (None, 0, "reward_kill", 0, False, "hung before the fault"),  # no step trained within fault_within_s
    (1, 0, "reward_kill", 0, True, "stopped before the fault"),  # must not pass for the fault's outcome
    (0, 6, "reward_kill", 0, False, "not injected"),  # the kill never found its process
    (0, 3, "stall", None, False, "finished"),  # an engine fault that never bit
    (None, 0, "stall", None, False, "hung"),
    (0, 3, "driver_kill", None, False, "resumed"),
    (0, 3, "save_kill", 1, False, "resumed"),
    (0, 3, "save_kill", 0, False, "not injected"),  # the save beat the kill
    (0, 2, "stall", None, False, "failed"),  # exited 0 without every step: not a finish
])
def test_the_outcome_rules(rc, trained, fault, killed, diagnosed, outcome):
    from verl_pipe.chaos import STEPS, STEPS_OF_FAULT, classify_outcome

    steps = STEPS_OF_FAULT.get(fault, STEPS)
    assert classify_outcome(rc, trained, steps, fault, killed, diagnosed) == outcome


@pytest.mark.quiet  # a wall-clock bound: run with no other test beside it
def test_the_hang_bound_counts_from_the_fault_not_from_the_start(tmp_path, monkeypatch):
    """A slow start-up (here 3 s to the first trained step) must not eat into the time a run gets after its fault:
    a job that stops 1.5 s after its reward worker is killed is stopped with the bound at 2.5 s from the fault;
    counted from the start, as before, the same job read hung."""
    import subprocess
    import sys

    from verl_pipe import chaos

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    worker = subprocess.Popen(sleeper)  # the job's reward worker, killed for real
    started = {}

    def start_faulted_run(run_dir, *args, **kwargs):
        log = os.path.join(run_dir, "train.log")
        with open(log, "w") as fh:
            fh.write(f"RuntimeError: in_flight_pipeline: {chaos.DIAGNOSES[1]} step 2 ...\n")
        started["at"] = time.monotonic()
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4.5); raise SystemExit(1)"]), log

    monkeypatch.setattr(chaos, "start_faulted_run", start_faulted_run)
    monkeypatch.setattr(chaos, "_trained_step_numbers",
                        lambda run_dir: {1} if time.monotonic() - started["at"] > 3.0 else set())
    monkeypatch.setattr(chaos, "process_table", lambda: {worker.pid: (1, "ray::RewardLoopWorker")})
    monkeypatch.setattr(chaos, "of_the_run", lambda pid, run_dir: pid == worker.pid)
    try:
        result = chaos.run_case("in_flight_pipeline", "reward_kill", "model", "address", str(tmp_path), 2, 10.0,
                                hang_after_s=2.5, fault_within_s=30.0)  # fmt: skip
    finally:
        worker.kill()
    assert worker.wait() == -9  # the harness killed it
    assert result.outcome == "stopped", result
    assert 1.0 < result.after_fault_s < 2.5 and result.seconds > 4.0, result


def test_a_process_belongs_to_the_run_whose_folder_its_environment_names(tmp_path):
    """Ray's actors of a job (``ray::RewardLoopWorker``) run in the raylet's folder and name nothing of the run on their
    command line; the job's runtime_env (the run's metrics file) is in their environment."""
    import subprocess
    import sys

    from verl_pipe.chaos import job_processes, of_the_run

    run_dir = str(tmp_path / "run")
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd=str(tmp_path),
                            env=dict(os.environ, VERL_FILE_LOGGER_PATH=f"{run_dir}/verl_metrics.jsonl"))  # fmt: skip
    theirs = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd=str(tmp_path))
    try:
        time.sleep(0.2)
        assert of_the_run(ours.pid, run_dir) and not of_the_run(theirs.pid, run_dir)
        assert job_processes(run_dir) == 1
    finally:
        ours.kill(), theirs.kill(), ours.wait(), theirs.wait()
    assert job_processes(run_dir) == 0
