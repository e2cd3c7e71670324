"""Checks of verl_pipe.reward_score.math_grading: extraction, equivalence, ground-truth forms and the time bound."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from verl_pipe.reward_score import math_grading
from verl_pipe.reward_score.math_grading import MATH_DATA_SOURCES, SYMPY_TIMEOUT_S, is_math_source, score_math

RESULT_KEYS = {"score", "passed", "tests_run", "tests_total", "outcome", "format_ok", "time_s", "answer"}


def boxed(answer: str) -> str:
    return f"<think>Let me work this out carefully.</think>\nSo the final answer is $\\boxed{{{answer}}}$."


def live_group_members(pgid: int) -> list[int]:
    """Pids of non-zombie processes whose process group is ``pgid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            pids.append(int(entry))
    return pids


# --- result shape ---------------------------------------------------------------------------------------


def test_pass_result_has_exact_keys_and_values():
    result = score_math(boxed("42"), "42")
    assert set(result) == RESULT_KEYS
    assert result["score"] == 1.0 and result["passed"] is True and result["outcome"] == "pass"
    assert result["tests_run"] == 1 and result["tests_total"] == 1 and result["format_ok"] is True
    assert result["answer"] == "42"
    assert isinstance(result["time_s"], float) and 0.0 <= result["time_s"] < 5.0


def test_wrong_answer_scores_zero_even_with_a_penalty_set():
    result = score_math(boxed("41"), "42", format_penalty=-1.0)
    assert (result["score"], result["passed"], result["outcome"]) == (0.0, False, "wrong_answer")
    assert result["tests_run"] == 1 and result["format_ok"] is True and result["answer"] == "41"


def test_missing_box_is_a_format_error_scoring_the_penalty():
    result = score_math("<think>hmm</think> The answer is 42.", "42", format_penalty=-0.5)
    assert set(result) == RESULT_KEYS
    assert (result["score"], result["passed"], result["outcome"]) == (-0.5, False, "format_error")
    assert result["tests_run"] == 0 and result["tests_total"] == 1 and result["format_ok"] is False
    assert result["answer"] == ""
    assert score_math("The answer is 42.", "42")["score"] == 0.0  # default penalty


@pytest.mark.parametrize(
    "response",
    [
        "So the answer is \\boxed{42",  # cut off inside the box
        "So the answer is \\boxed{}",  # empty box
        "So the answer is \\boxed{  }",
        "So the answer is \\boxed42",  # not a box command
        "",
    ],
)
def test_unusable_boxes_are_format_errors(response):
    result = score_math(response, "42", format_penalty=-1.0)
    assert result["outcome"] == "format_error" and result["score"] == -1.0 and result["tests_run"] == 0


def test_answer_field_is_truncated_to_200_chars():
    result = score_math(boxed("1" * 500), "1")
    assert result["answer"] == "1" * 200 and result["outcome"] == "wrong_answer"


# --- </think> handling and extraction -------------------------------------------------------------------


def test_only_text_after_the_last_think_close_counts():
    # The box inside the thoughts is right but the one after </think> is wrong: wrong answer.
    assert score_math("<think>maybe \\boxed{7}</think> \\boxed{8}", "7")["outcome"] == "wrong_answer"
    assert score_math("<think>maybe \\boxed{8}</think> \\boxed{7}", "7")["outcome"] == "pass"
    # Several </think>: the last one wins.
    assert score_math("<think>a</think> \\boxed{7} </think> \\boxed{9}", "9")["answer"] == "9"
    # A box only inside the thoughts is no answer at all.
    assert score_math("<think>\\boxed{7}</think> I am done.", "7")["outcome"] == "format_error"


def test_unclosed_think_is_a_format_error_even_with_a_correct_box():
    result = score_math("<think>the answer is \\boxed{7} but let me check", "7", format_penalty=-1.0)
    assert result["outcome"] == "format_error" and result["score"] == -1.0 and result["answer"] == ""


def test_response_without_think_tags_is_graded_whole():
    assert score_math("Easy: \\boxed{7}.", "7")["outcome"] == "pass"


def test_nested_braces_are_kept_whole():
    result = score_math(boxed("\\frac{1}{2}"), "0.5")
    assert result["answer"] == "\\frac{1}{2}" and result["passed"]
    deep = score_math(boxed("\\frac{\\sqrt{3}}{2}"), "\\frac{1}{2}\\sqrt{3}")
    assert deep["answer"] == "\\frac{\\sqrt{3}}{2}" and deep["passed"]


def test_fbox_is_accepted_and_the_last_box_of_either_kind_wins():
    assert score_math("\\fbox{\\frac{3}{4}}", "3/4")["answer"] == "\\frac{3}{4}"
    assert score_math("\\fbox{\\frac{3}{4}}", "3/4")["passed"]
    assert score_math("first \\boxed{1}, finally \\fbox{2}", "2")["answer"] == "2"
    assert score_math("first \\fbox{1}, finally \\boxed{2}", "2")["answer"] == "2"


def test_prose_mentioning_boxed_does_not_hijack_the_answer():
    # verl's helper alone would return everything after "\boxed " here.
    result = score_math("I will use \\boxed notation. Final: \\boxed{12}", "12")
    assert result["answer"] == "12" and result["passed"]


def test_space_forms_of_boxed():
    assert score_math("Final: \\boxed {12}", "12")["answer"] == "12"
    assert score_math("Final: $\\boxed 12$.", "12")["answer"] == "12"


# --- equivalence ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("0.5", "\\frac{1}{2}"),
        ("\\frac12", "0.5"),
        ("\\dfrac{3}{4}", "3/4"),
        ("\\tfrac{3}{4}", "\\frac{3}{4}"),
        ("10^\\circ", "10"),
        ("10^{\\circ}", "10"),
        ("10\\text{ cm}", "10"),
        ("\\$5", "5"),
        ("5\\%", "5"),
        ("x=5", "5"),  # documented choice: a short left-hand side is dropped (mathd / DeepScaleR)
        ("5", "x = 5"),
        ("\\sqrt{8}", "2\\sqrt{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("(1,2)", "\\left( 1, 2 \\right)"),
        ("(0.5, 2)", "(\\frac{1}{2}, 2)"),
        ("[1,2)", "[1, 2)"),
        ("073", "73"),  # AIME-style zero padding
        ("5.0", "5"),
        ("0.50", "0.5"),
        ("1,000", "1000"),
        ("\\pi/2", "\\frac{\\pi}{2}"),
        ("2x+2", "2(x+1)"),
        ("\\left(\\frac{1}{2}\\right)^2", "\\frac{1}{4}"),
    ],
)
def test_equivalent_answers_pass(answer, truth):
    result = score_math(boxed(answer), truth)
    assert result["outcome"] == "pass", (answer, truth)
    assert result["score"] == 1.0


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("72", "73"),
        ("0073", "74"),
        ("\\frac{1}{3}", "0.33"),
        ("[1,2)", "[1,2]"),
        ("(1,2)", "(2,1)"),
        ("(1,2)", "(1,2,3)"),
        ("x+1", "x-1"),
        ("\\sqrt{8}", "3\\sqrt{2}"),
        ("ab+c=5", "5"),  # a long left-hand side is kept, so this is not "5"
        ("-5", "5"),
    ],
)
def test_different_answers_fail(answer, truth):
    result = score_math(boxed(answer), truth)
    assert result["outcome"] == "wrong_answer", (answer, truth)
    assert result["score"] == 0.0 and result["passed"] is False


@pytest.mark.quiet  # a wall-clock bound: run with no other test beside it
def test_pathological_expression_is_cut_off_and_leaves_no_process_behind(monkeypatch):
    # (10^9)! makes sympy compute a gigantic factorial in C code; grade_answer's own guard would wait 10 s
    # and it forks a grandchild, which must die with the child.
    children: list[int] = []
    real_fork = os.fork

    def recording_fork():
        pid = real_fork()
        if pid:
            children.append(pid)
        return pid

    monkeypatch.setattr(math_grading.os, "fork", recording_fork)
    start = time.monotonic()
    result = score_math(boxed("(10^9)!"), "x")
    elapsed = time.monotonic() - start
    monkeypatch.undo()

    assert result["outcome"] == "wrong_answer" and result["score"] == 0.0
    assert SYMPY_TIMEOUT_S - 0.5 <= elapsed < SYMPY_TIMEOUT_S + 2.0
    assert children, "the sympy stage should run in a forked child"
    # SIGKILL went to the whole group; a grandchild freeing a huge factorial can take a moment to exit on a
    # loaded machine (it is not ours to reap), but it must be gone soon after.
    deadline = time.monotonic() + 5.0
    while live_group_members(children[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_group_members(children[0]) == []


def test_symbolic_stage_still_works_after_a_timeout():
    assert score_math(boxed("\\sqrt{18}"), "3\\sqrt{2}")["passed"]


# --- ground truth forms ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "truth",
    [
        ["1/2", "0.5"],
        ("7", "\\frac{1}{2}"),
        '["7", "\\\\frac{1}{2}"]',  # JSON-encoded list of strings
        np.array(["7", "\\frac{1}{2}"], dtype=object),  # what verl's parquet loading hands over
    ],
)
def test_list_ground_truths_accept_any_member(truth):
    assert score_math(boxed("\\frac{1}{2}"), truth)["outcome"] == "pass"
    assert score_math(boxed("3"), truth)["outcome"] == "wrong_answer"


def test_list_ground_truth_matches_a_later_member_symbolically():
    assert score_math(boxed("2\\sqrt{2}"), ["1", "\\sqrt{8}"])["passed"]


def test_numeric_looking_json_list_string_is_an_interval_not_a_list():
    assert score_math(boxed("[1,2]"), "[1, 2]")["passed"]
    assert not score_math(boxed("1"), "[1, 2]")["passed"]


@pytest.mark.parametrize("truth", [73, 73.0, np.int64(73), "73", " 73 ", "\\boxed{73}", "The answer is $\\boxed{073}$"])
def test_numeric_and_boxed_ground_truths(truth):
    assert score_math(boxed("73"), truth)["passed"]
    assert not score_math(boxed("74"), truth)["passed"]


def test_float_ground_truth():
    assert score_math(boxed("\\frac{1}{2}"), 0.5)["passed"]
    assert not score_math(boxed("\\frac{1}{3}"), 0.5)["passed"]


@pytest.mark.parametrize(
    ("truth", "message"),
    [
        (None, "must be a string"),
        ([], "empty list"),
        ("[]", "empty list"),
        ("", "empty"),
        ("   ", "empty"),
        (["1", ""], "empty"),
        (["1", None], "must be a string"),
        (True, "must be a string"),
        ({"answer": "1"}, "must be a string"),
    ],
)
def test_bad_ground_truth_raises(truth, message):
    with pytest.raises(ValueError, match=message):
        score_math(boxed("1"), truth)


def test_bad_ground_truth_raises_even_when_the_response_is_malformed():
    with pytest.raises(ValueError):
        score_math("no box here", None)


# --- data sources ---------------------------------------------------------------------------------------


def test_math_sources():
    for name in ("deepscaler", "math", "aime", "amc", "aime2024", "aime25", "AIME2024", "amc23", "lighteval/MATH"):
        assert is_math_source(name), name
    assert all(is_math_source(name) for name in MATH_DATA_SOURCES)
    for name in ("livecodebench", "verl_pipe/easy_code", "openai/gsm8k", "math_dapo", "", None):
        assert not is_math_source(name), name
