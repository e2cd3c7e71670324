"""Property-based fuzzing of the host-side pieces that read what the policy wrote, before any sandbox:
extracting the program, comparing stdout, choosing the import prelude.

Deterministic (``derandomize=True``) so CI sees the same examples every run; each test takes a few seconds.
"""

from __future__ import annotations

import dis
import re
import time
import types
from decimal import Decimal

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from verl_pipe.reward_score import extract, prelude
from verl_pipe.reward_score.extract import extract_last_python_block
from verl_pipe.reward_score.grading import MAX_NUMERIC_TOKEN_CHARS, stdout_matches
from verl_pipe.reward_score.prelude import prelude_for
from verl_pipe.reward_score.suites import LCB_PRELUDE

# No hypothesis deadline: it times whole examples (the spec regex, the compiler) and flakes on a loaded host. The
# calls whose cost is the property (extraction, comparison) are timed one by one below, against a generous bound.
FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
FEW_BIG = settings(FUZZ, max_examples=40)

# Any text, surrogates and all (a response decoded with errors="surrogateescape" can hold them).
ANY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)
# Text without surrogates: what a tokenizer decodes.
TEXT = st.text(max_size=40)

# ---------------------------------------------------------------------------------------------------------------
# extract_last_python_block
# ---------------------------------------------------------------------------------------------------------------

INFO = st.one_of(
    st.sampled_from(["", "python", "py", "python3", "PYTHON", " python ", "python title=a.py", "bash", "text",
                     "python\r", "\tpy", "`x`", "py`", "python ```", "\u00e9", "python3 \u2028"]),
    TEXT,
)  # fmt: skip
FENCE = st.builds(
    lambda indent, ticks, info, trail: indent + "`" * ticks + info + trail,
    st.sampled_from(["", " ", "\t", "  \t ", " " * 40]),
    st.integers(min_value=3, max_value=6),
    INFO,
    st.sampled_from(["", " ", "\t", " \t"]),
)
LINE = st.one_of(
    FENCE,
    FENCE,
    st.sampled_from(["print(input())", "x = 1", "", "   ", "``", "`", "~~~python", "``` `", "x ```", "\t```"]),
    TEXT,
)
ENDING = st.sampled_from(["\n", "\n", "\n", "\r\n", "\n\n", "\r"])
BODY = st.lists(st.tuples(LINE, ENDING).map("".join), max_size=4).map("".join)
# A block that is usually well formed: an opening fence, a body, a closing fence of at least as many backticks
# (sometimes fewer, with an info string, or with CRLF, which do not close it).
BLOCK = st.builds(
    lambda indent, ticks, info, body, close_indent, extra, trail, end: (
        f"{indent}{'`' * ticks}{info}\n{body}{close_indent}{'`' * max(0, ticks + extra)}{trail}{end}"
    ),
    st.sampled_from(["", " ", "\t"]),
    st.integers(min_value=3, max_value=6),
    INFO,
    BODY,
    st.sampled_from(["", "  ", "\t"]),
    st.sampled_from([0, 0, 0, 1, 2, -1]),
    st.sampled_from(["", "", " ", "\t", "\r", "x"]),
    st.sampled_from(["\n", "\n", "", "\r\n"]),
)
SMALL_RESPONSE = st.lists(st.one_of(BLOCK, st.tuples(LINE, ENDING).map("".join)), max_size=12).map("".join)
# Large responses (up to ~200 KB): one piece repeated, between two small responses.
BIG_RESPONSE = st.builds(
    lambda head, piece, times, tail: head + piece * times + tail,
    SMALL_RESPONSE,
    st.one_of(BLOCK, st.tuples(LINE, ENDING).map("".join), st.sampled_from(["```" + " " * 500 + "`\n", "` ", "`"])),
    st.integers(min_value=1_000, max_value=20_000),
    SMALL_RESPONSE,
).map(lambda text: text[:200_000])


def _old_iter_blocks(text: str) -> list[tuple[str, str]]:
    """The regex scanner the linear one replaced (the spec; quadratic on long crafted lines, so only small
    inputs are checked against it)."""
    fence_open = re.compile(r"^[ \t]*(`{3,})[ \t]*([^\n`]*)$", re.MULTILINE)
    blocks, pos = [], 0
    while (opening := fence_open.search(text, pos)) is not None:
        closing = re.compile(rf"^[ \t]*`{{{len(opening.group(1))},}}[ \t]*$", re.MULTILINE)
        end = closing.search(text, opening.end() + 1)
        if end is None:
            break
        blocks.append((extract._language(opening.group(2)), text[opening.end() + 1 : end.start()]))
        pos = end.end()
    return blocks


# Per call, for inputs up to 200 KB. measured: at most 12 ms idle, 55 ms (comparison: 15 ms) under 2 busy loops;
# a backtracking scan is seconds to hours (the old regex: 3 s on one crafted 30 KB line).
LINEAR_S = 1.0


def _check_extraction(text: str) -> str | None:
    started = time.perf_counter()
    result = extract_last_python_block(text)
    assert time.perf_counter() - started < LINEAR_S
    assert result is None or (isinstance(result, str) and result in text)
    return result


@FUZZ
@given(text=SMALL_RESPONSE)
def test_extraction_of_any_small_response_matches_the_regex_it_replaced(text):
    result = _check_extraction(text)
    assert extract._iter_blocks(text) == _old_iter_blocks(text)
    if result is not None:
        assert result.strip()


@FEW_BIG
@given(text=BIG_RESPONSE)
def test_extraction_of_a_big_response_is_a_quick_substring(text):
    _check_extraction(text)


@FUZZ
@given(text=ANY_TEXT)
def test_extraction_of_arbitrary_text_never_raises(text):
    _check_extraction(text)
    _check_extraction("```python\n" + text + "\n```")


# ---------------------------------------------------------------------------------------------------------------
# stdout_matches
# ---------------------------------------------------------------------------------------------------------------

NUMBER = st.one_of(
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.decimals(allow_nan=True, allow_infinity=True).map(str),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(-(10**6), 10**6), st.integers(-(10**20), 10**20)),
    st.sampled_from(["sNaN", "-sNaN", "sNaN123", "NaN", "-nan", "nan5", "Infinity", "-inf", "+Inf", "1e999999999",
                     "1E+999999999", "0e-999999999999999999", "1e99999999999999999999999", "1_000", "\u0661\u0662",
                     "0.50", "0.5", "-0", "+0.0", ".5", "5.", "1e", "--1", "0x10"]),
    st.integers(min_value=1, max_value=3 * MAX_NUMERIC_TOKEN_CHARS).map(lambda n: "9" * n),
    st.integers(min_value=1, max_value=3 * MAX_NUMERIC_TOKEN_CHARS).map(lambda n: "1." + "0" * n),
)  # fmt: skip
TOKEN = st.one_of(NUMBER, NUMBER, TEXT)
SEPARATOR = st.sampled_from([" ", " ", "  ", "\t", "\n", "\n", "\r\n", "\n\n", " \n", "\u00a0", "\x0b"])
OUTPUT = st.lists(st.tuples(TOKEN, SEPARATOR), max_size=12).map(lambda rows: "".join(a + b for a, b in rows))


def _match(got: str, want: str) -> bool:
    started = time.perf_counter()
    result = stdout_matches(got, want)
    assert time.perf_counter() - started < LINEAR_S
    assert isinstance(result, bool)
    return result


@FUZZ
@given(got=OUTPUT, want=OUTPUT)
def test_stdout_matches_is_total_and_symmetric(got, want):
    assert _match(got, want) == _match(want, got)


@FUZZ
@given(text=st.one_of(OUTPUT, ANY_TEXT))
def test_stdout_matches_is_reflexive(text):
    assert _match(text, text)
    assert _match(text, "\n " + text + " \r\n\n")  # surrounding blank lines and spaces never count


# Finite numbers whose fixed-point form stays far under MAX_NUMERIC_TOKEN_CHARS.
FINITE = st.builds(lambda mantissa, exponent: Decimal(mantissa).scaleb(exponent), st.integers(-(10**20), 10**20),
                   st.integers(-40, 40))  # fmt: skip


@FUZZ
@given(rows=st.lists(st.lists(FINITE, min_size=1, max_size=5), min_size=1, max_size=5))
def test_numerically_equal_output_matches(rows):
    """LiveCodeBench's leniency survives the caps: the same numbers written differently still match."""
    got = "\n".join(" ".join(f"{value:f}" for value in row) for row in rows)
    want = "\n".join("  ".join(f"{value:E}" for value in row) for row in rows)
    assert _match(got, want)
    assert not _match(got, want + " 0")  # one more token on the last line
    assert not _match(got, want + "\n0")  # one more line


# ---------------------------------------------------------------------------------------------------------------
# prelude_for
# ---------------------------------------------------------------------------------------------------------------

NAMES = st.sampled_from([
    "gcd", "print", "deque", "Counter", "heappush", "bisect_left", "accumulate", "reduce", "sqrt", "inf", "pi",
    "e", "math", "sys", "re", "x", "y", "count", "match", "List", "stdin", "lru_cache", "_", "\uff47\uff43\uff44",
    "\U0001d420\U0001d41c\U0001d41d", "\ufb01lter", "\u2119\u2170", "s\u00e9", "eval", "\uff45\uff56\uff41\uff4c",
    "vars", "dir",
])  # fmt: skip
STATEMENT = st.one_of(
    st.builds("{} = {}({})".format, NAMES, NAMES, NAMES),
    st.builds("print({}.{})".format, NAMES, NAMES),
    st.builds("def f({}=1):\n    return {}".format, NAMES, NAMES),
    st.builds("class C:\n    {} = {}".format, NAMES, NAMES),
    st.builds("# {}.\n{}".format, NAMES, NAMES),
    st.builds("s = '{}' + {}".format, NAMES, NAMES),
    st.builds("g = lambda {}: {}".format, NAMES, NAMES),
    st.builds("z = [{0} for {0} in {1}]".format, NAMES, NAMES),
    st.builds("{}.{} = {}".format, NAMES, NAMES, NAMES),
    st.builds("z = ({} .\n    {})".format, NAMES, NAMES),
    st.builds("from math import {}".format, NAMES),
)
PROGRAM = st.lists(STATEMENT, min_size=1, max_size=8).map("\n".join)
PIECES = st.sampled_from(["gcd", "(", ")", "[", ".", " ", "\n", "#", "'", '"', "\\", "\x00", "\ud800", "\udcff",
                          "\uff47\uff43\uff44", "\ufdfa", "lambda ", "-", "\t", "eval", "True", "\u2028"])  # fmt: skip
HOSTILE = st.one_of(
    ANY_TEXT,
    st.lists(PIECES, max_size=60).map("".join),
    st.builds(lambda piece, n, tail: piece * n + tail, PIECES, st.integers(1, 100_000), PROGRAM),
    # Deep nesting: what made compiling in the host raise RecursionError/MemoryError.
    st.builds(lambda op, n, tail: op * n + tail, st.sampled_from(["-", "not ", "(", "[", "lambda: ", "~", "a."]),
              st.integers(1_000, 100_000), st.sampled_from(["1", "gcd", "x", "print(gcd(1, 2))"])),  # fmt: skip
)


def _names_bound_by(prelude_text: str) -> set[str]:
    names: set[str] = set()
    for line in prelude_text.splitlines():
        if line.startswith("from "):
            names.update(part.strip() for part in line.split(" import ", 1)[1].split(","))
        elif line.startswith("import "):
            names.add(line.split()[1])
    return names


def _check_prelude(program: str) -> str:
    result = prelude_for(program)
    assert isinstance(result, str)
    if result != LCB_PRELUDE:
        assert result.endswith(prelude._RECURSION)
        compile(result, "<prelude>", "exec")  # every line is valid Python (no `from builtins import True`)
        bindings = prelude._bindings(LCB_PRELUDE)
        for name in _names_bound_by(result):
            module, attribute = bindings[name]
            assert f"from {module} import " in result if attribute else f"import {module}\n" in result
    return result


def _compiled_globals(code: types.CodeType) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_NAME", "LOAD_GLOBAL")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _compiled_globals(const)
    return names


@FUZZ
@given(program=HOSTILE)
def test_prelude_for_never_raises(program):
    _check_prelude(program)


@FUZZ
@given(program=PROGRAM)
def test_prelude_binds_every_global_the_program_loads(program):
    """The text scan against the compiler (trusted, small programs only): never a missing name."""
    try:
        code = compile(program, "solution.py", "exec", dont_inherit=True)
    except SyntaxError:
        assume(False)
    loaded = _compiled_globals(code)
    result = _check_prelude(program)
    if loaded & prelude._DYNAMIC:
        assert result == LCB_PRELUDE
    if result != LCB_PRELUDE:
        bindable = prelude._importable(LCB_PRELUDE)[0]
        assert loaded & bindable <= _names_bound_by(result)
