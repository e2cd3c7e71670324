"""Per-source checks of verl_pipe.reward_score.compute_score: every ground-truth format the router accepts, graded by
real candidate programs in the real sandbox (bubblewrap), plus test selection, input validation and the test store.

Every fixture below is written for this file in the real dataset schemas (LiveCodeBench, TACO/APPS/CodeContests,
PrimeIntellect, Codeforces, HumanEval, MBPP, KodCode, DeepScaleR/AIME); nothing is copied from a dataset.
"""

from __future__ import annotations

import json

import pytest

from verl_pipe.reward_score import KNOWN_DATA_SOURCES, RESULT_KEYS, compute_score
from verl_pipe.reward_score.problem_tests import TEST_STORE_ENV, ProblemTestStore, write_test_store


def fenced(code: str, tag: str = "python") -> str:
    return f"Let me solve this.\n\n```{tag}\n{code}\n```\n\nDone."


def run(source: str, code: str, ground_truth, extra_info=None, **kwargs) -> dict:
    """Grade ``code`` as a fenced response and check the invariants every result must keep."""
    result = compute_score(source, fenced(code), ground_truth, extra_info, **kwargs)
    assert set(result) == set(RESULT_KEYS)
    assert result["passed"] == (result["outcome"] == "pass")
    assert result["score"] == (1.0 if result["passed"] else 0.0)
    assert result["format_ok"] and not result["sandbox_error"]
    assert 0 <= result["tests_run"] <= result["tests_total"]
    return result


def lcb_stdin(*pairs: tuple[str, str]) -> str:
    return json.dumps([{"input": i, "output": o, "testtype": "stdin"} for i, o in pairs])


def lcb_functional(*pairs: tuple[str, str]) -> str:
    return json.dumps([{"input": i, "output": o, "testtype": "functional"} for i, o in pairs])


# ---------------------------------------------------------------------------------------------------------------
# LiveCodeBench: stdin
# ---------------------------------------------------------------------------------------------------------------

# "Print the sum of a and b, then their product" (two output lines).
SUM_PROD = lcb_stdin(("2 3\n", "5\n6\n"), ("-4 10\n", "6\n-40\n"), ("0 7\n", "7\n0\n"))
SUM_PROD_RIGHT = "a, b = map(int, input().split())\nprint(a + b)\nprint(a * b)"


def test_lcb_stdin_right_and_wrong():
    """Guards against LCB stdin tests being scored without running every test, or stopping late on a failure."""
    right = run("livecodebench", SUM_PROD_RIGHT, SUM_PROD)
    assert right["outcome"] == "pass" and right["tests_run"] == right["tests_total"] == 3
    # Right on test 1 (2+3=5, 2*3=6), wrong on test 2 (-4-10 != 6): grading stops at test 2.
    wrong_code = "a, b = map(int, input().split())\nprint(a + b if a >= 0 else a - b)\nprint(a * b)"
    wrong = run("livecodebench", wrong_code, SUM_PROD)
    assert wrong["outcome"] == "wrong_answer" and wrong["tests_run"] == 2 and wrong["tests_total"] == 3


def test_lcb_ground_truth_as_list_of_dicts_equals_json_string():
    """Guards against the decoded (non-string) LCB ground truth taking a different path than the JSON text."""
    as_list = json.loads(SUM_PROD)
    assert run("livecodebench", SUM_PROD_RIGHT, as_list)["outcome"] == "pass"
    assert run("livecodebench", "print(5)\nprint(6)", as_list)["tests_run"] == 2


# One test: input "3\n", expected two lines "1 2" and "3". Each case is a program and whether it must pass.
EDGE_GT = lcb_stdin(("3\n", "1 2\n3\n"))


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        pytest.param("input()\nprint('1 2   ')\nprint('3\\t ')", "pass", id="trailing_spaces"),
        pytest.param("input()\nprint('1 2')\nprint('3')\nprint()\nprint()", "pass", id="final_blank_lines"),
        pytest.param("input()\nprint('   1 2')\nprint('3')", "pass", id="leading_spaces"),
        pytest.param("input()\nprint('1.0 2.00')\nprint('3.000')", "pass", id="decimal_trailing_zeros"),
        pytest.param("input()\nprint('1   2')\nprint('3')", "pass", id="inner_spacing_as_decimals"),
        pytest.param("import sys\ninput()\nsys.stdout.write('1 2\\r\\n3\\r\\n')", "pass", id="crlf"),
        pytest.param("input()\nprint('1 2')", "wrong_answer", id="missing_line"),
        pytest.param("input()\nprint('1 2')\nprint('3')\nprint('3')", "wrong_answer", id="extra_line"),
        pytest.param("input()\nprint('1 2')\nprint(3, end='')\nprint('3')", "wrong_answer", id="no_newline_merge"),
        pytest.param(
            "n = int(input())\nprint('debug: n =', n)\nprint('1 2')\nprint(3)", "wrong_answer", id="debug_text_line"
        ),  # fmt: skip
        pytest.param("input()\nprint('1 2')\nprint('3 (done)')", "wrong_answer", id="debug_text_same_line"),
        pytest.param("input()\nprint('1 2')\nprint(3.0000001)", "wrong_answer", id="no_float_tolerance"),
        pytest.param("import sys\ninput()\nprint('1 2')\nprint(3)\nsys.exit(1)", "pass", id="sys_exit_1_after"),
        pytest.param("input()\nprint('1 2')\nprint(3)\nraise SystemExit('bye')", "pass", id="systemexit_msg"),
        pytest.param("input()\nprint('1 2')\nprint(3)\nexit()", "pass", id="exit_builtin"),
        pytest.param(
            "input()\nprint('1 2')\nprint(3, flush=True)\nraise ValueError('boom')",
            "runtime_error",
            id="exception_after_right_output",
        ),  # fmt: skip
        pytest.param("input()\nprint('1 2')\nprint(3)\n{}['missing']", "runtime_error", id="keyerror_after"),
        pytest.param("input()\nprint('1 2')\nprint(3)\ninput()", "runtime_error", id="eof_reading_past_input"),
    ],
)
def test_lcb_stdin_output_comparison_edges(code, outcome):
    """Guards against drifting from LiveCodeBench's stdin rule (strip, line count, per-line text or decimals with no
    tolerance) and its exit handling (SystemExit ends the program normally; any other exception fails)."""
    result = run("livecodebench", code, EDGE_GT)
    assert result["outcome"] == outcome, result
    assert result["tests_run"] == 1


def test_lcb_stdin_crlf_in_expected_output():
    """Guards against Windows line endings in a dataset's expected output failing a correct program."""
    gt = lcb_stdin(("2 3\r\n", "5\r\n6\r\n"))
    assert run("livecodebench", SUM_PROD_RIGHT, gt)["outcome"] == "pass"


def test_lcb_stdin_empty_expected_output():
    """Guards against an empty expected output being unmatchable (or matched by any output)."""
    gt = lcb_stdin(("5\n", ""))
    assert run("livecodebench", "n = int(input())", gt)["outcome"] == "pass"
    assert run("livecodebench", "n = int(input())\nprint()\nprint('  ')", gt)["outcome"] == "pass"
    assert run("livecodebench", "n = int(input())\nprint(n)", gt)["outcome"] == "wrong_answer"


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(
            "import sys\ndata = sys.stdin.buffer.read().split()\nprint(int(data[0]) + int(data[1]))", id="stdin_buffer"
        ),  # fmt: skip
        pytest.param("a, b = map(int, open(0).read().split())\nprint(a + b)", id="open_fd_0"),
        pytest.param(
            "def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\n"
            "if __name__ == '__main__':\n    main()",
            id="main_guard",
        ),  # fmt: skip
        pytest.param(
            "total = 0\ndef add(x):\n    global total\n    total += x\n"
            "for v in input().split():\n    add(int(v))\nprint(total)",
            id="global_statement",
        ),  # fmt: skip
        pytest.param(
            "import threading\nthreading.stack_size(1 << 26)\n"
            "def main():\n    print(sum(map(int, input().split())))\n"
            "threading.Thread(target=main).start()",
            id="big_stack_thread",
        ),  # fmt: skip
        pytest.param("print(reduce(add, map(int, input().split())))", id="prelude_names_without_import"),
    ],
)
def test_lcb_stdin_program_styles(code):
    """Guards against correct programs failing because of how they read stdin or are run (real fd 0, __main__,
    module globals, a worker thread that outlives the module body, LiveCodeBench's import prelude)."""
    result = run("livecodebench", code, lcb_stdin(("2 3\n", "5\n"), ("10 -4\n", "6\n")))
    assert result["outcome"] == "pass" and result["tests_run"] == 2


def test_lcb_stdin_syntax_error_is_compile_error_before_any_test():
    """Guards against a program that does not compile being charged test runs or a non-error outcome."""
    result = run("livecodebench", "print(1 +", SUM_PROD)
    assert result["outcome"] == "compile_error" and result["tests_run"] == 0


def test_lcb_stdin_infinite_loop_times_out():
    """Guards against a hung stdin program being reported as anything but a timeout (or hanging the grader)."""
    result = run("livecodebench", "input()\nwhile True:\n    pass", SUM_PROD, timeout=1)
    assert result["outcome"] == "timeout" and result["tests_run"] == 1
    assert result["time_s"] < 6


# ---------------------------------------------------------------------------------------------------------------
# LiveCodeBench: functional (LeetCode starter style)
# ---------------------------------------------------------------------------------------------------------------

# twoSum(nums, target): one JSON argument per line.
TWO_SUM = lcb_functional(
    ("[2, 7, 11, 15]\n9", "[0, 1]"),
    ("[3, 2, 4]\n6", "[1, 2]"),
    ("[3, 3]\n6", "[0, 1]"),
    ("[-1, -2, -3, -4, -5]\n-8", "[2, 4]"),
)
TWO_SUM_CLASS = """class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen: Dict[int, int] = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return [seen[target - x], i]
            seen[x] = i
        return []
"""


@pytest.mark.parametrize(
    "extra_info",
    [
        pytest.param({"metadata": json.dumps({"func_name": "twoSum"})}, id="metadata_json_text"),
        pytest.param({"metadata": {"func_name": "twoSum"}}, id="metadata_dict"),
        pytest.param({"func_name": "twoSum"}, id="plain_func_name"),
    ],
)
def test_lcb_functional_class_solution(extra_info):
    """Guards against losing the function name in any of the places LCB rows keep it, and against the starter's
    typing annotations (List, Dict without imports) breaking a correct class Solution."""
    right = run("livecodebench", TWO_SUM_CLASS, TWO_SUM, extra_info)
    assert right["outcome"] == "pass" and right["tests_run"] == right["tests_total"] == 4
    # Brute force that returns the indices in the wrong order: right on no test.
    wrong_code = TWO_SUM_CLASS.replace("[seen[target - x], i]", "[i, seen[target - x]]")
    wrong = run("livecodebench", wrong_code, TWO_SUM, extra_info)
    assert wrong["outcome"] == "wrong_answer" and wrong["tests_run"] == 1


def test_lcb_functional_top_level_function_and_runtime_error():
    """Guards against requiring a Solution class, and against an exception in the call being a wrong answer."""
    code = "def twoSum(nums, target):\n    return next([i, j] for j in range(len(nums)) for i in range(j)" \
           " if nums[i] + nums[j] == target)"  # fmt: skip
    assert run("livecodebench", code, TWO_SUM, {"func_name": "twoSum"})["outcome"] == "pass"
    crash = run("livecodebench", "def twoSum(nums, target):\n    return nums[99]", TWO_SUM, {"func_name": "twoSum"})
    assert crash["outcome"] == "runtime_error" and crash["tests_run"] == 1


def test_lcb_functional_name_only_in_prelude_is_not_an_answer():
    """Guards against a function the import prelude supplies (math.gcd) answering for a program that never defines
    the requested function."""
    gt = lcb_functional(("12\n18", "6"), ("7\n5", "1"))
    result = run("livecodebench", "def helper(a, b):\n    return a", gt, {"func_name": "gcd"})
    assert result["outcome"] == "runtime_error"
    own = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a"
    assert run("livecodebench", own, gt, {"func_name": "gcd"})["outcome"] == "pass"


@pytest.mark.parametrize(
    ("returned", "expected_json", "outcome"),
    [
        pytest.param("(1, 2)", "[1, 2]", "pass", id="top_level_tuple_is_list"),
        pytest.param("[(1, 2), (3, 4)]", "[[1, 2], [3, 4]]", "wrong_answer", id="nested_tuple_not_list"),
        pytest.param("{'k': (1, 2)}", '{"k": [1, 2]}', "wrong_answer", id="tuple_in_dict_not_list"),
        pytest.param("{1, 2}", "[1, 2]", "wrong_answer", id="set_not_list"),
        pytest.param("frozenset()", "[]", "wrong_answer", id="frozenset_not_empty_list"),
        pytest.param("{1: 2}", '{"1": 2}', "wrong_answer", id="int_keyed_dict_not_object"),
        pytest.param("{'1': 2, 'a': [None]}", '{"1": 2, "a": [null]}', "pass", id="str_keyed_dict"),
        pytest.param("True", "1", "pass", id="true_equals_1"),
        pytest.param("0", "false", "pass", id="zero_equals_false"),
        pytest.param("2.0", "2", "pass", id="float_equals_int"),
        pytest.param("0.1 + 0.2", "0.3", "wrong_answer", id="no_float_tolerance"),
        pytest.param("None", "null", "pass", id="none_is_null"),
        pytest.param("'5'", "5", "wrong_answer", id="str_not_int"),
        pytest.param("[1, 2, 3]", "[1, 2]", "wrong_answer", id="longer_list"),
        pytest.param(
            "type('AlwaysEqual', (), {'__eq__': lambda s, o: True, '__hash__': None})()",
            "[1, 2]",
            "wrong_answer",
            id="always_equal_object",
        ),  # fmt: skip
    ],
)
def test_lcb_functional_return_value_comparison(returned, expected_json, outcome):
    """Guards against comparing returns other than as LiveCodeBench's ``==`` does (a top-level tuple made a list,
    nothing else converted), and against a returned object with a rigged __eq__ being compared in the sandbox."""
    code = f"class Solution:\n    def solve(self, x):\n        return {returned}"
    result = run("livecodebench", code, lcb_functional(("0", expected_json)), {"func_name": "solve"})
    assert result["outcome"] == outcome, result


# ---------------------------------------------------------------------------------------------------------------
# TACO / APPS / CodeContests
# ---------------------------------------------------------------------------------------------------------------

# "First line t, then t lines a b: print a+b per case."
MULTI_SUM_RIGHT = "t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n    print(a + b)"
MULTI_SUM_WRONG = "t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n    print(a - b)"


@pytest.mark.parametrize("source", ["taco", "apps", "code_contests"])
def test_taco_family_stdin_dict(source):
    """Guards against the {"inputs", "outputs"} stdin form being misrouted or mis-paired for any TACO-family source."""
    gt = json.dumps({"inputs": ["2\n1 2\n3 4\n", "1\n0 0\n"], "outputs": ["3\n7\n", "0\n"]})
    right = run(source, MULTI_SUM_RIGHT, gt)
    assert right["outcome"] == "pass" and right["tests_total"] == 2
    assert run(source, MULTI_SUM_WRONG, gt)["outcome"] == "wrong_answer"


def test_taco_stdin_inputs_and_outputs_as_lists_of_lines():
    """Guards against TACO rows that store an input or output as a list of lines being compared as a Python repr."""
    gt = {"inputs": [["2", "1 2", "3 4"], "1\n5 5\n"], "outputs": [["3", "7"], ["10"]]}
    assert run("taco", MULTI_SUM_RIGHT, gt)["outcome"] == "pass"
    assert run("taco", MULTI_SUM_RIGHT, json.dumps(gt))["outcome"] == "pass"
    wrong = run("taco", MULTI_SUM_WRONG, gt)
    assert wrong["outcome"] == "wrong_answer" and wrong["tests_run"] == 1


# Call-based: inputs are argument lists, outputs wrapped in one-element lists (TACO/APPS convention).
CALL_GT = {"fn_name": "pair_sum", "inputs": [[1, 2], [[5, 6], 3], [-1, 1]], "outputs": [[3], [[8, 9]], [0]]}
PAIR_SUM = """def pair_sum(a, b):
    if isinstance(a, list):
        return [x + b for x in a]
    return a + b
"""


@pytest.mark.parametrize("source", ["taco", "apps", "code_contests"])
def test_taco_family_call_based_accepts_wrapped_or_unwrapped(source):
    """Guards against rejecting either form the APPS harness accepts: the bare return value or it wrapped in the
    one-element list the dataset stores."""
    assert run(source, PAIR_SUM, CALL_GT)["outcome"] == "pass"
    wrapped = PAIR_SUM.replace("def pair_sum", "def _inner") + "\ndef pair_sum(a, b):\n    return [_inner(a, b)]"
    assert run(source, wrapped, json.dumps(CALL_GT))["outcome"] == "pass"
    as_method = "class Solution:\n    " + PAIR_SUM.replace("(a, b)", "(self, a, b)").replace("\n", "\n    ")
    assert run(source, as_method, CALL_GT)["outcome"] == "pass"
    wrong = run(source, PAIR_SUM.replace("x + b", "x - b"), CALL_GT)
    assert wrong["outcome"] == "wrong_answer" and wrong["tests_run"] == 2


def test_taco_call_based_fn_name_from_extra_info():
    """Guards against ignoring extra_info's fn_name for call-based rows that do not carry it in the ground truth."""
    gt = {"inputs": CALL_GT["inputs"], "outputs": CALL_GT["outputs"]}
    assert run("taco", PAIR_SUM, gt, {"fn_name": "pair_sum"})["outcome"] == "pass"


def test_taco_call_based_unwrapping_is_only_one_level():
    """Guards against the unwrapped-list rule accepting something that is neither the value nor the value wrapped."""
    gt = {"fn_name": "f", "inputs": [[0]], "outputs": [[[1, 2]]]}
    assert run("taco", "def f(x):\n    return [1, 2]", gt)["outcome"] == "pass"
    assert run("taco", "def f(x):\n    return [[1, 2]]", gt)["outcome"] == "pass"
    assert run("taco", "def f(x):\n    return 1", gt)["outcome"] == "wrong_answer"
    assert run("taco", "def f(x):\n    return [[[1, 2]]]", gt)["outcome"] == "wrong_answer"


# ---------------------------------------------------------------------------------------------------------------
# PrimeIntellect / Codeforces
# ---------------------------------------------------------------------------------------------------------------


def test_primeintellect_stdin_list():
    """Guards against PrimeIntellect's list-of-{input, output} stdin form being misread."""
    gt = json.dumps([{"input": "2\n1 2\n3 4\n", "output": "3\n7\n"}, {"input": "1\n-5 5\n", "output": "0\n"}])
    right = run("primeintellect", MULTI_SUM_RIGHT, gt)
    assert right["outcome"] == "pass" and right["tests_total"] == 2
    assert run("primeintellect", MULTI_SUM_WRONG, gt)["outcome"] == "wrong_answer"


def test_primeintellect_call_based_with_fn_name():
    """Guards against PrimeIntellect call-based tests (fn_name per test) being run as stdin programs."""
    gt = [
        {"input": [1, 2], "output": [3], "fn_name": "pair_sum"},
        {"input": [[5, 6], 3], "output": [[8, 9]], "fn_name": "pair_sum"},
    ]
    assert run("primeintellect", PAIR_SUM, json.dumps(gt))["outcome"] == "pass"
    # Argument lists stored as JSON text work too.
    as_text = [{**t, "input": json.dumps(t["input"])} for t in gt]
    assert run("primeintellect", PAIR_SUM, as_text)["outcome"] == "pass"
    assert run("primeintellect", PAIR_SUM.replace("a + b", "a * b"), gt)["outcome"] == "wrong_answer"


def test_codeforces_stdin_list():
    """Guards against Codeforces rows being routed anywhere but stdin grading."""
    gt = json.dumps([{"input": "3\n1 2\n3 4\n5 6\n", "output": "3\n7\n11\n"}, {"input": "1\n0 9\n", "output": "9"}])
    assert run("codeforces", MULTI_SUM_RIGHT, gt)["outcome"] == "pass"
    wrong = run("codeforces", MULTI_SUM_RIGHT + "\nprint('done')", gt)
    assert wrong["outcome"] == "wrong_answer" and wrong["tests_run"] == 1


# ---------------------------------------------------------------------------------------------------------------
# Test selection: the max_tests longest inputs (capped sources only), run in dataset order
# ---------------------------------------------------------------------------------------------------------------

# 20 tests; test i has LENGTHS[i] ones on its line, so the input lengths are all distinct. The five shortest
# (1..5 numbers) sit in the middle of the dataset order; the first of them is at index 10.
LENGTHS = [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 3, 1, 16, 17, 18, 2, 19, 20, 5, 4]
ONES = [(" ".join(["1"] * k) + "\n", f"{k}\n") for k in LENGTHS]
FAILS_ON_SHORT = "nums = input().split()\nprint(len(nums) if len(nums) > 5 else -1)"
FAILS_ON_12 = "nums = input().split()\nprint(len(nums) if len(nums) != 12 else -1)"


def test_capped_source_keeps_the_longest_inputs():
    """Guards against keeping the first (or random) max_tests tests instead of the longest inputs, and against
    tests_total reporting the unselected count."""
    gt = {"inputs": [i for i, _ in ONES], "outputs": [o for _, o in ONES]}
    capped = run("taco", FAILS_ON_SHORT, gt, max_tests=15)
    assert capped["outcome"] == "pass" and capped["tests_run"] == capped["tests_total"] == 15
    uncapped = run("taco", FAILS_ON_SHORT, gt, max_tests=None)
    assert uncapped["outcome"] == "wrong_answer" and uncapped["tests_total"] == 20
    assert uncapped["tests_run"] == 11  # dataset order: the first short input is test 11


def test_capped_source_runs_selected_tests_in_dataset_order():
    """Guards against running the selection sorted by length (or failing to stop at the first failing test)."""
    gt = {"inputs": [i for i, _ in ONES], "outputs": [o for _, o in ONES]}
    result = run("taco", FAILS_ON_12, gt, max_tests=15)
    # Kept in dataset order: 6..15 (10 tests), 16, 17, 18, 19, 20; the 12-ones test is the 7th.
    assert result["outcome"] == "wrong_answer" and result["tests_run"] == 7 and result["tests_total"] == 15


def test_default_cap_applies_to_primeintellect_and_codeforces():
    """Guards against the default max_tests=15 cap missing the list-form capped sources."""
    gt = [{"input": i, "output": o} for i, o in ONES]
    for source in ("primeintellect", "codeforces"):
        result = run(source, FAILS_ON_SHORT, gt)
        assert result["outcome"] == "pass" and result["tests_total"] == 15, source


def test_call_based_selection_uses_argument_length():
    """Guards against the cap being skipped (or keyed on the wrong thing) for call-based suites."""
    gt = {"fn_name": "count", "inputs": [[[1] * k] for k in LENGTHS], "outputs": [[k] for k in LENGTHS]}
    code = "def count(xs):\n    return len(xs) if len(xs) > 5 else -1"
    capped = run("taco", code, gt, max_tests=15)
    assert capped["outcome"] == "pass" and capped["tests_total"] == 15
    assert run("taco", code, gt, max_tests=None)["outcome"] == "wrong_answer"


def test_livecodebench_is_never_capped():
    """Guards against the TACO cap leaking into LiveCodeBench, which runs every test."""
    gt = lcb_stdin(*ONES)
    failing = run("livecodebench", FAILS_ON_SHORT, gt, max_tests=15)
    assert failing["outcome"] == "wrong_answer" and failing["tests_total"] == 20 and failing["tests_run"] == 11
    right = run("livecodebench", "print(len(input().split()))", gt, max_tests=15)
    assert right["outcome"] == "pass" and right["tests_run"] == right["tests_total"] == 20


# ---------------------------------------------------------------------------------------------------------------
# Assert suites: HumanEval, MBPP, KodCode
# ---------------------------------------------------------------------------------------------------------------

HE_TEST = """
METADATA = {"author": "tests", "dataset": "test"}


def check(candidate):
    assert candidate([1, 2, 3]) == [1, 3, 6]
    assert candidate([]) == []
    assert candidate([5, -5, 2]) == [5, 0, 2]
"""
HE_RIGHT = '''from typing import List


def running_sum(numbers: List[int]) -> List[int]:
    """Prefix sums of numbers."""
    out, total = [], 0
    for n in numbers:
        total += n
        out.append(total)
    return out
'''
HE_WRONG = HE_RIGHT.replace("total += n", "total = n")

MBPP_TESTS = ["assert hyp(3, 4) == 5.0", "assert math.isclose(hyp(1, 1), math.sqrt(2))", "assert hyp(0, 0) == 0"]
MBPP_RIGHT = "import math\n\ndef hyp(a, b):\n    return math.hypot(a, b)"
MBPP_WRONG = "def hyp(a, b):\n    return (a * a + b * b) ** 0.5 if a != b else a"  # right on hyp(3, 4) only

KOD_TEST = """from solution import count_vowels


def test_basic():
    assert count_vowels("hello") == 2


def test_empty():
    assert count_vowels("") == 0


def test_upper():
    assert count_vowels("AEIOU xyz") == 5
"""
KOD_RIGHT = "def count_vowels(s):\n    return sum(ch in 'aeiouAEIOU' for ch in s)"
KOD_WRONG = "def count_vowels(s):\n    return sum(ch in 'aeiou' for ch in s)"  # fails only test_upper

ASSERT_CASES = {
    "humaneval": ({"test": HE_TEST, "entry_point": "running_sum"}, None, HE_RIGHT, HE_WRONG, "running_sum"),
    "mbpp": ({"test_list": MBPP_TESTS, "test_imports": ["import math"]}, None, MBPP_RIGHT, MBPP_WRONG, "hyp"),
    "kodcode": (KOD_TEST, None, KOD_RIGHT, KOD_WRONG, "count_vowels"),
}  # fmt: skip


@pytest.mark.parametrize(
    ("ground_truth", "extra_info"),
    [
        pytest.param({"test": HE_TEST, "entry_point": "running_sum"}, None, id="dict"),
        pytest.param(json.dumps({"test": HE_TEST, "entry_point": "running_sum"}), None, id="json_text"),
        pytest.param(HE_TEST, {"entry_point": "running_sum"}, id="test_string_and_extra_info"),
    ],
)
def test_humaneval_right_and_wrong(ground_truth, extra_info):
    """Guards against losing the test code or entry point in any HumanEval ground-truth form, and against a failed
    assert being reported as anything but a wrong answer."""
    right = run("humaneval", HE_RIGHT, ground_truth, extra_info)
    assert right["outcome"] == "pass" and right["tests_run"] == right["tests_total"] == 1
    wrong = run("humaneval", HE_WRONG, ground_truth, extra_info)
    assert wrong["outcome"] == "wrong_answer"
    missing = run("humaneval", "def other(x):\n    return x", ground_truth, extra_info)
    assert missing["outcome"] == "runtime_error"


def test_humanevalplus_routes_like_humaneval():
    """Guards against humanevalplus rows being rejected or graded by a different rule than humaneval."""
    gt = {"test": HE_TEST, "entry_point": "running_sum"}
    assert run("humanevalplus", HE_RIGHT, gt)["outcome"] == "pass"
    assert run("humanevalplus", HE_WRONG, gt)["outcome"] == "wrong_answer"


@pytest.mark.parametrize(
    "ground_truth",
    [
        pytest.param(MBPP_TESTS[:1] + ["import math"] + MBPP_TESTS[1:], id="list_of_asserts"),
        pytest.param(json.dumps(["import math", *MBPP_TESTS]), id="json_list"),
        pytest.param({"test_list": MBPP_TESTS, "test_imports": ["import math"]}, id="test_list_dict"),
        pytest.param(
            json.dumps({"test_list": MBPP_TESTS, "test_imports": ["import math"], "test_setup_code": ""}),
            id="test_list_json",
        ),  # fmt: skip
    ],
)
def test_mbpp_right_and_wrong(ground_truth):
    """Guards against dropping MBPP's test_imports or any assert line, and against a failed assert not being a
    wrong answer (hyp(3, 4) passes the first assert, so the wrong program only fails a later one)."""
    assert run("mbpp", MBPP_RIGHT, ground_truth)["outcome"] == "pass"
    assert run("mbpp", MBPP_WRONG, ground_truth)["outcome"] == "wrong_answer"


def test_kodcode_right_and_wrong():
    """Guards against KodCode's `from solution import f` failing, or against skipping any def test_ function (the
    wrong program only fails the last one)."""
    assert run("kodcode", KOD_RIGHT, KOD_TEST)["outcome"] == "pass"
    assert run("kodcode", KOD_RIGHT, json.dumps({"test": KOD_TEST}))["outcome"] == "pass"
    assert run("kodcode", KOD_WRONG, KOD_TEST)["outcome"] == "wrong_answer"


EARLY_EXITS = {
    "sys_exit_top_level": "import sys\n{wrong}\nsys.exit(0)",
    "os_exit_top_level": "import os\n{wrong}\nos._exit(0)",
    "raise_systemexit_top_level": "{wrong}\nraise SystemExit(0)",
    "atexit_os_exit": "import atexit, os\natexit.register(lambda: os._exit(0))\n{wrong}",
    "os_exit_inside_function": "import os\n{wrong}\ndef {name}(*a):\n    os._exit(0)",
    "sys_exit_inside_function": "import sys\n{wrong}\ndef {name}(*a):\n    sys.exit(0)",
}


@pytest.mark.parametrize("hack", sorted(EARLY_EXITS))
@pytest.mark.parametrize("source", sorted(ASSERT_CASES))
def test_assert_suites_early_exit_fails(source, hack):
    """Guards against a program that exits (sys.exit, os._exit, an atexit hook) before the check finishes being
    taken for one that passed every assert."""
    ground_truth, extra_info, _, wrong, name = ASSERT_CASES[source]
    code = EARLY_EXITS[hack].format(wrong=wrong, name=name)
    result = run(source, code, ground_truth, extra_info)
    assert result["outcome"] in ("wrong_answer", "runtime_error"), result


EXEC_HIJACK = "{wrong}\nimport builtins\nbuiltins.exec = lambda *args, **kwargs: None"
# Frame introspection: find the runner frame holding the mutable `state` dict and blank the test code before the
# runner executes it (protocol-independent; the same walk also reaches child_main's completion token).
STATE_TAMPER = """{wrong}
import sys
frame = sys._getframe()
while frame is not None and not isinstance(frame.f_locals.get("state"), dict):
    frame = frame.f_back
frame.f_locals["state"]["test_code"] = compile("pass", "<tests>", "exec")
frame.f_locals["state"]["entry_point"] = ""
"""


@pytest.mark.parametrize("source", sorted(ASSERT_CASES))
def test_assert_suites_exec_hijack_fails(source):
    """Guards against a candidate that replaces builtins.exec so the test code never runs being scored as passing."""
    ground_truth, extra_info, _, wrong, _ = ASSERT_CASES[source]
    result = run(source, EXEC_HIJACK.format(wrong=wrong), ground_truth, extra_info)
    assert result["outcome"] != "pass"


@pytest.mark.parametrize("source", sorted(ASSERT_CASES))
def test_assert_suites_runner_state_tampering_fails(source):
    """Guards against a candidate reaching into the runner's frames to drop the check it is about to be given.
    (The harness copies what it needs before the candidate runs; deeper frame tampering is the documented
    limit of any in-process harness.)"""
    ground_truth, extra_info, _, wrong, _ = ASSERT_CASES[source]
    result = run(source, STATE_TAMPER.format(wrong=wrong), ground_truth, extra_info)
    assert result["outcome"] != "pass"


def test_kodcode_test_class_is_run():
    """Guards against pytest-style test classes being silently skipped, which passes every program."""
    test_code = "from solution import count_vowels\n\n\nclass TestCountVowels:\n" \
                "    def test_upper(self):\n        assert count_vowels('AEIOU') == 5\n"  # fmt: skip
    assert run("kodcode", KOD_RIGHT, test_code)["outcome"] == "pass"
    assert run("kodcode", KOD_WRONG, test_code)["outcome"] == "wrong_answer"


def test_kodcode_tests_importing_pytest_pass_a_right_program():
    """Guards against correct KodCode solutions scoring zero because their pytest-style tests import pytest
    (the sandbox has no site-packages; the runner provides a small pytest stand-in)."""
    test_code = KOD_TEST.replace("from solution", "import pytest\nfrom solution") + (
        "\n\ndef test_rejects_none():\n    with pytest.raises(TypeError):\n        count_vowels(None)\n"
        "\n\n@pytest.mark.parametrize('text, n', [('ab', 1), ('EE', 2)])\ndef test_table(text, n):\n"
        "    assert count_vowels(text) == pytest.approx(n)\n"
    )
    assert run("kodcode", KOD_RIGHT, test_code)["outcome"] == "pass"
    assert run("kodcode", KOD_WRONG, test_code)["outcome"] == "wrong_answer"


# ---------------------------------------------------------------------------------------------------------------
# Math routing
# ---------------------------------------------------------------------------------------------------------------


def test_math_deepscaler_routing():
    """Guards against math sources being sent to the code grader, or grading a box inside the thoughts."""
    right = compute_score("deepscaler", "<think>maybe \\boxed{41}?</think> So the answer is $\\boxed{42}$.", "42")
    assert right["outcome"] == "pass" and right["score"] == 1.0 and set(right) == set(RESULT_KEYS)
    wrong = compute_score("deepscaler", "<think>maybe \\boxed{42}?</think> So it is $\\boxed{41}$.", "42")
    assert wrong["outcome"] == "wrong_answer" and wrong["score"] == 0.0 and wrong["tests_run"] == 1
    unfinished = compute_score("deepscaler", "<think>it is \\boxed{42}", "42", format_penalty=-0.1)
    assert unfinished["outcome"] == "format_error" and unfinished["score"] == -0.1


def test_math_aime_prefix_routing():
    """Guards against aimeYYYY names missing the aime* prefix rule, and against 073 vs 73 comparing as text."""
    result = compute_score("aime2024", "<think>...</think>\\boxed{073}", "73")
    assert result["outcome"] == "pass" and result["score"] == 1.0
    assert compute_score("aime2024", "<think>...</think>\\boxed{74}", "73")["score"] == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Format errors and bad inputs
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "ground_truth"),
    [
        ("livecodebench", SUM_PROD),
        ("taco", {"inputs": ["1\n1 1\n"], "outputs": ["2\n"]}),
        ("humaneval", {"test": HE_TEST, "entry_point": "running_sum"}),
        ("mbpp", MBPP_TESTS),
        ("kodcode", KOD_TEST),
    ],
)
def test_no_fenced_block_is_format_error_with_penalty(source, ground_truth):
    """Guards against prose or an unterminated/non-Python block being run, or scored 0 instead of the penalty."""
    for response in ("print(5)", "```python\nprint(5)\n", "```bash\necho 5\n```", "", None):
        result = compute_score(source, response, ground_truth, format_penalty=-0.1)
        assert result["outcome"] == "format_error" and result["score"] == -0.1, response
        assert result["tests_run"] == 0 and not result["format_ok"] and not result["passed"]


def test_unknown_data_source_names_the_known_ones():
    """Guards against an unknown data_source being silently scored 0 (a misnamed dataset would train on noise)."""
    with pytest.raises(ValueError, match="leetcode_hard") as info:
        compute_score("leetcode_hard", fenced("print(1)"), SUM_PROD)
    for name in ("livecodebench", "taco", "primeintellect", "humaneval", "mbpp", "kodcode", "deepscaler"):
        assert name in str(info.value)
    assert set(KNOWN_DATA_SOURCES) >= {"livecodebench", "codeforces", "aime*"}


@pytest.mark.parametrize(
    ("source", "ground_truth", "extra_info", "message"),
    [
        ("taco", {"inputs": ["1\n", "2\n"], "outputs": ["1\n"]}, None, "2 inputs and 1 outputs"),
        ("apps", '{"inputs": ["1\\n"], "outputs": []}', None, "1 inputs and 0 outputs"),
        ("taco", "{not json", None, "not valid JSON"),
        ("livecodebench", '[{"input": "1", "output"', None, "not valid JSON"),
        ("livecodebench", "[]", None, "non-empty"),
        ("livecodebench", lcb_functional(("1", "1")), None, "func_name"),
        ("livecodebench", lcb_functional(("1", "1")), {"metadata": "{}"}, "func_name"),
        ("primeintellect", [{"input": "1\n"}], None, "input, output"),
        ("humaneval", {"test": HE_TEST}, None, "entry_point"),
        ("mbpp", ["hyp(3, 4)"], None, "assert"),
        ("kodcode", "assert True", None, "def test_"),
    ],
)
def test_malformed_ground_truth_raises_naming_the_problem(source, ground_truth, extra_info, message):
    """Guards against a broken dataset row scoring 0 silently, even when the response has no code to run."""
    for response in (fenced("print(1)"), "no code here"):
        with pytest.raises(ValueError, match=message):
            compute_score(source, response, ground_truth, extra_info)


def test_reward_kwargs_are_validated():
    """Guards against a misspelt reward kwarg or an out-of-range timeout being ignored."""
    with pytest.raises(ValueError, match="timeot"):
        compute_score("livecodebench", fenced("print(1)"), SUM_PROD, timeot=3)
    for bad in (0.5, 12.5, 0):
        with pytest.raises(ValueError, match="timeout"):
            compute_score("livecodebench", fenced("print(1)"), SUM_PROD, timeout=bad)
    for ok in (1, 12):  # both bounds are inclusive (checked without running a program)
        assert compute_score("livecodebench", "no code", SUM_PROD, timeout=ok)["outcome"] == "format_error"
    # verl's reward managers pass these; they must be accepted and ignored.
    result = compute_score("livecodebench", "no code", SUM_PROD, reward_router_address=None,
                           reward_model_tokenizer=None)  # fmt: skip
    assert result["outcome"] == "format_error"


# ---------------------------------------------------------------------------------------------------------------
# Test store
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "stores" / "tests.sqlite")
    rows = [
        ("p1", "livecodebench", json.loads(SUM_PROD)),  # a JSON-able value
        ("p2", "taco", json.dumps({"inputs": ["1\n2 2\n"], "outputs": ["4\n"]})),  # JSON text
        ("p3", "humaneval", {"test": HE_TEST, "entry_point": "running_sum"}),
        ("p4", "deepscaler", "42"),
    ]
    assert write_test_store(path, rows) == 4
    return path


def test_store_reference_dict_and_json_text(store):
    """Guards against a {"problem_id"} reference being graded as an inline ground truth (or not found)."""
    for reference in ({"problem_id": "p1"}, '{"problem_id": "p1"}', ' {"problem_id": "p1"}'):
        right = run("livecodebench", SUM_PROD_RIGHT, reference, test_store=store)
        assert right["outcome"] == "pass" and right["tests_total"] == 3, reference
        assert run("livecodebench", "print(5)\nprint(6)", reference, test_store=store)["tests_run"] == 2
    assert run("taco", MULTI_SUM_RIGHT, {"problem_id": "p2"}, test_store=store)["outcome"] == "pass"
    assert run("humaneval", HE_WRONG, {"problem_id": "p3"}, test_store=store)["outcome"] == "wrong_answer"
    assert compute_score("deepscaler", "\\boxed{42}", {"problem_id": "p4"}, test_store=store)["score"] == 1.0


def test_store_from_env_var_and_reference_store_key(store, monkeypatch):
    """Guards against ignoring VERL_PIPE_TEST_STORE or a reference's own 'store' path."""
    monkeypatch.setenv(TEST_STORE_ENV, store)
    assert run("livecodebench", SUM_PROD_RIGHT, {"problem_id": "p1"})["outcome"] == "pass"
    monkeypatch.delenv(TEST_STORE_ENV)
    assert run("livecodebench", SUM_PROD_RIGHT, {"problem_id": "p1", "store": store})["outcome"] == "pass"


def test_store_missing_id_and_missing_store(store, monkeypatch):
    """Guards against a dangling reference or an unconfigured store being scored 0 instead of raising."""
    with pytest.raises(KeyError, match="p404"):
        compute_score("livecodebench", fenced(SUM_PROD_RIGHT), {"problem_id": "p404"}, test_store=store)
    monkeypatch.delenv(TEST_STORE_ENV, raising=False)
    with pytest.raises(ValueError, match=TEST_STORE_ENV):
        compute_score("livecodebench", fenced(SUM_PROD_RIGHT), {"problem_id": "p1"})
    # Also for math, and even when the response has no code.
    with pytest.raises(ValueError, match="p4"):
        compute_score("deepscaler", "\\boxed{42}", '{"problem_id": "p4"}')


def test_store_inline_object_with_problem_id_and_data_is_not_a_reference(store):
    """Guards against an inline ground truth that merely carries a problem_id field being swapped for a store row."""
    inline = {"problem_id": "p1", "inputs": ["1\n3 3\n"], "outputs": ["6\n"]}
    assert run("taco", MULTI_SUM_RIGHT, inline, test_store=store)["outcome"] == "pass"


def test_store_lru_cache_is_bounded(store):
    """Guards against the per-process ground-truth cache growing without bound or evicting the wrong entry."""
    cache = ProblemTestStore(store, cache_size=2)
    for pid in ("p1", "p2", "p3"):
        assert cache.get(pid)
    assert list(cache._cache) == ["p2", "p3"]
    cache.get("p2")  # p2 becomes most recent, so p3 is evicted next
    cache.get("p4")
    assert list(cache._cache) == ["p2", "p4"]
    assert json.loads(cache.get("p1")) == json.loads(SUM_PROD)
    assert len(cache._cache) == 2 and len(cache) == 4
    with pytest.raises(KeyError, match="nope"):
        cache.get("nope")
    with pytest.raises(FileNotFoundError, match=TEST_STORE_ENV):
        ProblemTestStore(store + ".missing")
