"""pass@k over sampled solutions, with per-source, per-difficulty and contest-date breakdowns.

The estimator is the unbiased one of Chen et al. 2021, "Evaluating Large Language Models Trained on Code"
(https://arxiv.org/abs/2107.03374, section 2.1): with ``n`` samples of which ``c`` pass,

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

The product form never builds a binomial, so it stays exact to float precision for any ``n``.

Inputs are :class:`ProblemResult` records or plain dicts such as
``{"problem_id": "lcb/123", "source": "livecodebench", "difficulty": "hard", "n": 8, "correct": 3}``;
``correct`` may also be the list of per-sample booleans (then ``n`` defaults to its length).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

MISSING_GROUP = "<missing>"


@dataclass(frozen=True)
class ProblemResult:
    """How one problem fared: ``correct`` of ``n`` samples passed."""

    problem_id: str
    n: int
    correct: int
    source: str | None = None
    difficulty: str | None = None
    contest_date: dt.date | None = None

    def __post_init__(self) -> None:
        _check_counts(self.n, self.correct, self.problem_id)

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | ProblemResult) -> ProblemResult:
        if isinstance(record, ProblemResult):
            return record
        if "problem_id" not in record:
            raise ValueError(f"record {dict(record)!r} has no 'problem_id'")
        problem_id = str(record["problem_id"])
        correct = record.get("correct")
        if correct is None:
            raise ValueError(f"problem {problem_id!r}: record has no 'correct' (a count or a list of booleans)")
        if isinstance(correct, (list, tuple, np.ndarray)):
            flags = [_as_flag(x, problem_id) for x in correct]
            n = record.get("n", len(flags))
            if n != len(flags):
                raise ValueError(f"problem {problem_id!r}: n={n} but {len(flags)} per-sample results were given")
            correct = sum(flags)
        else:
            if "n" not in record:
                raise ValueError(f"problem {problem_id!r}: 'correct' is a count, so 'n' (samples drawn) is required")
            n = record["n"]
        date = record.get("contest_date")
        return cls(
            problem_id=problem_id,
            n=n,
            correct=correct,
            source=record.get("source"),
            difficulty=record.get("difficulty"),
            contest_date=None if date is None else _as_date(date, problem_id),
        )


@dataclass(frozen=True)
class PassAtKRow:
    """One table row: a group of problems and its mean pass@k for each requested k."""

    group: str
    num_problems: int
    num_samples: int
    pass_at_k: dict[int, float]

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["pass_at_k"] = {f"pass@{k}": v for k, v in self.pass_at_k.items()}  # JSON keys must be strings
        return row


def pass_at_k(n: int, c: int, k: int, *, problem: str = "<unnamed>") -> float:
    """Unbiased pass@k for one problem with ``c`` of ``n`` samples correct.

    >>> round(pass_at_k(5, 2, 1), 12), round(pass_at_k(5, 2, 2), 12)
    (0.4, 0.7)
    """
    _check_counts(n, c, problem)
    if not _is_int(k) or k < 1:
        raise ValueError(f"problem {problem!r}: k must be a positive integer, got {k!r}")
    if k > n:
        raise ValueError(f"problem {problem!r}: k={k} exceeds the n={n} samples drawn; draw at least k samples")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(results: Iterable[Mapping[str, Any] | ProblemResult], k: int) -> float:
    """pass@k averaged over problems (each problem weighs the same, whatever its ``n``)."""
    problems = _normalize(results)
    if not problems:
        raise ValueError("no problems to average over")
    return float(np.mean([pass_at_k(p.n, p.correct, k, problem=p.problem_id) for p in problems]))


def pass_at_1(results: Iterable[Mapping[str, Any] | ProblemResult]) -> float:
    """pass@1 averaged over the ``n`` samples of each problem, then over problems: mean of ``c / n``."""
    problems = _normalize(results)
    if not problems:
        raise ValueError("no problems to average over")
    return float(np.mean([p.correct / p.n for p in problems]))


def breakdown(
    results: Iterable[Mapping[str, Any] | ProblemResult],
    ks: Sequence[int] = (1,),
    by: str | Callable[[ProblemResult], str | None] = "source",
) -> list[PassAtKRow]:
    """One row per group (sorted by name), then an ``"all"`` row; problems with no group go to ``<missing>``.

    ``by`` is a :class:`ProblemResult` field name (``"source"``, ``"difficulty"``) or a function of one.
    Missing groups are kept as a row rather than dropped, so the rows always add up to the whole benchmark.
    """
    problems = _normalize(results)
    if not problems:
        raise ValueError("no problems to break down")
    key = by if callable(by) else _field_getter(by)
    groups: dict[str, list[ProblemResult]] = {}
    for p in problems:
        label = key(p)
        groups.setdefault(MISSING_GROUP if label is None else str(label), []).append(p)
    rows = [_row(name, groups[name], ks) for name in sorted(groups)]
    return rows + [_row("all", problems, ks)]


def by_source(results: Iterable[Mapping[str, Any] | ProblemResult], ks: Sequence[int] = (1,)) -> list[PassAtKRow]:
    return breakdown(results, ks, by="source")


def by_difficulty(
    results: Iterable[Mapping[str, Any] | ProblemResult], ks: Sequence[int] = (1,)
) -> list[PassAtKRow]:
    return breakdown(results, ks, by="difficulty")


def in_date_window(
    results: Iterable[Mapping[str, Any] | ProblemResult],
    start: dt.date | str,
    end: dt.date | str,
) -> list[ProblemResult]:
    """Problems whose ``contest_date`` lies in ``[start, end]`` (both inclusive), as LiveCodeBench windows are.

    Dates compare by calendar day (a datetime's time is dropped). A problem without a date is an error, not a
    silent drop: a missing date would otherwise shrink the benchmark unnoticed.
    """
    lo, hi = _as_date(start, "<window start>"), _as_date(end, "<window end>")
    if lo > hi:
        raise ValueError(f"date window is empty: start {lo} is after end {hi}")
    kept = []
    for p in _normalize(results):
        if p.contest_date is None:
            raise ValueError(f"problem {p.problem_id!r} has no contest_date, so the date window cannot place it")
        if lo <= p.contest_date <= hi:
            kept.append(p)
    return kept


def _row(group: str, problems: list[ProblemResult], ks: Sequence[int]) -> PassAtKRow:
    return PassAtKRow(
        group=group,
        num_problems=len(problems),
        num_samples=sum(p.n for p in problems),
        pass_at_k={int(k): mean_pass_at_k(problems, k) for k in ks},
    )


def _normalize(results: Iterable[Mapping[str, Any] | ProblemResult]) -> list[ProblemResult]:
    problems = [ProblemResult.from_record(r) for r in results]
    seen: set[str] = set()
    for p in problems:
        if p.problem_id in seen:  # a duplicate would count one problem twice in every average
            raise ValueError(f"problem {p.problem_id!r} appears more than once")
        seen.add(p.problem_id)
    return problems


def _field_getter(name: str) -> Callable[[ProblemResult], str | None]:
    if name not in ProblemResult.__dataclass_fields__:
        raise ValueError(f"cannot group by {name!r}: not a ProblemResult field")
    return lambda p: getattr(p, name)


def _check_counts(n: Any, c: Any, problem: str) -> None:
    if not _is_int(n) or n < 1:
        raise ValueError(f"problem {problem!r}: n (samples drawn) must be a positive integer, got {n!r}")
    if not _is_int(c) or c < 0:
        raise ValueError(f"problem {problem!r}: correct must be a non-negative integer, got {c!r}")
    if c > n:
        raise ValueError(f"problem {problem!r}: correct={c} exceeds the n={n} samples drawn")


def _is_int(x: Any) -> bool:
    # bool is an int subclass, but True as a sample count is always a bug upstream.
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _as_flag(x: Any, problem: str) -> bool:
    if isinstance(x, (bool, np.bool_)) or (isinstance(x, (int, float, np.number)) and x in (0, 1)):
        return bool(x)
    raise ValueError(f"problem {problem!r}: per-sample results must be booleans (or 0/1), got {x!r}")


def _as_date(value: Any, problem: str) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).date()
        except ValueError:
            pass
    raise ValueError(f"problem {problem!r}: contest_date {value!r} is not a date or an ISO-8601 string")
