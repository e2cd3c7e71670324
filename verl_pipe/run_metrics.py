"""Per-step training summaries built from what verl already writes.

verl's ``file`` logger writes one JSON line of metrics per step (``VERL_FILE_LOGGER_PATH``), and
``trainer.rollout_data_dir`` dumps each step's generations with their scores. From those two we derive the
numbers a person watching a code-RL run wants per step: reward mean, pass rate, format rate (a fenced python
block was found), response length and per-phase times. The summaries go to ``metrics.jsonl``, one line a step.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Optional

from verl_pipe.reward_score.extract import extract_last_python_block

WILSON_Z = 1.959964  # the two-sided 95% quantile of the normal

# verl metric key -> our short name, in the order a synchronous step runs them. Phases appear only when the
# trainer ran them.
PHASE_KEYS = {
    "timing_s/gen": "gen",
    "timing_s/reward": "reward",
    "timing_s/old_log_prob": "old_log_prob",
    "timing_s/ref": "ref",
    "timing_s/values": "values",
    "timing_s/adv": "adv",
    "timing_s/update_critic": "update_critic",
    "timing_s/update_actor": "update_actor",
    "timing_s/update_weights": "update_weights",
    "timing_s/testing": "validate",
    "timing_s/step": "step",
}


@dataclass
class StepSummary:
    step: int
    reward_mean: float
    pass_rate: Optional[float]
    format_rate: Optional[float]
    response_length_mean: float
    response_clip_ratio: float
    # Greedy pass rate on the validation split, on steps where verl validated.
    val_pass_rate: Optional[float] = None
    phases_s: dict[str, float] = field(default_factory=dict)
    verl: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        def pct(value: Optional[float]) -> str:
            return "  n/a" if value is None else f"{100 * value:4.0f}%"

        phases = " ".join(f"{name}={secs:.1f}s" for name, secs in self.phases_s.items() if name != "step")
        val = "" if self.val_pass_rate is None else f" | val pass {pct(self.val_pass_rate)} (greedy)"
        return (
            f"step {self.step:3d} | reward {self.reward_mean:+.3f} | pass {pct(self.pass_rate)} | "
            f"format {pct(self.format_rate)} | resp_len {self.response_length_mean:6.1f} | "
            f"step {self.phases_s.get('step', float('nan')):.1f}s ({phases}){val}"
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def read_rollout_dump(path: str) -> tuple[Optional[float], Optional[float]]:
    """Pass rate (score == 1) and format rate (a python block was found) of one step's dumped generations."""
    if not os.path.exists(path):
        return None, None
    scores, formatted = [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            scores.append(float(row["score"]))
            formatted.append(extract_last_python_block(row["output"]) is not None)
    if not scores:
        return None, None
    return sum(s >= 1.0 for s in scores) / len(scores), sum(formatted) / len(formatted)


def validation_pass_rate(verl_metrics: dict) -> Optional[float]:
    """Mean of the reward's ``passed`` field over validation samples (verl: ``val-aux/<source>/passed/mean@1``)."""
    values = [float(v) for k, v in verl_metrics.items() if k.startswith("val-aux/") and k.endswith("/passed/mean@1")]
    return sum(values) / len(values) if values else None


def wilson_interval(successes: int, n: int, z: float = WILSON_Z) -> tuple[float, float]:
    """The Wilson score interval of a pass rate, ``successes`` of ``n`` (95% by default). Unlike the normal
    approximation it stays inside [0, 1] and does not collapse to a point at 0 or n passes."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Validation:
    """One greedy validation: ``passed`` of ``items`` validation problems solved (step 0: before training)."""

    step: int
    passed: int
    items: int

    @property
    def accuracy(self) -> float:
        return self.passed / self.items

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.passed, self.items)

    def line(self) -> str:
        low, high = self.interval
        return f"{100 * self.accuracy:.1f}% [{100 * low:.1f}, {100 * high:.1f}] ({self.passed}/{self.items})"


def learning_verdict(before: Validation, after: Validation) -> str:
    """One line on what two validations show: the change, how wide each 95% interval is, whether they are apart."""
    low_before, high_before = before.interval
    low_after, high_after = after.interval
    change = 100 * (after.accuracy - before.accuracy)
    if low_after > high_before:
        verdict = "the 95% intervals are apart: it learned"
    elif high_after < low_before:
        verdict = "the 95% intervals are apart: it got worse"
    else:
        verdict = "the 95% intervals overlap: this run cannot tell a change from noise"
    return (
        f"{change:+.1f} points from step {before.step} to step {after.step}, on intervals "
        f"{100 * (high_before - low_before):.1f} and {100 * (high_after - low_after):.1f} points wide "
        f"({before.items} problems); {verdict}"
    )


def validations_from_verl_log(path: str, items: int) -> list[Validation]:
    """Every validation in verl's file-logger output (``val_before_train`` as step 0), as passed counts of the
    ``items`` validation problems, by step."""
    found: dict[int, Validation] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            record = json.loads(line)
            rate = validation_pass_rate(record["data"])
            if rate is not None:
                found[int(record["step"])] = Validation(int(record["step"]), round(rate * items), items)
    return [found[step] for step in sorted(found)]


def summarize_step(step: int, verl_metrics: dict, rollout_dump: Optional[str]) -> StepSummary:
    pass_rate, format_rate = read_rollout_dump(rollout_dump) if rollout_dump else (None, None)
    phases = {short: float(verl_metrics[key]) for key, short in PHASE_KEYS.items() if key in verl_metrics}
    return StepSummary(
        step=step,
        reward_mean=float(verl_metrics.get("critic/score/mean", float("nan"))),
        pass_rate=pass_rate,
        format_rate=format_rate,
        response_length_mean=float(verl_metrics.get("response_length/mean", float("nan"))),
        response_clip_ratio=float(verl_metrics.get("response_length/clip_ratio", float("nan"))),
        val_pass_rate=validation_pass_rate(verl_metrics),
        phases_s=phases,
        verl={k: float(v) for k, v in verl_metrics.items() if isinstance(v, (int, float))},
    )


class VerlMetricsTail:
    """Follows verl's file-logger JSONL as the trainer appends to it; yields (step, metrics) once per line."""

    def __init__(self, path: str):
        self.path = path
        self._offset = 0
        self._partial = ""

    def poll(self) -> list[tuple[int, dict]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
            self._offset = fh.tell()
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next poll
        records = []
        for line in lines:
            if line.strip():
                row = json.loads(line)
                records.append((int(row["step"]), row["data"]))
        return records


def load_summaries(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
