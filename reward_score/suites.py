"""Turn each dataset's ground-truth format into one :class:`TestSuite` the grader runs.

Formats (as in the DeepCoder-Preview-Dataset, LiveCodeBench, TACO, PrimeIntellect, HumanEval, MBPP, KodCode):

* ``livecodebench``: a list of ``{input, output, testtype: stdin|functional}``; functional tests take
  ``func_name`` from ``extra_info`` (or its ``metadata``), and their input is one JSON argument per line.
  All tests run (no cap), as LiveCodeBench does.
* ``taco`` / ``apps`` / ``code_contests``: ``{"inputs": [...], "outputs": [...], "fn_name"?}``; call-based when
  ``fn_name`` is present (inputs are argument lists).
* ``primeintellect``: a list of ``{input, output[, fn_name]}`` (TACO semantics per test).
* ``codeforces``: stdin tests, as a list of ``{input, output}`` or in the TACO dict form.
* ``humaneval`` / ``humanevalplus``: test code defining ``check(candidate)`` plus ``extra_info.entry_point``, and
  the problem's ``prompt`` (its signature and helper functions, which the tests then take from the prompt).
* ``mbpp``: a list of ``assert`` lines (or ``{"test_list": [...], "test_imports": [...]}``).
* ``kodcode``: pytest-style test code (``from solution import f``; ``def test_...``).

For the capped sources the ``max_tests`` tests with the longest inputs are kept (rllm's rule: the long tests
are the strong ones); they then run in dataset order, so cheap sample tests fail a wrong program first.
"""

from __future__ import annotations

import ast
import builtins
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The exact import prelude LiveCodeBench's harness puts in front of every candidate (stdin and call-based).
LCB_PRELUDE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)

TACO_SOURCES = ("taco", "apps", "code_contests", "codecontests")
CAPPED_SOURCES = (*TACO_SOURCES, "primeintellect", "codeforces")
CODE_SOURCES = ("livecodebench", "verl_pipe/easy_code", *TACO_SOURCES, "primeintellect", "codeforces",
                "humaneval", "humanevalplus", "mbpp", "kodcode")  # fmt: skip


@dataclass(frozen=True)
class TestCase:
    stdin: str = ""
    args: list[Any] = field(default_factory=list)
    expected: Any = None  # stdout text (stdin mode) or decoded JSON value (functional); None for assert suites
    # APPS/TACO wrap a call-based return value in a one-element list; their harness accepts either form.
    accept_unwrapped: bool = False


@dataclass(frozen=True)
class TestSuite:
    mode: str  # "stdin" | "functional" | "assert"
    tests: list[TestCase]
    tests_total: int  # before selection
    func_name: str = ""
    prelude: str = ""
    test_code: str = ""
    entry_point: str = ""
    # The problem's prompt code (HumanEval's signature and helpers): trusted, run in the tests' process, and the
    # names it defines there are its own, never the candidate's (the entry point excepted).
    prompt_code: str = ""
    # Every name the test code binds (imports, definitions, assignments): a star import of the candidate's module
    # (`from solution import *`) never rebinds one of them (nor a builtin, nor a module).
    test_binds: tuple[str, ...] = ()


def _as_json(value: Any, what: str) -> Any:
    if isinstance(value, (bytes, str)):
        try:
            return json.loads(value)
        except ValueError as error:
            raise ValueError(f"{what} is not valid JSON ({error}); got {str(value)[:120]!r}") from None
    return value


def _text(value: Any) -> str:
    # TACO stores some stdin inputs/outputs as lists of lines.
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


def _meta_func_name(extra_info: Mapping[str, Any] | None) -> str:
    info = dict(extra_info or {})
    name = info.get("func_name") or info.get("fn_name")
    if not name and info.get("metadata"):
        metadata = _as_json(info["metadata"], "extra_info['metadata']")
        if isinstance(metadata, Mapping):
            name = metadata.get("func_name") or metadata.get("fn_name")
    return str(name or "")


def _select_longest(tests: list[TestCase], max_tests: int | None, key) -> list[TestCase]:
    if not max_tests or len(tests) <= max_tests:
        return tests
    keep = sorted(range(len(tests)), key=lambda i: -len(key(tests[i])))[:max_tests]
    return [tests[i] for i in sorted(keep)]


def _parse_json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def livecodebench_suite(ground_truth: Any, extra_info: Mapping[str, Any] | None) -> TestSuite:
    raw = _as_json(ground_truth, "livecodebench ground_truth")
    if not isinstance(raw, list) or not raw:
        raise ValueError("livecodebench ground_truth must be a non-empty JSON list of {input, output, testtype}")
    kinds = set()
    for test in raw:
        if not isinstance(test, Mapping) or "input" not in test or "output" not in test:
            raise ValueError(f"malformed livecodebench test (needs 'input' and 'output'): {str(test)[:200]}")
        kinds.add(test.get("testtype") or "stdin")
    if len(kinds) != 1 or not kinds <= {"stdin", "functional"}:
        raise ValueError(f"livecodebench tests must all be 'stdin' or all 'functional', got {sorted(kinds)}")
    if kinds == {"stdin"}:
        tests = [TestCase(stdin=str(t["input"]), expected=str(t["output"])) for t in raw]
        return TestSuite("stdin", tests, len(tests), prelude=LCB_PRELUDE)
    func_name = _meta_func_name(extra_info)
    if not func_name:
        raise ValueError("functional livecodebench tests need extra_info['func_name'] (or metadata.func_name)")
    tests = [TestCase(args=_parse_json_lines(str(t["input"])), expected=json.loads(str(t["output"]))) for t in raw]
    return TestSuite("functional", tests, len(tests), func_name=func_name, prelude=LCB_PRELUDE)


def taco_suite(ground_truth: Any, extra_info: Mapping[str, Any] | None, max_tests: int | None) -> TestSuite:
    raw = _as_json(ground_truth, "ground_truth")
    if isinstance(raw, list):  # PrimeIntellect / Codeforces: one dict per test
        if not raw or not all(isinstance(t, Mapping) and "input" in t and "output" in t for t in raw):
            raise ValueError("ground_truth must be a non-empty list of {input, output[, fn_name]} tests")
        fn_names = {t.get("fn_name") for t in raw if t.get("fn_name")}
        raw = {"inputs": [t["input"] for t in raw], "outputs": [t["output"] for t in raw],
               "fn_name": next(iter(fn_names)) if fn_names else None}  # fmt: skip
    if not isinstance(raw, Mapping) or "inputs" not in raw or "outputs" not in raw:
        raise ValueError('ground_truth must be {"inputs": [...], "outputs": [...]} (TACO/APPS format)')
    inputs, outputs = list(raw["inputs"]), list(raw["outputs"])
    if not inputs or len(inputs) != len(outputs):
        raise ValueError(f"ground_truth has {len(inputs)} inputs and {len(outputs)} outputs; need equal, non-zero")
    func_name = str(raw.get("fn_name") or _meta_func_name(extra_info) or "")
    if not func_name:
        tests = [TestCase(stdin=_text(i), expected=_text(o)) for i, o in zip(inputs, outputs, strict=True)]
        return TestSuite("stdin", _select_longest(tests, max_tests, lambda t: t.stdin), len(tests),
                         prelude=LCB_PRELUDE)  # fmt: skip
    tests = []
    for args, expected in zip(inputs, outputs, strict=True):
        args = _as_json(args, "a call-based input") if isinstance(args, str) else args
        expected = _as_json(expected, "a call-based output") if isinstance(expected, str) else expected
        if not isinstance(args, list):
            args = [args]
        tests.append(TestCase(args=args, expected=expected, accept_unwrapped=True))
    selected = _select_longest(tests, max_tests, lambda t: json.dumps(t.args))
    return TestSuite("functional", selected, len(tests), func_name=func_name, prelude=LCB_PRELUDE)


def names_bound_by(code: str) -> frozenset[str]:
    """Every name ``code`` binds anywhere (trusted test code, parsed, never run here): assignment and loop
    targets, definitions, parameters, imports, exception and match names, global/nonlocal declarations."""
    bound: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias) and node.name != "*":
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
    return frozenset(bound)


def names_used_free(code: str) -> frozenset[str]:
    """Names ``code`` loads that it binds nowhere and that are not builtins: what it expects from outside."""
    loaded = {node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name)
              and isinstance(node.ctx, ast.Load)}  # fmt: skip
    return frozenset(loaded - names_bound_by(code) - set(dir(builtins)))


def humaneval_suite(ground_truth: Any, extra_info: Mapping[str, Any] | None) -> TestSuite:
    gt = _as_json(ground_truth, "humaneval ground_truth") if _looks_like_json_object(ground_truth) else ground_truth
    if isinstance(gt, Mapping):
        test_code, entry_point = str(gt.get("test") or ""), str(gt.get("entry_point") or "")
        prompt = str(gt.get("prompt") or "")
    else:
        test_code, entry_point, prompt = str(gt or ""), "", ""
    entry_point = entry_point or str((extra_info or {}).get("entry_point") or "")
    if "def check" not in test_code or not entry_point:
        raise ValueError("humaneval ground_truth needs test code defining check(candidate) and an entry_point "
                         "(in ground_truth {'test', 'entry_point'} or extra_info['entry_point'])")  # fmt: skip
    if prompt:
        try:
            compile(prompt, "<prompt>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as error:
            raise ValueError(f"humaneval ground_truth['prompt'] is not Python code ({error})") from None
    # Only the entry point comes from the candidate; any other name the tests call (HumanEval/32's `poly`) is the
    # prompt's. Without the prompt such a name could only come from the candidate, who could then redefine it.
    missing = sorted(_test_code_names(test_code, "humaneval") - names_bound_by(prompt or "") - {entry_point})
    if missing:
        raise ValueError(f"humaneval tests call {', '.join(missing)}, which the problem's prompt defines: put the "
                         "prompt in ground_truth['prompt'] (the candidate cannot be trusted to define it)")  # fmt: skip
    return TestSuite("assert", [TestCase()], 1, test_code=test_code, entry_point=entry_point, prompt_code=prompt)


def _test_code_names(test_code: str, source: str) -> frozenset[str]:
    try:
        return names_used_free(test_code)
    except (SyntaxError, ValueError) as error:  # the row's fault, not the candidate's: a data error
        raise ValueError(f"{source} test code is not Python code ({error})") from None


def _test_binds(test_code: str, source: str) -> tuple[str, ...]:
    try:
        return tuple(sorted(names_bound_by(test_code)))
    except (SyntaxError, ValueError) as error:
        raise ValueError(f"{source} test code is not Python code ({error})") from None


def mbpp_suite(ground_truth: Any) -> TestSuite:
    gt = _as_json(ground_truth, "mbpp ground_truth") if _looks_like_json(ground_truth) else ground_truth
    if isinstance(gt, Mapping):
        lines = [*gt.get("test_imports", []), gt.get("test_setup_code", ""), *gt.get("test_list", [])]
    elif isinstance(gt, Sequence) and not isinstance(gt, str):
        lines = list(gt)
    else:
        lines = [str(gt)]
    test_code = "\n".join(str(line) for line in lines if line)
    if "assert" not in test_code:
        raise ValueError("mbpp ground_truth needs assert statements (a list, or {'test_list': [...]})")
    return TestSuite("assert", [TestCase()], 1, test_code=test_code, test_binds=_test_binds(test_code, "mbpp"))


def kodcode_suite(ground_truth: Any) -> TestSuite:
    gt = _as_json(ground_truth, "kodcode ground_truth") if _looks_like_json_object(ground_truth) else ground_truth
    test_code = str(gt.get("test") if isinstance(gt, Mapping) else gt)
    if "def test_" not in test_code:
        raise ValueError("kodcode ground_truth must be pytest-style test code with def test_... functions")
    return TestSuite("assert", [TestCase()], 1, test_code=test_code, test_binds=_test_binds(test_code, "kodcode"))


def _looks_like_json(value: Any) -> bool:
    return isinstance(value, str) and value.lstrip()[:1] in ("[", "{")


def _looks_like_json_object(value: Any) -> bool:
    return isinstance(value, str) and value.lstrip()[:1] == "{"


def build_suite(
    data_source: str, ground_truth: Any, extra_info: Mapping[str, Any] | None, max_tests: int | None
) -> TestSuite:
    """The suite for one sample; raises ValueError naming what is wrong with a malformed ground truth."""
    source = data_source.lower()
    if source in ("livecodebench", "verl_pipe/easy_code"):
        return livecodebench_suite(ground_truth, extra_info)
    if source in CAPPED_SOURCES:
        return taco_suite(ground_truth, extra_info, max_tests)
    if source in ("humaneval", "humanevalplus"):
        return humaneval_suite(ground_truth, extra_info)
    if source == "mbpp":
        return mbpp_suite(ground_truth)
    if source == "kodcode":
        return kodcode_suite(ground_truth)
    raise ValueError(f"not a code data_source: {data_source!r}")
