"""Reward trust, round three: grading rules a wrong answer passed, and work in the caller that grew faster than the
program's output. Each payload below is our own; each scored 1.0 (or cost the caller quadratic time) on the code
before these fixes, and each has an honest control that still scores 1.0.

* `from solution import *` (KodCode) copied every name of the candidate into the tests: a builtin (`abs`), or a
  name the tests had imported themselves (`isclose`), then answered for the tests;
* the TACO-family rule took off the first element of any expected list, not only of a one-element wrapper: a
  function returning a constant passed a multi-element answer;
* a math answer with a unit (`11.99999999 cm^2`) had its value rounded and its unit stripped by verl's
  normalisation, and the exponent of the unit hid it from the exact-number rule;
* decoding a returned dict hashed keys the program chose (ints that all collide): quadratic in the caller;
* finding the last `\\boxed` stepped back one rejected match at a time and scanned the prefix for `\\fbox` each
  time: quadratic in the caller.

The HumanEval prompt helpers' rule is in test_harness_semantics_on_cpu.py (section 3).
"""

from __future__ import annotations

import json
import time

import pytest

from verl_pipe.reward_score import compute_score
from verl_pipe.reward_score.grading import return_value_matches
from verl_pipe.reward_score.math_grading import score_math
from verl_pipe.reward_score.suites import TestCase


def score(source: str, program: str, ground_truth) -> dict:
    return compute_score(source, f"```python\n{program}\n```", ground_truth, {})


# --- 1. star imports -------------------------------------------------------------------------------------------

AREA_TESTS = """
from math import isclose
from solution import *


def test_area():
    assert isclose(area(2.0), 12.566370614359172, rel_tol=1e-9)
    assert abs(area(1.0) - 3.141592653589793) < 1e-9
"""
AREA_RIGHT = "import math\n\n\ndef area(r):\n    return math.pi * r * r\n"
STAR_PAYLOADS = {
    # a name the tests imported before the star import, answered by the candidate
    "test_import": "def area(r):\n    return 3.141592653589793 if r == 1.0 else 0.0\n\n\n"
                   "def isclose(*args, **kwargs):\n    return True\n",
    # a builtin the tests call after it
    "builtin": "def area(r):\n    return 12.566370614359172 if r == 2.0 else 7\n\n\ndef abs(x):\n    return 0\n",
}


@pytest.mark.parametrize("payload", sorted(STAR_PAYLOADS))
def test_a_star_import_copies_only_the_candidates_own_names(payload):
    assert score("kodcode", AREA_RIGHT, AREA_TESTS)["score"] == 1.0  # the honest control
    result = score("kodcode", STAR_PAYLOADS[payload], AREA_TESTS)
    assert result["score"] == 0.0 and result["outcome"] == "wrong_answer", result


# --- 2. the TACO-family unwrap rule ----------------------------------------------------------------------------

PAIR_GT = {"fn_name": "pair", "inputs": [[2], [3]], "outputs": [[3, 4], [3, 5]]}


@pytest.mark.parametrize("source", ["taco", "apps", "code_contests", "primeintellect"])
def test_only_a_one_element_wrapper_comes_off(source):
    gt = PAIR_GT if source != "primeintellect" else [
        {"input": args, "output": out, "fn_name": "pair"} for args, out in zip(PAIR_GT["inputs"], PAIR_GT["outputs"])
    ]  # fmt: skip
    assert score(source, "def pair(x):\n    return [3, x + 2]\n", gt)["score"] == 1.0  # the honest control
    constant = score(source, "def pair(x):\n    return 3\n", gt)  # the first element of every answer
    assert constant["score"] == 0.0 and constant["outcome"] == "wrong_answer", constant
    wrapped = {"fn_name": "one", "inputs": [[1]], "outputs": [[7]]}  # APPS's one-element wrapper still comes off
    assert score("taco", "def one(x):\n    return 7\n", wrapped)["score"] == 1.0


# --- 3. exact numbers with units (math) ------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "truth"), [("11.99999999 cm^2", "12"), ("1e-8 cm^2", "0"),
                                                ("2.99999999 cm^3", "3")])
def test_a_unit_does_not_hide_a_rounded_number(answer, truth):
    assert score_math(f"\\boxed{{{answer}}}", truth)["score"] == 0.0
    unit = answer.split(" ", 1)[1]
    assert score_math(f"\\boxed{{{truth} {unit}}}", truth)["score"] == 1.0  # the control, with its unit
    assert score_math(f"\\boxed{{{truth}}}", truth)["score"] == 1.0


# --- 4. the caller's work is linear in what the program returns ------------------------------------------------

SIZES = (2000, 4000, 8000)
COLLIDING = 2**61 - 1  # every multiple of it hashes to 0 in CPython


def _cpu_ms(call, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        call()
        best = min(best, time.process_time() - start)
    return best * 1000


def _assert_linear(costs: dict[int, tuple[float, float]], what: str) -> None:
    """``costs``: size -> (hostile, honest) CPU milliseconds of one call."""
    (small, _), (large, honest_large) = costs[SIZES[0]], costs[SIZES[-1]]
    growth = SIZES[-1] / SIZES[0]
    assert large <= 2 * growth * max(small, 1.0), f"{what}: grows faster than linear: {costs}"
    assert large <= 5 * honest_large + 20, f"{what}: costs the caller far more than an honest answer: {costs}"


def test_decoding_a_returned_dict_is_linear_whatever_its_keys():
    costs = {}
    for n in SIZES:
        case = TestCase(expected={str(i): i for i in range(n)})
        hostile = json.dumps({"__dict__": [[i * COLLIDING, 0] for i in range(n)]})
        honest = json.dumps({"__dict__": [[str(i), i] for i in range(n)]})
        assert not return_value_matches(hostile, case) and return_value_matches(honest, case)
        costs[n] = (_cpu_ms(lambda: return_value_matches(hostile, case)),
                    _cpu_ms(lambda: return_value_matches(honest, case)))  # fmt: skip
    _assert_linear(costs, "dict decoding")


def test_finding_the_last_box_is_one_linear_pass():
    costs = {}
    for n in SIZES:
        # the last valid box, then thousands of rejected matches after it, and no \fbox at all
        hostile = "\\boxed{12} " + "\\boxedx " * (n * 10)
        honest = "\\boxed{12} " + "x " * (n * 40)
        assert len(hostile) > 8 * n * 10 and score_math(hostile, "12")["score"] == 1.0
        costs[n] = (_cpu_ms(lambda: score_math(hostile, "12")), _cpu_ms(lambda: score_math(honest, "12")))
    _assert_linear(costs, "boxed search")
