"""A task the random tiny model learns in a few steps, for the learning tests (tests/e2e/test_learning_on_cpu.py).

The task: answer with as many vowels as possible. The score is the share of the response's characters that are
vowels, exact and verifiable. The random tiny model starts near 0.2, and a policy that follows its advantages
raises it within a handful of steps. ``negated_vowel_share`` is the negative control: with GRPO, negating every
reward negates every advantage exactly (group-normalised), so a pipeline that trains on what it is given must
then move the vowel share down. It reports the true share as well, so the test reads the same quantity.
"""


def vowel_share(text: str) -> float:
    return sum(ch in "aeiouAEIOU" for ch in text) / max(1, len(text))


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": vowel_share(solution_str)}


def negated_vowel_share(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": -vowel_share(solution_str)}
