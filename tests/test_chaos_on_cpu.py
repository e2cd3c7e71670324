"""``verl-pipe chaos``'s table and its refusal of names it does not know (its runs are ``make chaos``; the suite's
fault cases are tests/e2e/test_stalled_engine_on_cpu.py, which starts its runs with the same function)."""

from __future__ import annotations

import pytest

from verl_pipe.chaos import CaseResult, _checkpoints_left, format_table, run_chaos


def test_the_table_has_a_row_per_mode_and_a_cell_per_fault(tmp_path):
    results = [
        CaseResult("sync", "stall", "hung", 180.4, 0, 0, 0),
        CaseResult("one_off_pipeline", "stall", "stopped", 61.0, 0, 0, 0),
        CaseResult("one_off_pipeline", "kill", "stopped", 58.2, 0, 2, 3 * 2**20),
    ]
    table = format_table(results).splitlines()
    assert table[0] == "| mode | stall | kill |"
    assert table[2] == "| `sync` | hung after 180 s (0/3 steps) | - |"
    assert table[3] == ("| `one_off_pipeline` | stopped after 61 s (0/3 steps) | stopped after 58 s (0/3 steps; left 2 "
                        "processes; left 3 MiB in /dev/shm) |")  # fmt: skip


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
        CaseResult("one_off_pipeline", "node_loss", "failed", 52.0, 3, 0, 0, "ActorUnavailableError", steps_planned=20),
    ]
    table = format_table(results).splitlines()
    assert table[0] == "| mode | stall | node_loss |"
    assert table[2] == "| `sync` | hung after 180 s (0/3 steps) | - |"
    assert table[3] == "| `one_off_pipeline` | - | failed after 52 s (3/20 steps) |"
