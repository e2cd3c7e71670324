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
