"""A model's Codeforces rating, estimated the CodeElo way, as DeepCoder reports it.

Method (the DeepCoder / rLLM thesis, Appendix A "Codeforces Evaluation", which follows CodeElo, Quan et al.
2025, https://arxiv.org/abs/2501.01257), contest by contest:

1. **Score** the model's ordered attempts per problem as Codeforces does (:func:`score_contest`): a problem
   worth ``k`` points keeps ``k - 50`` per earlier failed attempt, never below 0; in contests without point
   values (ICPC-style rounds) a solve is worth 1 and each earlier failed attempt adds 10 penalty.
2. **Place** the model among the contest's rated human participants (:func:`model_rank_in_contest`).
3. **Invert Elo** (:func:`rating_for_rank`): find the rating ``r`` whose expected place among those humans,
   ``1 + sum_i 1 / (1 + 10^((r - r_i) / 400))``, equals the model's place. Contests are independent: no
   rating carries over from one to the next.

The estimate is the mean over contests (:func:`estimate_rating`); its percentile is the share of 2024's active
Codeforces users rated below it (:func:`percentile`, data in ``codeforces_ratings_2024.json``).

Where this differs from its sources:

* The seed's Appendix A writes the expected rank as ``m = sum_i 1 / (1 + 10^((r - r_i)/400))``, without the
  ``1 +``. Read with ``m`` counting the humans expected to finish *ahead* of the model, that is the same
  equation as ours with a 1-based place, which is Codeforces' own "seed" (expected place) of the multi-player
  Elo the appendix says it mirrors. We take 1-based places because standings are 1-based.
* The CodeElo script (QwenLM/CodeElo ``calc_rating.py``, also used by rllm's DeepCoder evaluation) equates
  ``1 + sum`` with the number of humans ranked ahead, i.e. with a place one better than the 1-based one. That
  moves a rating only when the model finishes near the top of a contest; we do not copy it.
* We keep that script's conventions elsewhere: humans tied with the model (same points and penalty) count as
  ahead of it, the search is bracketed by ``[0, highest participant rating + 100]`` (a model that beats or
  loses to everyone gets the bracket's end, flagged ``clamped``), and submission time is ignored (no
  per-minute decay of points, no time term in the penalty). We bisect to 0.01 rating points instead of 1.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DATA_FILE = Path(__file__).with_name("codeforces_ratings_2024.json")
DEFAULT_LOWER = 0.0  # CodeElo's bracket: ratings below 0 are reported as 0
UPPER_MARGIN = 100.0  # and above the strongest participant by at most this much
_LN10_OVER_800 = math.log(10.0) / 800.0


@dataclass(frozen=True)
class ContestScore:
    """A contestant's standing: points (higher is better), then penalty (lower is better)."""

    points: float
    penalty: float = 0.0


@dataclass(frozen=True)
class Participant:
    """A rated human in one contest: final standing and rating before the contest."""

    points: float
    penalty: float
    rating: float


@dataclass(frozen=True)
class ContestResult:
    """The model's 1-based place in one contest and the pre-contest ratings of the humans it was ranked among."""

    contest_id: str
    rank: float
    participant_ratings: tuple[float, ...]

    @classmethod
    def from_standings(cls, contest_id: str, model: ContestScore, participants: Sequence[Participant]) -> ContestResult:
        ranks_against = [ContestScore(p.points, p.penalty) for p in participants]
        return cls(str(contest_id), model_rank_in_contest(model, ranks_against), tuple(p.rating for p in participants))


@dataclass(frozen=True)
class ContestRating:
    contest_id: str
    rank: float
    num_participants: int
    rating: float
    clamped: bool  # the model beat (or lost to) everyone, so the rating is the bracket's end, not a solution


@dataclass(frozen=True)
class RatingEstimate:
    rating: float  # mean of the per-contest ratings
    percentile: float  # share (in %) of 2024's active users rated strictly below ``rating``
    per_contest: tuple[ContestRating, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def expected_rank(rating: float, participant_ratings: Sequence[float] | np.ndarray) -> float:
    """Elo expected 1-based place of a contestant rated ``rating`` among the given participants.

    >>> expected_rank(1500.0, [1500.0, 1500.0])  # each opponent finishes ahead with probability 1/2
    2.0
    """
    ratings = _ratings(participant_ratings)
    _check_finite(rating, "rating")
    # 1 / (1 + 10^x) == (1 - tanh(x ln10 / 2)) / 2, which cannot overflow for large rating gaps.
    return float(1.0 + 0.5 * np.sum(1.0 - np.tanh((rating - ratings) * _LN10_OVER_800)))


def rating_for_rank(
    rank: float,
    participant_ratings: Sequence[float] | np.ndarray,
    tol: float = 0.01,
    lower: float | None = None,
    upper: float | None = None,
) -> float:
    """The rating whose :func:`expected_rank` equals ``rank``, to within ``tol`` rating points.

    Found by bisection in ``[lower, upper]`` (default ``[0, max(participant_ratings) + 100]``); a rank outside
    what that bracket can produce returns the nearer end.
    """
    return _solve(rank, _ratings(participant_ratings), tol, lower, upper)[0]


def score_contest(
    attempts: Mapping[str, Sequence[bool]],
    problem_points: Mapping[str, float | None] | None = None,
    *,
    deduction_per_wrong: float = 50.0,
    penalty_per_wrong: float = 10.0,
) -> ContestScore:
    """Score the model's ordered attempts (``True`` = accepted) at each problem of one contest.

    ``problem_points`` maps each problem to its point value, or to ``None`` for ICPC-style scoring; leave it out
    for a contest without point values. Attempts after the first accepted one are never submitted.

    >>> score_contest({"A": [False, True], "B": [False, False]}, {"A": 500, "B": 1000})
    ContestScore(points=450.0, penalty=0.0)
    >>> score_contest({"A": [False, False, True], "B": [True]})
    ContestScore(points=2.0, penalty=20.0)
    """
    points = penalty = 0.0
    for problem, tries in attempts.items():
        first_ok = next((i for i, ok in enumerate(tries) if ok), None)
        if first_ok is None:
            continue
        if problem_points is not None and problem not in problem_points:
            raise ValueError(f"problem {problem!r} has attempts but no entry in problem_points")
        value = None if problem_points is None else problem_points[problem]
        if value is None:
            points += 1.0
            penalty += penalty_per_wrong * first_ok
        else:
            _check_finite(value, f"points of problem {problem!r}")
            points += max(0.0, float(value) - deduction_per_wrong * first_ok)
    return ContestScore(points, penalty)


def model_rank_in_contest(
    model: ContestScore, participants: Sequence[ContestScore | Participant | tuple[float, float]]
) -> int:
    """1-based place of the model: 1 + the humans with more points, or equal points and no more penalty.

    >>> model_rank_in_contest(ContestScore(2, 30), [(3, 90), (2, 10), (2, 30), (2, 40), (1, 0)])
    4
    """
    if len(participants) == 0:
        raise ValueError("contest has no participants to rank the model against")
    _check_finite(model.points, "model points")
    _check_finite(model.penalty, "model penalty")
    ahead = 0
    for i, p in enumerate(participants):
        pts, pen = (p.points, p.penalty) if hasattr(p, "points") else p
        _check_finite(pts, f"points of participant {i}")
        _check_finite(pen, f"penalty of participant {i}")
        # Ties go against the model, as in the CodeElo script.
        ahead += pts > model.points or (pts == model.points and pen <= model.penalty)
    return 1 + ahead


def estimate_rating(
    contests: Sequence[ContestResult],
    tol: float = 0.01,
    lower: float | None = None,
    upper: float | None = None,
    distribution: RatingDistribution | None = None,
) -> RatingEstimate:
    """Per-contest ratings, their mean, and the mean's percentile among 2024's active Codeforces users."""
    if len(contests) == 0:
        raise ValueError("no contests to estimate a rating from")
    per_contest = []
    for contest in contests:
        ratings = _ratings(contest.participant_ratings, where=f"contest {contest.contest_id!r}")
        rating, clamped = _solve(contest.rank, ratings, tol, lower, upper, where=f"contest {contest.contest_id!r}")
        per_contest.append(ContestRating(contest.contest_id, contest.rank, len(ratings), rating, clamped))
    mean = float(np.mean([c.rating for c in per_contest]))
    return RatingEstimate(mean, percentile(mean, distribution), tuple(per_contest))


@dataclass(frozen=True, eq=False)
class RatingDistribution:
    """A rating histogram: sorted distinct ratings and how many users hold each rating or less."""

    ratings: np.ndarray
    cumulative: np.ndarray
    description: str = ""

    @classmethod
    def from_counts(cls, counts: Mapping[str | float, int], description: str = "") -> RatingDistribution:
        if not counts:
            raise ValueError("rating distribution is empty")
        pairs = sorted((float(r), int(n)) for r, n in counts.items())
        if any(n < 0 for _, n in pairs) or not all(math.isfinite(r) for r, _ in pairs):
            raise ValueError("rating distribution needs finite ratings and non-negative counts")
        ratings = np.array([r for r, _ in pairs])
        cumulative = np.cumsum([n for _, n in pairs])
        if cumulative[-1] == 0:
            raise ValueError("rating distribution counts no users")
        return cls(ratings, cumulative, description)

    @property
    def n_users(self) -> int:
        return int(self.cumulative[-1])

    def percentile(self, rating: float) -> float:
        """Share (in %) of users rated strictly below ``rating`` (``bisect_left``, as CodeElo and rllm count)."""
        _check_finite(rating, "rating")
        idx = int(np.searchsorted(self.ratings, rating, side="left"))
        below = 0 if idx == 0 else int(self.cumulative[idx - 1])
        return 100.0 * below / self.n_users


@functools.lru_cache(maxsize=4)
def load_rating_distribution(path: str | Path = DATA_FILE) -> RatingDistribution:
    """The histogram shipped with this module (provenance in the file's ``source`` field)."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    dist = RatingDistribution.from_counts(doc["counts"], doc.get("description", ""))
    if "n_users" in doc and doc["n_users"] != dist.n_users:
        raise ValueError(f"{path}: n_users says {doc['n_users']} but the counts add up to {dist.n_users}")
    return dist


def percentile(rating: float, distribution: RatingDistribution | None = None) -> float:
    """Share (in %) of rated users below ``rating``; default: 2024's 89,352 active Codeforces users."""
    return (distribution or load_rating_distribution()).percentile(rating)


def _solve(
    rank: float,
    ratings: np.ndarray,
    tol: float,
    lower: float | None,
    upper: float | None,
    where: str = "contest",
) -> tuple[float, bool]:
    n = len(ratings)
    _check_finite(rank, f"{where}: rank")
    if not 1 <= rank <= n + 1:
        raise ValueError(f"{where}: rank {rank} is outside [1, {n + 1}], the places possible among {n} participants")
    if not (isinstance(tol, (int, float)) and tol > 0):
        raise ValueError(f"tol must be a positive number of rating points, got {tol!r}")
    lo = DEFAULT_LOWER if lower is None else float(lower)
    hi = float(ratings.max()) + UPPER_MARGIN if upper is None else float(upper)
    if not lo < hi:
        raise ValueError(f"{where}: search bracket [{lo}, {hi}] is empty; pass lower < upper")
    # expected_rank falls as the rating rises, so a place outside [expected(hi), expected(lo)] has no root inside.
    at_lo, at_hi = expected_rank(lo, ratings), expected_rank(hi, ratings)
    if at_lo <= rank:
        return lo, at_lo < rank
    if at_hi >= rank:
        return hi, at_hi > rank
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if expected_rank(mid, ratings) > rank:  # expected to place worse than it did: it is stronger than mid
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi), False


def _ratings(values: Sequence[float] | np.ndarray, where: str = "contest") -> np.ndarray:
    ratings = np.asarray(values, dtype=float)
    if ratings.ndim != 1 or ratings.size == 0:
        raise ValueError(f"{where}: participant_ratings must be a non-empty 1-D sequence, got shape {ratings.shape}")
    if not np.all(np.isfinite(ratings)):
        raise ValueError(f"{where}: participant_ratings contains NaN or infinite values")
    return ratings


def _check_finite(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
