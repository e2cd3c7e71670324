"""Every registered patch of verl is applied and called somewhere in the session's end-to-end runs.

Each verl process of the session writes to the patch ledger (``VERL_PIPE_PATCH_LEDGER``, set in conftest.py)
which patches it applied and which of them ran. A patch that is declared but never runs in a real run is
either dead or untested; either way this test names it. It needs the whole session's runs, so it runs last
(conftest.py) and only when the session collected every file that runs verl end to end.
"""

from __future__ import annotations

import glob
import json
import os

import pytest

from verl_pipe.bench.latency_hooks import LATENCY_MODEL_PATCHES
from verl_pipe.patch_registry import PATCHES

# The files whose runs, together, exercise every patch.
RUN_FILES = (
    "tests/e2e/test_trainers_e2e_on_cpu.py",
    "tests/e2e/test_pipelined_trainers_e2e_on_cpu.py",
    "tests/bench/test_bench_pipeline_on_cpu.py",
)
# The conditions the suite's runs create (every run has a driver and is on the CPU platform; the benchmark's turn
# the latency model on). Patches for other conditions (an optional engine that is not installed) are not required
# here.
SUITE_CONDITIONS = ("always", "verl driver", "cpu platform", "latency model")
# Patches the suite's runs do not call, with the test that covers each instead.
NOT_CALLED_IN_CPU_RUNS = {
    # It acts only on a machine with no accelerator *and* no VERL_PLATFORM; every run here sets VERL_PLATFORM.
    "no_silent_nvidia_fallback": "tests/test_setup_errors_on_cpu.py",
    # It acts when a sync aborts requests under the latency model (verl's separate_async in `make bench`); the
    # suite's benchmark runs sync and one-off, which never abort, so its pause is checked on verl's module.
    "latency_model_partial_rollout_pause": "tests/bench/test_latency_model_on_cpu.py",
}


def _ledger() -> dict[str, set[str]]:
    events: dict[str, set[str]] = {}
    for path in glob.glob(os.path.join(os.environ["VERL_PIPE_PATCH_LEDGER"], "*.jsonl")):
        with open(path) as handle:
            for line in handle:
                record = json.loads(line)
                events.setdefault(record["event"], set()).add(record["patch"])
    return events


@pytest.mark.e2e
def test_every_patch_applies_and_runs_in_the_end_to_end_runs(request):
    collected = {os.path.relpath(str(item.path), request.config.rootpath) for item in request.session.items}
    missing = [path for path in RUN_FILES if path not in collected]
    if missing or request.config.option.keyword or request.config.option.markexpr:
        pytest.skip(f"needs the whole session's end-to-end runs (not collected or filtered: {missing or '-k/-m'})")
    if request.session.testsfailed:
        pytest.skip("an earlier run failed; its patches may not have run")
    events = _ledger()
    declared = PATCHES + LATENCY_MODEL_PATCHES
    names = {patch.name for patch in declared if patch.when in SUITE_CONDITIONS}
    registered = {patch.name for patch in declared}
    skipped = events.get("skipped", set()) & registered  # unit tests skip made-up stale patches on purpose
    assert not skipped, f"registered patches skipped in a run (verl's code no longer matches): {skipped}"
    never_applied = names - events.get("applied", set())
    assert not never_applied, f"registered patches that no end-to-end run applied: {sorted(never_applied)}"
    never_called = names - events.get("fired", set()) - set(NOT_CALLED_IN_CPU_RUNS)
    assert not never_called, f"registered patches that no end-to-end run called: {sorted(never_called)}"
