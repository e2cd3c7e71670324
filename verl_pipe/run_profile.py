"""Where a quickstart run's wall time goes: its phase table, and a load to run beside it.

The table is built from what the run already logs: verl's per-step ``timing_s/*`` timers, the duration of each
validation (``timing_s/validation``, which :mod:`verl_pipe.step_metrics` adds, since verl does not time the one
before training), and the wall time at which the quickstart saw each of verl's metric records arrive. Start-up is
what comes before the first record's own duration; ``finish`` is what comes after the last record (verl's
shutdown). Arrival times are polled once a second, so start-up and finish carry about a second of error; the
rest are verl's own timers. The quickstart's ``finish`` also holds its plot.

``busy_loops(n)`` starts ``n`` processes that spin a core each, at the caller's priority, for the duration of a
run: the light concurrent load ``make demo-profile BUSY_LOOPS=1`` measures the run against.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Iterator, Optional

from verl_pipe.run_metrics import PHASE_KEYS
from verl_pipe.step_metrics import VALIDATION_TIME_KEY as VALIDATION_KEY

# verl's timers inside a step (the step's own and the validation after it are not), keyed by their short names;
# any other timing_s/* of a step goes to "other".
STEP_PHASES = {short: key for key, short in PHASE_KEYS.items() if short not in ("step", "validate")}


@dataclass(frozen=True)
class TimedRecord:
    """One record of verl's file logger, with the wall second (from the run's start) at which it was seen."""

    seen_s: float
    step: int
    data: dict


@dataclass
class StepPhases:
    step: int
    step_s: float
    # verl's step timers (STEP_PHASES, as present), plus "other": the step's time none of them covers.
    phases_s: dict[str, float] = field(default_factory=dict)


@dataclass
class PhaseTable:
    total_s: float
    startup_s: Optional[float]
    validation_before_s: Optional[float]
    steps: list[StepPhases]
    validation_after_s: Optional[float]
    finish_s: Optional[float]
    # What ran beside the run (e.g. "1 busy loop"); "" when nothing was started beside it.
    load: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    def render(self) -> str:
        def secs(value: Optional[float]) -> str:
            return "     n/a" if value is None else f"{value:8.1f}"

        columns = [p for p in (*STEP_PHASES, "other") if any(p in s.phases_s for s in self.steps)]
        title = "phase table, wall seconds" + (f", beside {self.load}" if self.load else ", nothing beside it")
        lines = [title, f"  start-up            {secs(self.startup_s)}",
                 f"  validation before   {secs(self.validation_before_s)}"]  # fmt: skip
        if self.steps:
            lines.append("  step " + "".join(f"{name[:14]:>15}" for name in columns) + f"{'step':>9}")
            for s in self.steps:
                cells = "".join(f"{s.phases_s[n]:15.1f}" if n in s.phases_s else f"{'-':>15}" for n in columns)
                lines.append(f"  {s.step:4d} {cells}{s.step_s:9.1f}")
            mean = {n: sum(s.phases_s.get(n, 0.0) for s in self.steps) / len(self.steps) for n in columns}
            mean_step = sum(s.step_s for s in self.steps) / len(self.steps)
            lines.append("  mean " + "".join(f"{mean[n]:15.1f}" for n in columns) + f"{mean_step:9.1f}")
        lines += [f"  validation after    {secs(self.validation_after_s)}", f"  finish              {secs(self.finish_s)}",
                  f"  total               {secs(self.total_s)}"]  # fmt: skip
        return "\n".join(lines)


def _step_phases(step: int, data: dict) -> StepPhases:
    step_s = float(data["timing_s/step"])
    phases = {short: float(data[key]) for short, key in STEP_PHASES.items() if key in data}
    # Nested or unlisted timers (a mode's own) are left inside "other" rather than counted twice.
    phases["other"] = max(0.0, step_s - sum(phases.values()))
    return StepPhases(step=step, step_s=step_s, phases_s=phases)


def phase_table(records: list[TimedRecord], total_s: float, load: str = "") -> PhaseTable:
    """The phase table of a run from its timed records (in arrival order) and its wall time."""
    steps = [_step_phases(r.step, r.data) for r in records if "timing_s/step" in r.data]
    before = next((r for r in records if "timing_s/step" not in r.data and VALIDATION_KEY in r.data), None)
    last_step = next((r for r in reversed(records) if "timing_s/step" in r.data), None)
    after = None
    if last_step is not None:
        after_key = VALIDATION_KEY if VALIDATION_KEY in last_step.data else "timing_s/testing"
        after = float(last_step.data[after_key]) if after_key in last_step.data else None
    startup = None
    if records:
        first = records[0]
        if "timing_s/step" in first.data:
            validation = first.data.get(VALIDATION_KEY, first.data.get("timing_s/testing", 0.0))
            own = float(first.data["timing_s/step"]) + float(validation)
        else:
            own = float(first.data[VALIDATION_KEY]) if VALIDATION_KEY in first.data else None
        startup = None if own is None else max(0.0, first.seen_s - own)
    return PhaseTable(
        total_s=total_s,
        startup_s=startup,
        validation_before_s=float(before.data[VALIDATION_KEY]) if before is not None else None,
        steps=steps,
        validation_after_s=after,
        finish_s=max(0.0, total_s - records[-1].seen_s) if records else None,
        load=load,
    )


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[list[subprocess.Popen]]:
    """``count`` processes that each spin one core until the block ends (killed then, whatever happened)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def describe_load(count: int) -> str:
    return "" if count == 0 else f"{count} busy loop" + ("s" if count > 1 else "")
