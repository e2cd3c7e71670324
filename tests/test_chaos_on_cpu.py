"""``verl-pipe chaos``'s table and its refusal of names it does not know (its runs are ``make chaos``; the suite's
fault cases are tests/e2e/test_stalled_engine_on_cpu.py, which starts its runs with the same function)."""

from __future__ import annotations

import pytest

from verl_pipe.chaos import CaseResult, format_table, run_chaos


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
