"""The usage examples in the reward modules' docstrings run and stay true."""

import doctest

import pytest

import verl_pipe.reward_score as reward_score
from verl_pipe.reward_score import extract, grading, prelude
from verl_pipe.reward_manager import metrics as reward_metrics


@pytest.mark.parametrize("module", [reward_score, extract, grading, prelude, reward_metrics], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    failures, attempted = doctest.testmod(module, verbose=False)
    assert failures == 0
    if module is reward_score:
        assert attempted > 0
