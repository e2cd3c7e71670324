"""The policy gets better, in every trainer mode, and gets worse when its advantages are negated.

Each run (:mod:`conftest`'s ``learning_run``) is verl's stock entrypoint on the CPU backend with the tiny random
Qwen2, a task it can learn in a few steps (:mod:`learning_task`: the share of vowels in the answer), verl's GRPO,
fixed seeds. A mode learns when the mean score of its last steps exceeds that of its first steps by ``MARGIN``.
The negative control is the same run with every reward negated, which negates every GRPO advantage: a trainer that
trains on what it is given then pushes the vowel share *down*, so the same check must fail on it. A pipeline that
paired responses with the wrong rewards, trained on stale or shuffled advantages, or pushed the policy the wrong
way would fail here, while the weight-sync and log-prob tests could still pass.

The control runs for ``in_flight_pipeline`` (the mode whose samples mix policy versions token by token) and shows
the check can fail. What it shows carries to the other modes through what they share and what is checked of each:
every mode's trained samples are checked to carry their own response's reward (a mode that mis-paired them fails
that check); from those pairs the advantages and the update are verl's same GRPO and actor code in every mode;
what differs between modes is which samples, of which version, reach the update, and each mode's end-to-end test
pins that (staleness exactly one, pi_old frozen, lag bounds). A control run per mode would cost another minute
each of the suite's budget; measured when each mode landed, they all unlearned (figures below).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learning_task import vowel_share  # noqa: E402

MODES = ("sync", "separate_async", "one_off_pipeline", "minibatch_pipeline", "in_flight_pipeline")
CONTROLLED = ("in_flight_pipeline",)
WINDOW = 2  # steps averaged at each end
# Measured here (lr 5e-2, 4 prompts x 8 samples, seed 7): the improvement was +0.14 (sync), +0.08 and +0.10
# (separate_async, two runs), +0.09 (one_off_pipeline), +0.16 (minibatch_pipeline); with negated rewards
# -0.17, -0.05 / -0.08, -0.08, -0.17. The margin sits well inside the gap, with room for sampling noise (the
# separate-pool modes are not bitwise reproducible: their schedules depend on timing). Three runs each of the two
# modes whose schedules vary most with timing, measured later: separate_async +0.10 / +0.12 / +0.13,
# in_flight_pipeline +0.14 / +0.14 / +0.14 (with 16 samples per prompt: +0.13..+0.18 and +0.11..+0.19, at 1.3x the
# time per run, so the suite keeps 8).
MARGIN = 0.04
# One separate_async run in about six has come out at +0.04 (0.0395): its schedule depends on timing. A gain between 0
# and MARGIN is therefore not a verdict: a second run on another seed decides, and the mean of the two gains must
# reach MARGIN. A mode that trains the wrong way fails at once (its gain is negative, as every control's is), and one
# that does not learn at all fails the mean; only an ambiguous first run costs the second (about a minute).
SECOND_SEED = 8

pytestmark = pytest.mark.timeout(900)


def improvement(scores: list[float]) -> float:
    """Mean score of the last WINDOW steps minus that of the first WINDOW steps."""
    return sum(scores[-WINDOW:]) / WINDOW - sum(scores[:WINDOW]) / WINDOW


def learned(scores: list[float]) -> bool:
    # the fixture has checked that every step of the run reported a score
    return len(scores) >= 2 * WINDOW and improvement(scores) >= MARGIN


def learned_in_one_or_two_runs(first: list[float], second_run) -> tuple[bool, str]:
    """(verdict, evidence): the first run decides unless its gain is ambiguous (in [0, MARGIN)); then the mean gain
    of it and a second run on another seed must reach MARGIN."""
    if learned(first) or improvement(first) < 0:
        return learned(first), f"vowel share per step {first}"
    second = second_run()
    gains = (improvement(first), improvement(second))
    return sum(gains) / 2 >= MARGIN, f"vowel share per step {first}, then on seed {SECOND_SEED} {second}"


def test_the_second_run_decides_only_an_ambiguous_first():
    """The rule itself, on made-up scores: a clear gain or a loss needs no second run; an ambiguous one is decided
    by the mean (a mode that does not learn stays below MARGIN)."""

    def never():
        raise AssertionError("a clear first run needs no second")

    assert learned_in_one_or_two_runs([0.1, 0.1, 0.2, 0.2], never)[0]
    assert not learned_in_one_or_two_runs([0.2, 0.2, 0.1, 0.1], never)[0]
    assert learned_in_one_or_two_runs([0.1, 0.1, 0.12, 0.12], lambda: [0.1, 0.1, 0.2, 0.2])[0]
    assert not learned_in_one_or_two_runs([0.1, 0.1, 0.12, 0.12], lambda: [0.1, 0.1, 0.11, 0.11])[0]


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_learns(learning_run, mode):
    run = learning_run(mode)
    verdict, evidence = learned_in_one_or_two_runs(run.scores, lambda: learning_run(mode, seed=SECOND_SEED).scores)
    assert verdict, f"{mode} did not learn: {evidence}"
    # What the mode trained on carries its own reward: every sample verl dumped as trained at a step has the score
    # of its own response (recomputed here from the text), so no mode pairs responses with another's rewards.
    for step, samples in run.trained.items():
        assert len(samples) == 4 * 8, f"{mode} step {step}: {len(samples)} trained samples"
        mismatched = [(response, reward) for _, response, reward in samples
                      if reward != pytest.approx(vowel_share(response), abs=1e-6)]  # fmt: skip
        assert not mismatched, f"{mode} step {step}: rewards that are not their response's: {mismatched[:3]}"


@pytest.mark.parametrize("mode", CONTROLLED)
def test_negated_advantages_unlearn(learning_run, mode):
    control = learning_run(mode, "negated_vowel_share").scores
    assert not learned(control), f"{mode} 'learned' with negated advantages: vowel share per step {control}"
    assert improvement(control) < 0, f"{mode}: negated advantages should lower the vowel share: {control}"
