"""A test-only reward that varies within every prompt group, so GRPO advantages (and weight updates) are nonzero.

The random tiny model never writes a passing program, so the real code reward would give all-zero groups,
zero advantages and an update that leaves the weights untouched: a weight-sync check would then pass vacuously.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": (len(solution_str) % 7) / 6.0}


def half_zero_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """About half the responses score 0 (for GRPO+'s overlong_filter=wrong), the rest vary (for nonzero advantages)."""
    length = len(solution_str)
    return {"score": 0.0 if length % 2 == 0 else (length % 7 + 1) / 7.0}
