"""Curate coding problems the way DeepCoder's training set was built, and account for every problem dropped.

Training problems pass these stages in order (cheap ones first, so the sandbox only runs what can survive):

1. ``malformed_tests``: the grader cannot parse the tests for the problem's source.
2. ``too_few_tests``: fewer than ``min_tests`` tests (DeepCoder: 5; fewer invite reward hacking).
3. ``contaminated``: the statement matches a test-set statement (exact, or near at ``contamination_similarity``).
4. ``no_reference_solution``: nothing to verify with; dropped unless ``keep_unverified`` (then kept and listed).
5. ``reference_failed`` / ``sandbox_error``: the reference solution does not pass *every* test in the sandbox
   (``sandbox_error``: the sandbox itself failed twice; rerun to retry those).
6. ``duplicate`` / ``near_duplicate``: the statement matches one already kept. Survivors are visited best
   first (verified, then most tests, then ``source_priority``, then id), so the copy kept is the strongest.
   A near (not exact) match is vetoed when both problems have a test with the same input and a different
   expected output: they read alike but are different tasks ("print the largest" vs "the smallest").
   Contamination gets no such veto: problems with several valid answers can disagree on outputs, and a leak
   costs more than a lost training problem.

Test-set problems are only checked for stage 1; they are the reference the training set is checked against.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from verl_pipe.reports import write_json

from .convert import parse_suite
from .near_dup import Fingerprint, NearDuplicateIndex
from .schema import CodeProblem, DataError
from .verify import VerifyConfig, verify_all

DROP_REASONS: dict[str, str] = {
    "malformed_tests": "the grader cannot parse the tests for this source",
    "too_few_tests": "fewer tests than --min-tests",
    "contaminated": "statement matches a test-set problem",
    "no_reference_solution": "no reference solution to verify with (--keep-unverified keeps these)",
    "reference_failed": "the reference solution fails a test in the sandbox",
    "sandbox_error": "the sandbox failed while verifying (infrastructure; rerun)",
    "duplicate": "same normalised statement as a kept problem",
    "near_duplicate": "statement nearly identical to a kept problem",
}


@dataclass(frozen=True)
class CurateConfig:
    min_tests: int = 5
    keep_unverified: bool = False
    dedup_similarity: float = 0.8
    contamination_similarity: float = 0.7  # lower than dedup: a missed leak costs more than a lost problem
    shingle_chars: int = 8
    num_perm: int = 128
    source_priority: tuple[str, ...] = ("lcbv5", "taco", "primeintellect")
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.min_tests < 1:
            raise DataError(f"--min-tests must be >= 1, got {self.min_tests}")
        for name in ("dedup_similarity", "contamination_similarity"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise DataError(f"--{name.replace('_', '-')} must be in (0, 1], got {getattr(self, name)}")


@dataclass(frozen=True)
class Drop:
    problem_id: str
    source: str  # "<config>/<split>"
    reason: str  # a key of DROP_REASONS
    detail: str = ""
    matched_id: str = ""  # the kept or test-set problem it duplicates
    similarity: float | None = None


@dataclass
class SourceCounts:
    input: int = 0
    kept: int = 0
    kept_unverified: int = 0
    dropped: dict[str, int] = field(default_factory=dict)


@dataclass
class CurationReport:
    settings: dict[str, Any]
    sources: dict[str, SourceCounts]
    dropped: list[Drop]
    kept_unverified: list[str]

    def to_dict(self) -> dict[str, Any]:
        totals = SourceCounts()
        for counts in self.sources.values():
            totals.input += counts.input
            totals.kept += counts.kept
            totals.kept_unverified += counts.kept_unverified
            for reason, n in counts.dropped.items():
                totals.dropped[reason] = totals.dropped.get(reason, 0) + n
        return {
            "settings": self.settings,
            "reasons": DROP_REASONS,
            "totals": asdict(totals),
            "sources": {key: asdict(counts) for key, counts in self.sources.items()},
            "dropped": [asdict(d) for d in self.dropped],
            "kept_unverified": self.kept_unverified,
        }

    def write(self, path: str) -> str:
        return write_json(path, self.to_dict())

    def summary(self) -> str:
        """A fixed-width table: one line per source, one column per reason that occurred."""
        data = self.to_dict()
        reasons = [r for r in DROP_REASONS if data["totals"]["dropped"].get(r)]
        rows = [("source", "in", "kept", "unverified", *reasons)]
        for key, counts in [*data["sources"].items(), ("total", data["totals"])]:
            rows.append((key, counts["input"], counts["kept"], counts["kept_unverified"],
                         *(counts["dropped"].get(r, 0) for r in reasons)))  # fmt: skip
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(row, widths)))
                 for row in rows]  # fmt: skip
        total = data["totals"]
        lines.insert(0, f"curation: {total['input']} problems in, {total['kept']} kept, "
                        f"{total['input'] - total['kept']} dropped")  # fmt: skip
        if total["dropped"].get("no_reference_solution") and not total["kept"]:
            lines.append("hint: no problem had a reference solution; add a reference_solution column, pass "
                         "--solutions FILE, or --keep-unverified")  # fmt: skip
        return "\n".join(lines)


@dataclass
class CurationResult:
    kept: list[CodeProblem]
    report: CurationReport


def _digest(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def _lines(text: str) -> str:
    return "\n".join(line.strip() for line in str(text).strip().split("\n"))


def _answers(problem: CodeProblem) -> tuple[int, str, dict[str, str]]:
    """(test count, func_name, input digest -> expected-output digest) from the grader's parse."""
    suite = parse_suite(problem)
    answers = {}
    for test in suite.tests:
        if suite.mode == "stdin":
            answers["s" + _digest(_lines(test.stdin))] = _digest(_lines(test.expected))
        elif suite.mode == "functional":
            expected = test.expected
            if test.accept_unwrapped and isinstance(expected, list) and len(expected) == 1:
                expected = expected[0]  # TACO wraps return values; compare the value itself
            answers["f" + _digest(test.args)] = _digest(expected)
    return suite.tests_total, suite.func_name, answers


def _conflict(a: dict[str, str], b: dict[str, str]) -> bool:
    return any(b.get(key, value) != value for key, value in a.items())


def curate(problems: list[CodeProblem], cfg: CurateConfig) -> CurationResult:
    """Run every stage over ``problems`` (train and test splits together); see the module docstring."""
    from tqdm import tqdm

    drops: dict[str, Drop] = {}

    def drop(p: CodeProblem, reason: str, detail: str = "", matched: str = "", similarity: float | None = None):
        drops[p.problem_id] = Drop(p.problem_id, p.key, reason, detail, matched, similarity)

    def alive(items: list[CodeProblem]) -> list[CodeProblem]:
        return [p for p in items if p.problem_id not in drops]

    train = [p for p in problems if p.split == "train"]
    test = [p for p in problems if p.split != "train"]

    info: dict[str, tuple[int, str, dict[str, str]]] = {}
    for p in tqdm(problems, desc="parsing tests", unit="problem", disable=not cfg.progress):
        try:
            info[p.problem_id] = _answers(p)
        except DataError as error:
            drop(p, "malformed_tests", str(error))
    for p in alive(train):
        if info[p.problem_id][0] < cfg.min_tests:
            drop(p, "too_few_tests", f"{info[p.problem_id][0]} tests, need {cfg.min_tests}")

    index_args = {"shingle_chars": cfg.shingle_chars, "num_perm": cfg.num_perm}
    leaks = NearDuplicateIndex(threshold=cfg.contamination_similarity, **index_args)
    # A fingerprint depends only on (shingle_chars, num_perm, seed), never on the threshold, so the dedup index
    # below reuses these.
    fingerprints: dict[str, Fingerprint] = {}
    # Every test statement counts, even one with broken tests: a leak is about the text.
    for p in tqdm([*test, *alive(train)], desc="fingerprinting", unit="problem", disable=not cfg.progress):
        fingerprints[p.problem_id] = leaks.fingerprint(p.problem)
    for p in test:
        leaks.add(p.problem_id, fingerprints[p.problem_id])
    for p in alive(train):
        match = leaks.query(fingerprints[p.problem_id])
        if match is not None:
            drop(p, "contaminated", "exact" if match.exact else "near", match.item_id, match.similarity)

    unverified = [p.problem_id for p in alive(train) if not p.reference_solution.strip()]
    for p in alive(train):
        if not p.reference_solution.strip() and not cfg.keep_unverified:
            drop(p, "no_reference_solution")
    to_verify = [p for p in alive(train) if p.reference_solution.strip()]
    verdicts = verify_all(to_verify, {pid: v[1] for pid, v in info.items()}, cfg.verify, progress=cfg.progress)
    for p in to_verify:
        verdict = verdicts[p.problem_id]
        if verdict.sandbox_error:
            drop(p, "sandbox_error", f"on test {verdict.tests_run} of {verdict.tests_total}")
        elif not verdict.passed:
            drop(p, "reference_failed", f"{verdict.outcome} on test {verdict.tests_run} of {verdict.tests_total}")

    unverified_set = set(unverified)
    priority = {config: i for i, config in enumerate(cfg.source_priority)}
    ordered = sorted(alive(train), key=lambda p: (p.problem_id in unverified_set, -info[p.problem_id][0],
                                                  priority.get(p.config, len(priority)), p.problem_id))  # fmt: skip
    kept_index = NearDuplicateIndex(threshold=cfg.dedup_similarity, **index_args)
    for p in ordered:
        fp = fingerprints[p.problem_id]
        for match in kept_index.matches(fp):
            if match.exact or not _conflict(info[p.problem_id][2], info[match.item_id][2]):
                drop(p, "duplicate" if match.exact else "near_duplicate", "", match.item_id, match.similarity)
                break
        else:
            kept_index.add(p.problem_id, fp)

    kept = alive(problems)
    settings = {**asdict(cfg), "lsh_bands_rows": {"dedup": [kept_index.bands, kept_index.rows],
                                                  "contamination": [leaks.bands, leaks.rows]}}  # fmt: skip
    report = _report(problems, kept, drops, [pid for pid in unverified if pid not in drops], settings)
    return CurationResult(kept, report)


def _report(problems: list[CodeProblem], kept: list[CodeProblem], drops: dict[str, Drop], unverified: list[str],
            settings: dict[str, Any]) -> CurationReport:  # fmt: skip
    sources: dict[str, SourceCounts] = {}
    for p in problems:
        sources.setdefault(p.key, SourceCounts()).input += 1
    for p in kept:
        sources[p.key].kept += 1
    key_of = {p.problem_id: p.key for p in problems}
    for pid in unverified:
        sources[key_of[pid]].kept_unverified += 1
    by_source = Counter((d.source, d.reason) for d in drops.values())
    for (source, reason), n in sorted(by_source.items()):
        sources[source].dropped[reason] = n
    for key, counts in sources.items():
        # Every input problem is either kept or listed as dropped: nothing disappears unaccounted for.
        if counts.input != counts.kept + sum(counts.dropped.values()):
            raise AssertionError(f"curation lost problems from {key}: {counts}")
    order = {p.problem_id: i for i, p in enumerate(problems)}
    return CurationReport(settings, sources, sorted(drops.values(), key=lambda d: order[d.problem_id]), unverified)


def write_curated(result: CurationResult, out_dir: str, sources: list[tuple[str, str]]) -> list[str]:
    """Kept problems as ``<config>_<split>.jsonl`` in the DeepCoder schema (plus ``problem_id`` and
    ``reference_solution``), one file per input ``(config, split)`` even when empty, so ``verl-pipe data
    prepare --src out_dir`` converts exactly the curated set."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for config, split in sources:
        path = os.path.join(out_dir, f"{config}_{split}.jsonl")
        tmp_path = f"{path}.tmp-{os.getpid()}"
        with open(tmp_path, "w", encoding="utf-8") as handle:
            for p in result.kept:
                if (p.config, p.split) == (config, split):
                    handle.write(json.dumps(p.to_row()) + "\n")
        os.replace(tmp_path, path)
        paths.append(path)
    return paths
