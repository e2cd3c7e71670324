"""The symbolic stage of the math reward: verl's ``prime_math.grade_answer`` decisions, with a gated parse.

verl's ``grade_answer`` ends in ``sympy.parsing.sympy_parser.parse_expr``, which is an ``eval`` of the
normalised answer. Its only guard, ``should_allow_eval``, counts distinct ``str.isalpha`` letters, which lets
through identifiers Python folds to ASCII (NFKC: Roman numerals such as ``ⅽ``/``ⅾ`` are not ``isalpha``),
dunder attributes (``_`` is not a letter), names spelt with the letters of ``sqrt``/``frac`` (removed before
counting), and strings rebuilt from docstrings that a sympy function then ``sympify``-s, i.e. evaluates
again. A policy can run code in the grader that way, and make its own answer count as correct.

:func:`grade_answer` here makes the same decisions in the same order (mathd-normalised strings equal;
``_normalize``-d strings equal; tuple/interval split with the same-bracket rule; fractions must match
textually; an integer never matches a non-integer; otherwise the sympy difference must simplify to 0),
reusing verl's pure string helpers. Only the last step differs: the expression goes to ``parse_expr`` only
if it passes :func:`is_safe_expression`, a gate under which the parse can reach nothing but numbers,
arithmetic, ``Symbol``/undefined functions and a fixed list of sympy math functions. An expression failing
the gate counts as "not equal", exactly like one sympy cannot parse.

Answers longer than :data:`MAX_ANSWER_CHARS` are wrong without any normalisation, so that the string
helpers (and the LaTeX conversion among them) stay cheap on hostile input.
"""

from __future__ import annotations

import builtins
import io
import keyword
import re
import string
import tokenize
import unicodedata
from decimal import Decimal

import sympy
from sympy.parsing import sympy_parser
from verl.utils.reward_score.prime_math import _is_frac, _normalize, _str_is_int, should_allow_eval, split_tuple
from verl.utils.reward_score.prime_math.math_normalize import normalize_answer

__all__ = ["MATH_FUNCTION_NAMES", "MAX_ANSWER_CHARS", "grade_answer", "is_safe_expression", "warm_up"]

MAX_ANSWER_CHARS = 1000
"""Longer answers are wrong outright (no normalisation, no sympy); ground truths are not capped."""

# A number as an answer writes it: digits with an optional fraction, thousands commas, an exponent.
NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][+-]?\d+)?|[+-]?\.\d+(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"-?\d+")


def rounded_to_an_integer(answer: str, normalized: str) -> bool:
    """Whether verl's ``_normalize`` turned a number that is not that integer into it.

    ``_normalize`` rounds any float within 1e-7 of an integer to the integer (and truncates toward zero as it
    does, so ``2.99999999`` becomes ``2``): ``1e-8`` would equal an exact 0. It also strips units, exponent
    and all, so ``11.99999999 cm^2`` becomes ``12``. When the normalised answer is an integer, the answer's
    value is its first number (what follows is a unit and its exponents, a degree sign, a percent sign), and
    that number must be the integer exactly. An answer with no number (``\\pi``, ``\\infty``) did not
    round."""
    if not _INTEGER.fullmatch(normalized):
        return False
    first = NUMBER.search(answer)
    if first is None:
        return False
    try:
        return Decimal(first.group().replace(",", "")) != Decimal(normalized)
    except ArithmeticError:
        return True

# Bound in parse_expr's namespace, and safe to reach: each is a sympy number/constant or a sympy math function
# (or the builtins abs/max/min, which parse_expr maps to sympy's Abs behaviour and Max/Min). None of them
# turns its arguments into code, given that the gate leaves no way to make a string.
MATH_FUNCTION_NAMES = frozenset(
    """
    pi E I oo zoo nan
    sqrt cbrt root exp log ln
    sin cos tan cot sec csc asin acos atan acot asec acsc
    sinh cosh tanh coth sech csch asinh acosh atanh acoth
    frac floor ceiling factorial binomial gcd lcm
    re im arg sign Abs abs conjugate Max Min max min
    """.split()
)

# LaTeX Greek letters reach the parse as these (after verl's lower-casing); each is its own NFKC form, so no
# run of them and ASCII letters can fold into a bound ASCII name. Every other non-ASCII character is refused.
_GREEK = "".join(chr(code) for code in range(ord("α"), ord("ω") + 1))
_LETTERS = string.ascii_letters + _GREEK
_ALLOWED_CHARS = frozenset(string.digits + _LETTERS + " +-*/^()[]{},.!")
# "!" is factorial notation: an ERRORTOKEN for Python 3.11's tokenize, an OP for 3.12's.
_ALLOWED_OPS = frozenset({"+", "-", "*", "**", "/", "//", "(", ")", "[", "]", "{", "}", ",", "!"})
_LETTER_RUN = re.compile(f"[{_LETTERS}]+")
_KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist)
_TRANSFORMATIONS = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)


def _bound_names() -> frozenset[str]:
    """Every name parse_expr's evaluation could resolve to an object: a superset of its global namespace."""
    namespace: dict = {}
    exec("from sympy import *", namespace)  # noqa: S102 - a constant statement: what parse_expr itself binds
    return frozenset(namespace) | frozenset(dir(sympy)) | frozenset(dir(builtins))


_BOUND_NAMES = _bound_names()
if any(ch in _GREEK for name in _BOUND_NAMES for ch in name):
    raise RuntimeError("a name bound in sympy or builtins uses a Greek letter; the gate assumes none does")
# Single letters sympy binds (N, O, Q, S, ...): split_symbols would emit them as bare names inside longer runs.
_BOUND_LETTERS = frozenset(ch for ch in string.ascii_letters if ch in _BOUND_NAMES) - MATH_FUNCTION_NAMES


def _name_is_safe(name: str) -> bool:
    """A known math name, or a name nothing binds (parse_expr turns it into a Symbol or undefined Function)."""
    if name in MATH_FUNCTION_NAMES:
        return True
    return name not in _KEYWORDS and name not in _BOUND_NAMES and not _BOUND_LETTERS.intersection(name)


def is_safe_expression(expr: str) -> bool:
    """True if ``parse_expr(expr)`` can only build numbers, symbols and known math functions of them.

    The rules: characters limited to digits, ASCII letters, lower-case Greek letters (what verl's LaTeX
    conversion makes of ``\\alpha``; each its own NFKC form), space and ``+ - * / ^ ( ) [ ] { } , . !``
    (so no ``_``, quotes, backslash, ``;``, ``:``, ``=``, ``@``, ``#``, ``$``, ``%``, ``&``, ``|``, ``~``,
    ``<``, ``>``, ``?``, backtick); no ``lambda``; a ``.`` only as a decimal point (next to a digit and never
    followed by a letter, so no attribute access); every maximal run of letters, and every name the tokenizer
    sympy uses produces (``1jopen`` is the number ``1j`` and the name ``open``), is a known math name or a
    name that neither builtins nor sympy binds and that is not a keyword; and the tokens are numbers, names,
    arithmetic/bracket/comma operators and ``!`` only.

    >>> is_safe_expression("(sqrt(2)/2)-(1/sqrt(2))"), is_safe_expression("2x+1"), is_safe_expression("0.[3]")
    (True, True, True)
    >>> is_safe_expression("open(0)"), is_safe_expression("1jopen(0)"), is_safe_expression("(1).real")
    (False, False, False)
    """
    if not isinstance(expr, str) or not _ALLOWED_CHARS.issuperset(expr):
        return False
    if unicodedata.normalize("NFKC", expr) != expr:  # a no-op for the characters above; a tripwire
        return False
    if "lambda" in expr:
        return False
    for i, ch in enumerate(expr):
        if ch == ".":
            before = expr[i - 1] if i > 0 else ""
            after = expr[i + 1] if i + 1 < len(expr) else ""
            if not (before.isdigit() or after.isdigit()) or after.isalpha():
                return False
    if not all(_name_is_safe(run) for run in _LETTER_RUN.findall(expr)):
        return False
    # The same tokenizer parse_expr uses (on the same stripped text): the names it sees are what auto_symbol
    # either keeps (bound) or wraps into Symbol(...)/Function(...).
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(expr.strip()).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return False
    for token in tokens:
        if token.type == tokenize.NAME:
            if not _name_is_safe(token.string):
                return False
        elif token.type == tokenize.OP:
            if token.string not in _ALLOWED_OPS:
                return False
        elif token.type == tokenize.ERRORTOKEN:
            if token.string != "!":
                return False
        elif token.type not in (tokenize.NUMBER, tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER):
            return False
    return True


def _equal_under_sympy(truth_elem: str, given_elem: str) -> bool:
    """verl's ``are_equal_under_sympy`` with the gate before the parse; any failure is "not equal"."""
    expr = f"({truth_elem})-({given_elem})"
    if not should_allow_eval(expr):
        return False
    py_expr = expr.replace("^", "**")
    if not is_safe_expression(py_expr):
        return False
    try:
        difference = sympy_parser.parse_expr(py_expr, transformations=_TRANSFORMATIONS)
        return sympy.simplify(difference) == 0
    except Exception:  # noqa: BLE001 - sympy raises anything on odd input; verl counts it as not equal too
        return False


def grade_answer(given_answer: str | None, ground_truth: str) -> bool:
    """True if ``given_answer`` matches ``ground_truth``: verl's ``prime_math.grade_answer`` minus its eval.

    Meant for a disposable process with a deadline (sympy can run for ever on some inputs); it forks nothing
    itself.

    >>> grade_answer("\\\\frac{\\\\sqrt{2}}{2}", "\\\\sqrt{2}/2"), grade_answer("(1,2)", "(1, 3)")
    (True, False)
    """
    if given_answer is None or len(given_answer) > MAX_ANSWER_CHARS:
        return False
    if normalize_answer(ground_truth) == normalize_answer(given_answer):
        return True  # at least as lenient as mathd

    truth_normalized = _normalize(ground_truth)
    given_normalized = _normalize(given_answer)
    if truth_normalized is None:
        return False
    if given_normalized and rounded_to_an_integer(given_answer, given_normalized):
        return False  # numbers compare exactly: 1e-8 is not 0, unless the ground truth lists it
    if truth_normalized == given_normalized:
        return True
    if not given_normalized:
        return False

    truth_elems = split_tuple(truth_normalized)
    given_elems = split_tuple(given_normalized)
    if len(truth_elems) != len(given_elems):
        return False
    if len(truth_elems) > 1 and (
        truth_normalized[0] != given_normalized[0] or truth_normalized[-1] != given_normalized[-1]
    ):
        return False  # (1,2) is not [1,2)
    for truth_elem, given_elem in zip(truth_elems, given_elems):
        if _is_frac(truth_elem) and _is_frac(given_elem):
            equal = truth_elem == given_elem  # an unreduced fraction is not accepted for a reduced one
        elif _str_is_int(truth_elem) != _str_is_int(given_elem):
            equal = False  # an integer answer must match exactly, never via sympy
        else:
            equal = _equal_under_sympy(truth_elem, given_elem)
        if not equal:
            return False
    return True


def warm_up() -> None:
    """Grade a few trusted pairs here, so forked children find sympy's and pylatexenc's lazy imports done.

    The children drop to an unprivileged user that may not be able to read the installed packages.
    """
    for given, truth in (
        ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
        ("2x+1", "1+2x"),
        ("x^2-1", "(x-1)(x+1)"),
        ("\\left(\\frac{1}{2}, \\pi\\right]", "(0.5, \\pi]"),
        ("\\sin^2 x + \\cos^2 x", "1.5-0.5"),
        ("e^{i\\pi}+\\ln(e)", "\\infty"),
        ("(3)!+0.[3]", "6+1/3"),
    ):
        grade_answer(given, truth)
