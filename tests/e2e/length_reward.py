"""A test-only reward that varies within every prompt group, so GRPO advantages (and weight updates) are nonzero.

The random tiny model never writes a passing program, so the real code reward would give all-zero groups,
zero advantages and an update that leaves the weights untouched: a weight-sync check would then pass vacuously.
"""

import os
import random

# Set both (through the job's runtime_env) to have filter_probe_score create a file when it scores a given dataset
# row: a test then knows that row's group is being scored, e.g. a refill, and can kill the run right then.
MARK_ROW_ENV, MARK_FILE_ENV = "VERL_PIPE_TEST_MARK_ROW", "VERL_PIPE_TEST_MARK_FILE"


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": (len(solution_str) % 7) / 6.0}


def half_zero_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """About half the responses score 0 (for GRPO+'s overlong_filter=wrong), the rest vary (for nonzero advantages)."""
    length = len(solution_str)
    return {"score": 0.0 if length % 2 == 0 else (length % 7 + 1) / 7.0}


def filter_probe_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Rewards chosen by dataset row for the sample-filter test (run with data.shuffle=False: 4 rows per step).

    Rows 4-7 (all of step 2): 1.0 for every sample, so every group is uniform and step 2 has nothing to train.
    Elsewhere, row % 4 == 0: uniform 0.0; row % 4 == 1: a sandbox failure on every sample; otherwise a random
    score, different for each sample of the group.
    """
    index = int((extra_info or {}).get("index", -1))
    if os.environ.get(MARK_FILE_ENV) and index == int(os.environ.get(MARK_ROW_ENV, -1)):
        open(os.environ[MARK_FILE_ENV], "a").close()
    if 4 <= index < 8:
        return {"score": 1.0, "sandbox_error": False}
    if index % 4 == 0:
        return {"score": 0.0, "sandbox_error": False}
    if index % 4 == 1:
        return {"score": 0.0, "sandbox_error": True}
    return {"score": random.random(), "sandbox_error": False}


def code_reward_for_validation(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """The real code reward (``verl_pipe.reward_score``: the program runs in the sandbox) on validation rows, the
    length score on training rows: one run checks both model-written code in the sandbox and weight syncs that
    every update moves."""
    if (extra_info or {}).get("split") == "val":
        from verl_pipe.reward_score import compute_score as code_score

        return code_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    return compute_score(data_source, solution_str, ground_truth, extra_info)
