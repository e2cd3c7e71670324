"""What ``verl-pipe eval`` reports: pass@k tables (overall, per source, per difficulty), the share of answers
the grader could read, outcome counts, and the Codeforces rating; printed as a table and saved as JSON."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_pipe.reports import write_json

from .codeforces import RatingEstimate
from .pass_at_k import PassAtKRow, by_difficulty, by_source, pass_at_1
from .problems import EvalProblem


@dataclass
class EvalReport:
    settings: dict[str, Any]
    ks: list[int] = field(default_factory=list)
    pass_at_1: float | None = None  # mean over each problem's n samples, then over problems
    by_source: list[PassAtKRow] = field(default_factory=list)
    by_difficulty: list[PassAtKRow] = field(default_factory=list)
    format_rate: float | None = None  # share of samples with a code block (or answer) the grader could read
    outcomes: dict[str, int] = field(default_factory=dict)
    problems: list[dict[str, Any]] = field(default_factory=list)
    codeforces: RatingEstimate | None = None
    wall_s: float = 0.0

    @property
    def overall(self) -> dict[str, float]:
        """``{"pass@k": value}`` over every problem (the ``all`` row)."""
        return self.by_source[-1].to_dict()["pass_at_k"] if self.by_source else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "ks": self.ks,
            "num_problems": len(self.problems),
            "pass_at_1": self.pass_at_1,
            "overall": self.overall,
            "by_source": [row.to_dict() for row in self.by_source],
            "by_difficulty": [row.to_dict() for row in self.by_difficulty],
            "format_rate": self.format_rate,
            "outcomes": self.outcomes,
            "codeforces": None if self.codeforces is None else self.codeforces.to_dict(),
            "problems": self.problems,
            "wall_s": self.wall_s,
        }

    def write(self, path: str) -> str:
        return write_json(path, self.to_dict())

    def format_table(self) -> str:
        lines = [f"verl-pipe eval: {_describe(self.settings)}"]
        if self.by_source:
            header = f"{'group':<32}{'problems':>9}{'samples':>9}" + "".join(f"{f'pass@{k}':>9}" for k in self.ks)
            lines += ["", header, "-" * len(header)]
            for title, rows in (("by source", self.by_source), ("by difficulty", self.by_difficulty)):
                lines.append(title)
                lines += [_format_row(row, self.ks) for row in rows]
            counts = ", ".join(f"{name} {n}" for name, n in sorted(self.outcomes.items()))
            lines += ["", f"pass@1 (mean over samples): {self.pass_at_1:.4f}   format rate: {self.format_rate:.3f}",
                      f"outcomes: {counts}"]  # fmt: skip
        if self.codeforces is not None:
            cf = self.codeforces
            clamped = sum(c.clamped for c in cf.per_contest)
            note = f" ({clamped} at the search bracket's end)" if clamped else ""
            lines += ["", f"Codeforces rating (CodeElo method): {cf.rating:.0f}, percentile {cf.percentile:.1f}% "
                          f"over {len(cf.per_contest)} contests{note}"]  # fmt: skip
        lines.append(f"wall time: {self.wall_s:.1f} s")
        return "\n".join(lines)


def build_report(
    problems: Sequence[EvalProblem],
    scores: Mapping[str, list[dict[str, Any]]],
    ks: Sequence[int],
    settings: dict[str, Any],
) -> EvalReport:
    """Tables from ``scores``: problem_id -> one ``compute_score`` result per sample, in sample order."""
    records = [p.result_record([bool(s["passed"]) for s in scores[p.problem_id]]) for p in problems]
    samples = [s for p in problems for s in scores[p.problem_id]]
    ks = sorted(set(ks))
    return EvalReport(
        settings=settings,
        ks=ks,
        pass_at_1=pass_at_1(records),
        by_source=by_source(records, ks),
        by_difficulty=by_difficulty(records, ks),
        format_rate=sum(bool(s["format_ok"]) for s in samples) / len(samples),
        outcomes=dict(Counter(str(s["outcome"]) for s in samples)),
        problems=[{**r, "n": len(r["correct"]), "correct": sum(r["correct"])} for r in records],
    )


def _format_row(row: PassAtKRow, ks: Sequence[int]) -> str:
    return f"  {row.group:<30}{row.num_problems:>9}{row.num_samples:>9}" + "".join(
        f"{row.pass_at_k[k]:>9.4f}" for k in ks
    )


def _describe(settings: Mapping[str, Any]) -> str:
    parts = [f"dataset {settings.get('dataset')}"]
    if settings.get("model"):
        parts.append(f"model {settings['model']} ({settings.get('samples')} samples, {settings.get('max_tokens')} "
                     f"tokens, T={settings.get('temperature')})")  # fmt: skip
    if settings.get("generations"):
        parts.append(f"generations {settings['generations']}")
    if settings.get("lcb_window"):
        parts.append(f"LiveCodeBench window {settings['lcb_window']}")
    return ", ".join(parts)
