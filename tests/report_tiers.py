"""The end of `make test`: the slowest tests of the whole suite, every failure, then each tier's time, counts and
exit status (last, where a log's tail shows them), read from the tiers' JUnit reports (kept in runs/test-reports
as the run's record of durations).

    python tests/report_tiers.py --tier main runs/test-reports/main.xml 0 2650 --tier vllm ... [--slowest 25]

A tier whose report is missing (its pytest never started, or died) is reported as such, never as passed. Beside
each report, ``<name>.progress`` (tests/progress_log.py) names the tests a stopped tier had started and not
finished.
"""

from __future__ import annotations

import argparse
import os
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from progress_log import unfinished  # noqa: E402


# `timeout`'s exit status when the tier's time ran out (124), or when it had to kill pytest after it (137).
TIMED_OUT = (124, 137)


@dataclass
class Tier:
    name: str
    report: str
    exit_status: int
    wall_s: float
    counts: dict[str, int] = field(default_factory=dict)
    tests: list[tuple[float, str]] = field(default_factory=list)  # (seconds, node id)
    failures: list[str] = field(default_factory=list)
    readable: bool = False
    unfinished: list[tuple[str, float]] = field(default_factory=list)  # (node id, seconds it had run)


def read_tier(tier: Tier) -> Tier:
    progress = os.path.splitext(tier.report)[0] + ".progress"
    if os.path.exists(progress):
        tier.unfinished = unfinished(progress)
    if not os.path.exists(tier.report):
        return tier
    try:
        root = ET.parse(tier.report).getroot()
    except ET.ParseError:
        return tier
    tier.readable = True
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for case in root.iter("testcase"):
        if not case.get("name"):
            continue  # the test an interrupt stopped: pytest-xdist writes it with no name and no outcome
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        counts[outcome] += 1
        tier.tests.append((float(case.get("time") or 0.0), name))
        if outcome in ("failed", "error"):
            tier.failures.append(f"{outcome}: {name}")
    tier.counts = counts
    return tier


def format_report(tiers: list[Tier], slowest: int) -> str:
    lines = [""]
    ranked = sorted(((s, f"[{t.name}] {n}") for t in tiers for s, n in t.tests), reverse=True)[:slowest]
    if ranked:
        lines.append(f"--- the {len(ranked)} slowest tests (setup + call + teardown) ---")
        lines += [f"{s:7.1f} s  {n}" for s, n in ranked]
    failures = [f"[{t.name}] {f}" for t in tiers for f in t.failures]
    if failures:
        lines.append("--- failures ---")
        lines += failures
    lines.append("=" * 30 + " test tiers " + "=" * 30)
    for t in tiers:
        if not t.readable:
            summary = f"no readable report at {t.report} (the tier did not run to its end)"
        else:
            summary = ", ".join(f"{n} {k}" for k, n in t.counts.items() if n)
        status = "ok" if t.exit_status == 0 else f"FAILED (exit {t.exit_status})"
        if t.exit_status in TIMED_OUT:
            status = f"FAILED (stopped at its time limit, exit {t.exit_status}: the tests after it did not run)"
        lines.append(f"{t.name:>6}: {t.wall_s / 60:5.1f} min  {status}  {summary}")
        lines += [f"        unfinished when it stopped ({s:.0f} s in): {n}" for n, s in t.unfinished]
    total = sum(t.wall_s for t in tiers)
    lines.append(f" total: {total / 60:5.1f} min of tier time")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", nargs=4, action="append", required=True,
                        metavar=("NAME", "JUNIT_XML", "EXIT_STATUS", "WALL_S"))  # fmt: skip
    parser.add_argument("--slowest", type=int, default=25)
    args = parser.parse_args(argv)
    tiers = [read_tier(Tier(name, report, int(status), float(wall))) for name, report, status, wall in args.tier]
    print(format_report(tiers, args.slowest))
    return 0 if all(t.exit_status == 0 and t.readable and not t.unfinished for t in tiers) else 1


if __name__ == "__main__":
    sys.exit(main())
