"""Hostile boxed answers against the math reward: none of them runs code, and none of them scores.

verl's ``prime_math.grade_answer`` ends in ``parse_expr``, an ``eval`` of the answer; the negative control
below shows a payload of this file creating its marker file through it (and scoring 1.0). Here every
payload tries to create a marker file in a pytest tmp_path, and must score 0.0 with no marker created, both
through :func:`score_math` (the confined child) and through :func:`math_symbolic.grade_answer` called in
this process, where the gate is the only barrier. Honest answers get verl's verdicts unchanged.
"""

from __future__ import annotations

import builtins
import contextlib
import doctest
import io
import json
import os
import resource
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prerequisites import missing  # noqa: E402
import sympy
from sympy.core.cache import clear_cache
from verl.utils.reward_score.prime_math import _normalize
from verl.utils.reward_score.prime_math import grade_answer as verl_grade_answer

from verl_pipe.reward_score import math_grading, math_symbolic
from verl_pipe.reward_score.math_grading import MAX_ANSWER_CHARS, SYMPY_TIMEOUT_S, score_math
from verl_pipe.reward_score.math_symbolic import MATH_FUNCTION_NAMES, is_safe_expression

MARKER = "4242"  # created relative to the working directory, which each test sets to its tmp_path


def boxed(answer: str) -> str:
    return f"<think>I will be clever.</think> The answer is $\\boxed{{{answer}}}$."


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    clear_cache()  # sympy caches function calls by argument: a payload that ran once would not run again
    monkeypatch.chdir(tmp_path)
    return tmp_path


# Docstrings a payload indexes for letters, by the expression that reaches them; all cost verl's letter count
# nothing ("frac" and "sqrt" are removed before counting).
_DOCS = (("''", str.__doc__), ("frac", sympy.frac.__doc__), ("sqrt", sympy.sqrt.__doc__))


def docstring_payload(code: str, attribute: str = "__ⅾoⅽ__", wrapper: str = "frac") -> str:
    """An answer that makes ``wrapper`` sympify (i.e. eval) ``code``, its letters picked out of docstrings.

    ``__ⅾoⅽ__`` is spelt with Roman numerals: Python folds them to ``d``/``c`` (NFKC), ``str.isalpha`` says
    they are not letters. String literals carry the non-letters. So verl's guard sees one letter: ``o``.
    """
    parts, literal = [], ""
    for ch in code:
        if ch.isalpha():
            if literal:
                parts.append(repr(literal))
                literal = ""
            source, doc = next((source, doc) for source, doc in _DOCS if ch in doc)
            parts.append(f"{source}.{attribute}[{doc.index(ch)}]")
        else:
            literal += ch
    if literal:
        parts.append(repr(literal))
    return f"{wrapper}({'+'.join(parts)})"


def chr_payload(code: str, wrapper: str = "frac") -> str:
    return f"{wrapper}({'+'.join(f'chr({ord(ch)})' for ch in code)})"


OPEN = f"open('{MARKER}','w')"
TOUCH = f"__import__('os').system('touch {MARKER}')"
HALF_AFTER_OPEN = f"[{OPEN},1/2][1]"  # creates the marker, then *is* 1/2
SQRT2_AFTER_OPEN = f"[{OPEN},sqrt(2)][1]"
HALF_SQRT2_AFTER_OPEN = f"[{OPEN},sqrt(2)/2][1]"  # frac() of it is itself

# (answer, ground truth); non-integer truths, so that verl's path would reach sympy.
PAYLOADS = {
    # NFKC: identifiers Python folds to ASCII
    "fullwidth_open": ("ｏｐｅｎ('4242','w')", "1/2"),
    "fullwidth_eval": ("ｅｖａｌ(\"open('4242','w')\")", "1/2"),
    "math_bold_exec": ("𝐞𝐱𝐞𝐜(\"open('4242','w')\")", "1/2"),
    "math_italic_open": ("𝑜𝑝𝑒𝑛('4242','w')", "x+1"),
    "fullwidth_attribute": ("().__ｃｌａｓｓ__.__ｂａｓｅ__.__ｓｕｂｃｌａｓｓｅｓ__()", "1/2"),
    "roman_docstring_half": (docstring_payload(HALF_AFTER_OPEN), "1/2"),
    "roman_docstring_sqrt2": (docstring_payload(HALF_SQRT2_AFTER_OPEN), "\\frac{\\sqrt{2}}{2}"),
    "fullwidth_docstring": (docstring_payload(HALF_AFTER_OPEN, attribute="__ⅾｏⅽ__"), "1/2"),
    "math_bold_docstring": (docstring_payload(HALF_AFTER_OPEN, attribute="__ⅾ𝐨ⅽ__"), "0.5"),
    # underscores and dunders
    "dunder_import": (TOUCH, "1/2"),
    "dunder_subclasses": ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__=='Popen'][0]"
                          f"(['touch','{MARKER}'])", "1/2"),  # fmt: skip
    "dunder_builtins": (f"__builtins__['open']('{MARKER}','w')", "1/2"),
    "getattr_builtins": (f"getattr(__builtins__,'open')('{MARKER}','w')", "1/2"),
    # strings rebuilt from docstrings, then evaluated a second time by sympify
    "ascii_docstring": (docstring_payload(HALF_AFTER_OPEN, attribute="__doc__"), "1/2"),
    "docstring_exec": (docstring_payload(OPEN, wrapper="exec"), "1/2"),
    # strings built with chr()
    "chr_frac": (chr_payload(HALF_AFTER_OPEN), "1/2"),
    "chr_sympify": (chr_payload(HALF_AFTER_OPEN, wrapper="sympify"), "1/2"),
    "chr_eval": (chr_payload(HALF_AFTER_OPEN, wrapper="eval"), "1/2"),
    "chr_S": (chr_payload(OPEN, wrapper="S"), "x+1"),
    # lambda
    "lambda_open": (f"(lambda: {OPEN})()", "1/2"),
    "lambda_touch": (f"(lambda:{TOUCH})()", "1/2"),
    # builtins by name
    "open": (OPEN, "1/2"),
    "exec": (f'exec("{OPEN}")', "1/2"),
    "eval_half": (f'eval("{HALF_AFTER_OPEN}")', "1/2"),
    "compile": (f"eval(compile(\"{OPEN}\",'','eval'))", "1/2"),
    "vars": (f"vars()['open']('{MARKER}','w')", "1/2"),
    # a number glued to a name: the letter run is "jopen", the tokenizer's name is "open"
    "number_glued_open": (f"1jopen('{MARKER}','w')", "1/2"),
    "hex_glued_open": (f"0x1open('{MARKER}','w')", "1/2"),
    # make the comparison pass for a non-integer ground truth
    "pass_half_list": (HALF_AFTER_OPEN, "1/2"),
    "pass_sqrt2_list": (SQRT2_AFTER_OPEN, "\\sqrt{2}"),
    "pass_half_or": (f"{OPEN} and 0 or 1/2", "1/2"),
    "pass_paren_injection": (f"0)if({OPEN})else(0", "1/2"),
    # inside LaTeX
    "latex_text": (f"\\text{{{OPEN}}}", "1/2"),
    "latex_frac": (f"\\frac{{{HALF_AFTER_OPEN}}}{{1}}", "1/2"),
    "latex_sqrt": (f"\\sqrt{{{SQRT2_AFTER_OPEN}}}", "\\sqrt{2}"),
    "latex_text_roman": (f"\\text{{{docstring_payload(HALF_AFTER_OPEN)}}}", "1/2"),
    "latex_left_right": (f"\\left({HALF_AFTER_OPEN}\\right)", "1/2"),
}


def test_payloads_fit_under_the_length_cap():
    # Otherwise the cap, not the gate, would be what rejects them.
    assert all(len(answer) < MAX_ANSWER_CHARS for answer, _ in PAYLOADS.values())


@pytest.mark.parametrize(("answer", "truth"), list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_payload_scores_zero_and_runs_nothing(in_tmp, answer, truth):
    result = score_math(boxed(answer), truth)
    assert result["score"] == 0.0 and result["outcome"] == "wrong_answer"
    assert not (in_tmp / MARKER).exists()


@pytest.mark.parametrize(("answer", "truth"), list(PAYLOADS.values()), ids=list(PAYLOADS))
def test_payload_is_stopped_by_the_gate_alone(in_tmp, answer, truth):
    # In this process, as this user: nothing but the gate stands between the payload and eval.
    assert math_symbolic.grade_answer(answer, truth) is False
    assert not (in_tmp / MARKER).exists()
    assert not is_safe_expression(f"({_normalize(truth)})-({_normalize(answer)})".replace("^", "**"))


# The payloads that get past verl's own guard: given to verl's grade_answer (in a subprocess, so that this one
# stays clean), each creates its marker *and* is graded correct.
VERL_BYPASSES = ["roman_docstring_half", "roman_docstring_sqrt2", "fullwidth_docstring", "math_bold_docstring",
                 "latex_text_roman"]  # fmt: skip
_VERL_SCRIPT = """
import json, os, sys
from verl.utils.reward_score.prime_math import grade_answer
for directory, answer, truth in json.load(sys.stdin):
    os.chdir(directory)
    print("VERDICT", grade_answer(answer, truth))
"""


def test_negative_control_verl_runs_the_payloads_and_scores_them(tmp_path):
    jobs = []
    for name in VERL_BYPASSES:
        (tmp_path / name).mkdir()
        jobs.append([str(tmp_path / name), *PAYLOADS[name]])
    run = subprocess.run(
        [sys.executable, "-c", _VERL_SCRIPT], input=json.dumps(jobs), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    verdicts = [line for line in run.stdout.splitlines() if line.startswith("VERDICT")]
    assert verdicts == ["VERDICT True"] * len(VERL_BYPASSES), run.stdout
    assert [name for name in VERL_BYPASSES if not (tmp_path / name / MARKER).exists()] == []


@pytest.mark.parametrize(
    "answer",
    ["input()", "breakpoint()", "exit()", "quit()", "help()", "open(0).read()", "1jinput()", "copyright()"],
)
def test_interactive_builtins_score_zero_promptly(answer):
    start = time.monotonic()
    assert score_math(boxed(answer), "1/2")["score"] == 0.0
    assert time.monotonic() - start < SYMPY_TIMEOUT_S + 2.0
    assert not is_safe_expression(f"(1/2)-({_normalize(answer)})")


# --- cost -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["9^9^9^9", "9**9**9**9", "(9^9)^(9^9)^(9^9)", "10**10**10"])
def test_huge_exponents_are_cut_off(answer):
    start = time.monotonic()
    assert score_math(boxed(answer), "1/2")["score"] == 0.0
    assert time.monotonic() - start < SYMPY_TIMEOUT_S + 2.0


def test_deeply_nested_parentheses_are_wrong_at_once():
    start = time.monotonic()
    assert score_math(boxed("(" * 100_000 + "1/2" + ")" * 100_000), "1/2")["outcome"] == "wrong_answer"
    assert time.monotonic() - start < 2.0


def test_nesting_under_the_cap_is_not_equal_and_bounded():
    start = time.monotonic()
    assert score_math(boxed("(" * 450 + "1/2" + ")" * 450), "0.5x")["score"] == 0.0
    assert time.monotonic() - start < SYMPY_TIMEOUT_S + 2.0


def test_megabyte_boxed_answer_returns_quickly(in_tmp):
    padding = "+0" * 500_000
    start = time.monotonic()
    result = score_math(boxed(HALF_AFTER_OPEN + padding), "1/2")
    assert time.monotonic() - start < 2.0
    assert result["outcome"] == "wrong_answer" and len(result["answer"]) == 200
    assert not (in_tmp / MARKER).exists()


def test_answers_over_the_cap_are_wrong_even_when_equal():
    honest = "1/2" + "+0" * MAX_ANSWER_CHARS
    assert score_math(boxed(honest), "1/2")["outcome"] == "wrong_answer"
    assert score_math(boxed("1/2" + "+0" * 400), "1/2")["outcome"] == "pass"


# --- the gate -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "(1/2)-(sqrt(2)/2)",
        "(2*x+1)-(1+2*x)",
        "(x**2)-(x*x)",
        "(0.[3])-(1/3)",
        "(3!)-(6)",
        "(2 pi)-(pi+pi)",
        "([1,2])-({1,2})",
        "(1e-3)-(0.001)",
        "(α+1)-(1+α)",
        "(inf)-(oo)",
        "(abc)-(cab)",
        "(ln(2))-(log(2))",
    ],
)
def test_gate_accepts_arithmetic(expr):
    assert is_safe_expression(expr)


@pytest.mark.parametrize(
    "expr",
    [
        "open(0)",
        "1jopen(0)",
        "0x1open(0)",
        "1e5open(0)",
        "x.real",
        "(1).real",
        "1 .real",
        "1..real",
        "x . y",
        "...",
        "__import__",
        "f_x",
        "'a'",
        '"a"',
        "a;b",
        "a:b",
        "a=1",
        "a@b",
        "a#b",
        "a$b",
        "a`b",
        "~a",
        "a&b",
        "a|b",
        "a%b",
        "a<b",
        "a>b",
        "a?b",
        "a\\b",
        "xlambda",
        "1 if x else 2",
        "x or y",
        "x in y",
        "not x",
        "S(1)",
        "N(pi,100)",
        "xN",
        "sympify(x)",
        "preview(x)",
        "var(x)",
        "srepr(x)",
        "chr(97)",
        "ff(x,1)",
        "eye(3)",
        "ｅｖａｌ",
        "ⅽ",
        "𝐞",
        "µ",
        "x\ny",
        "x\ty",
    ],
)
def test_gate_refuses_anything_else(expr):
    assert not is_safe_expression(expr)


def test_known_math_names_are_sympy_math():
    namespace: dict = {}
    exec("from sympy import *", namespace)
    for name in MATH_FUNCTION_NAMES:
        obj = namespace[name] if name in namespace else getattr(builtins, name)
        module = getattr(obj, "__module__", None) or type(obj).__module__
        assert module.startswith(("sympy.core.numbers", "sympy.functions.", "sympy.polys.polytools", "builtins")), name
    for dangerous in ("open", "eval", "exec", "compile", "sympify", "S", "N", "var", "preview", "Symbol", "ff"):
        assert dangerous not in MATH_FUNCTION_NAMES and not is_safe_expression(f"{dangerous}(1)")


# --- honest answers keep verl's verdicts ----------------------------------------------------------------

HONEST = [
    ("\\frac{1}{2}", "0.5"),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("2x+1", "1+2x"),
    ("(1,2)", "(1, 2)"),
    ("x^2", "x**2"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\frac{2}{4}", "\\frac{1}{2}"),  # unreduced: wrong for verl too
    ("2\\pi", "\\pi+\\pi"),
    ("\\sqrt{12}", "2\\sqrt{3}"),
    ("\\frac{1}{3}", "0.333"),
    ("3/2", "1.5"),
    ("(-\\infty, 3)", "(-\\infty,3)"),
    ("[1,2)", "(1,2]"),
    ("(1,2,3)", "(1,2)"),
    ("\\alpha+1", "1+\\alpha"),
    ("e^2", "e*e"),
    ("2i+1", "1+2i"),
    ("3!", "6"),
    ("\\frac{3!}{4}", "1.5"),
    ("0.\\overline{3}", "\\frac{1}{3}"),
    ("x y", "xy"),
    ("\\sqrt{x^2}", "x"),
    ("2^{10}", "1024"),
    ("\\frac{x}{2}", "0.5x"),
    ("\\frac{a+b}{2}", "(a+b)/2"),
    ("5\\sqrt{2}", "\\sqrt{50}"),
    ("\\{1,2\\}", "\\{1, 2\\}"),
    ("1e-3", "0.001"),
    ("x+1", "x-1"),
    ("\\tfrac{\\pi}{4}", "0.25\\pi"),
    ("(x-1)(x+1)", "x^2-1"),
    ("\\sin^2 x", "1-\\cos^2 x"),
    ("\\text{(B)}", "B"),
]


@pytest.mark.parametrize(("answer", "truth"), HONEST)
def test_honest_verdicts_match_verl(answer, truth):
    with contextlib.redirect_stdout(io.StringIO()):  # verl prints on its own timeouts
        expected = verl_grade_answer(answer, truth)
    assert math_symbolic.grade_answer(answer, truth) is expected
    assert score_math(boxed(answer), truth)["passed"] is expected


def test_honest_controls_include_both_verdicts():
    with contextlib.redirect_stdout(io.StringIO()):
        verdicts = {verl_grade_answer(answer, truth) for answer, truth in HONEST}
    assert verdicts == {True, False}


# --- the child shuts itself in --------------------------------------------------------------------------


def _probe(check):
    """A stand-in for grade_answer that reports, through the verdict, whether ``check()`` holds in the child."""

    def fake_grade_answer(answer, truth):
        return bool(check())

    return fake_grade_answer


def _fork_fails():
    try:
        pid = os.fork()
    except OSError:
        return True
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return False


def _stdin_is_devnull():
    return os.fstat(0).st_rdev == os.stat(os.devnull).st_rdev and os.fstat(1).st_rdev == os.stat(os.devnull).st_rdev


def _limits_set():
    cpu = resource.getrlimit(resource.RLIMIT_CPU)
    return (
        resource.getrlimit(resource.RLIMIT_NPROC) == (0, 0)
        and resource.getrlimit(resource.RLIMIT_CORE) == (0, 0)
        and resource.getrlimit(resource.RLIMIT_FSIZE) == (0, 0)
        and resource.RLIM_INFINITY not in resource.getrlimit(resource.RLIMIT_AS)
        and resource.RLIM_INFINITY not in cpu
        and SYMPY_TIMEOUT_S < cpu[0] <= SYMPY_TIMEOUT_S + 5
    )


def _unprivileged():
    if os.getuid() != 0 and os.geteuid() != 0 and os.getresuid() != (math_grading.CHILD_UID,) * 3:
        return True  # the test runs unprivileged; nothing to drop
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        return False
    uid, gid = math_grading.CHILD_UID, math_grading.CHILD_GID
    return os.getresuid() == (uid,) * 3 and os.getresgid() == (gid,) * 3 and os.getgroups() == []


def _memory_capped():
    try:
        bytearray(2 * math_grading.CHILD_MEMORY_HEADROOM_BYTES)
    except MemoryError:
        return True
    return False


@pytest.mark.parametrize(
    "check", [_fork_fails, _stdin_is_devnull, _limits_set, _unprivileged, _memory_capped], ids=lambda f: f.__name__
)
def test_child_is_confined(monkeypatch, check):
    monkeypatch.setattr(math_grading, "grade_answer", _probe(check))
    assert math_grading._sympy_equal_any("x", ["y"], SYMPY_TIMEOUT_S)


def test_child_drops_root(monkeypatch):
    if os.geteuid() != 0:
        missing("root: the privilege drop only happens when the grader runs as root")
    monkeypatch.setattr(math_grading, "grade_answer", _probe(lambda: os.getresuid() == (65534, 65534, 65534)))
    assert math_grading._sympy_equal_any("x", ["y"], SYMPY_TIMEOUT_S)


def test_child_closes_inherited_descriptors(monkeypatch, tmp_path):
    with open(tmp_path / "held", "w") as held:
        fd = held.fileno()

        def closed():
            try:
                os.fstat(fd)
            except OSError:
                return True
            return False

        monkeypatch.setattr(math_grading, "grade_answer", _probe(closed))
        assert math_grading._sympy_equal_any("x", ["y"], SYMPY_TIMEOUT_S)


def test_failed_confinement_means_not_equal(monkeypatch, caplog):
    def refuse(which, value):
        raise OSError("no limits today")

    monkeypatch.setattr(math_grading, "_limit", refuse)
    monkeypatch.setattr(math_grading, "grade_answer", _probe(lambda: True))
    monkeypatch.setattr(math_grading, "_setup_failure_reported", False)
    with caplog.at_level("WARNING", logger=math_grading.__name__):
        assert math_grading._sympy_equal_any("x", ["y"], SYMPY_TIMEOUT_S) is False
        assert math_grading._sympy_equal_any("x", ["y"], SYMPY_TIMEOUT_S) is False
    assert sum("could not confine itself" in record.getMessage() for record in caplog.records) == 1


def test_math_symbolic_docstring_examples():
    failures, attempted = doctest.testmod(math_symbolic, verbose=False)
    assert failures == 0 and attempted > 0


# --- numbers compare exactly -------------------------------------------------------------------------------

# verl's _normalize rounds a number within 1e-7 of an integer to it (truncating 2.99999999 to 2): a policy that
# never finds the answer 0 could box 1e-8 and be right. Each of these verl accepts and we must not.
ROUNDED_TO_THE_TRUTH = [("1e-8", "0"), ("1e-8", "0.0"), ("-5e-9", "0"), ("1,000.00000001", "1000"),
                        ("3.00000001e0", "3"), ("7.00000009", "7")]  # fmt: skip
# ...while a number that is the integer, however written, stays right.
EXACTLY_THE_TRUTH = [("1e3", "1000"), ("1,000", "1000"), ("5.0", "5"), ("0.0", "0"), ("-0", "0"), ("3", "3.00"),
                     ("0.5e1", "5")]  # fmt: skip


@pytest.mark.parametrize(("answer", "truth"), ROUNDED_TO_THE_TRUTH)
def test_a_number_near_an_integer_is_not_that_integer(answer, truth):
    with contextlib.redirect_stdout(io.StringIO()):
        assert verl_grade_answer(answer, truth), "the control: verl's grader accepts it"
    assert not math_symbolic.grade_answer(answer, truth)
    assert score_math(boxed(answer), truth)["outcome"] == "wrong_answer"


@pytest.mark.parametrize(("answer", "truth"), EXACTLY_THE_TRUTH)
def test_an_exact_number_is_still_right(answer, truth):
    assert math_symbolic.grade_answer(answer, truth)
    assert score_math(boxed(answer), truth)["outcome"] == "pass"


def test_a_response_over_the_cap_is_a_format_error_without_a_scan():
    """Extraction costs time linear in the response (seconds at 8 MiB of boxes): over the cap nothing is read."""
    cap = math_grading.MAX_RESPONSE_CHARS
    many_boxes = "\\boxed{1}" * (cap // 9 + 1)
    started = time.process_time()
    result = score_math(many_boxes, "1")
    assert result["outcome"] == "format_error" and time.process_time() - started < 0.05, result
    # under the cap the same text is graded, and the last box is found from the end at once
    started = time.process_time()
    assert score_math(many_boxes[: cap - 9], "1")["outcome"] == "pass"
    assert time.process_time() - started < 0.2
