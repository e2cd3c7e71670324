"""LiveCodeBench's import prelude, bound name by name for what a program actually uses.

LiveCodeBench runs ``from string import *`` ... ``from typing import *`` and 18 ``import`` lines in front of
every candidate. Importing all of that costs ~14 ms per program in a fresh sandbox, a third of a whole
15-test grade. :func:`prelude_for` gives an equivalent, smaller prelude: every name the program's code
objects load as a global is bound to exactly the object the full prelude would bind (later lines win, as in the
original, so ``pow`` is the builtin, not ``math.pow``), and nothing else. A program that looks names up
dynamically (``eval``, ``exec``, ``globals()``, ``vars()``, ``dir()``, ``locals()``) gets the full prelude.
"""

from __future__ import annotations

import dis
import functools
import importlib
import types

from .suites import LCB_PRELUDE

_DYNAMIC = frozenset({"eval", "exec", "globals", "vars", "dir", "locals", "compile", "__import__"})
_RECURSION = "__import__('sys').setrecursionlimit(50000)\n"
# What the `site` module adds to builtins; the sandbox runs `python -S`, where they do not exist.
_SITE_BUILTINS = frozenset({"exit", "quit", "copyright", "credits", "license", "help"})


@functools.lru_cache(maxsize=4)
def _bindings(prelude: str) -> dict[str, tuple[str, str | None]]:
    """name -> (module, attribute or None for the module itself), as the prelude leaves them."""
    bound: dict[str, tuple[str, str | None]] = {}
    for line in prelude.splitlines():
        words = line.split()
        if words[:1] == ["from"] and words[2:] == ["import", "*"]:
            module = importlib.import_module(words[1])
            public = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
            if words[1] == "builtins":
                public = [n for n in public if n not in _SITE_BUILTINS]
            for name in public:
                bound[name] = (words[1], name)
        elif words[:1] == ["import"] and len(words) == 2:
            bound[words[1]] = (words[1], None)
    return bound


def _global_names(code: types.CodeType) -> set[str]:
    """Names the code loads as globals (attribute names such as ``.split`` do not count)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_NAME", "LOAD_GLOBAL")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def prelude_for(program: str, prelude: str = LCB_PRELUDE) -> str:
    """The prelude to run before ``program``: the full one, or the lines binding the names it uses.

    >>> print(prelude_for("print(gcd(4, 6), sorted('ba').count('a'))"), end="")
    from builtins import print, sorted
    from math import gcd
    __import__('sys').setrecursionlimit(50000)
    """
    if prelude != LCB_PRELUDE:
        return prelude
    try:
        code = compile(program, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return prelude  # the sandbox reports the error exactly as it would without us
    names = _global_names(code)
    if names & _DYNAMIC:
        return prelude
    by_module: dict[str, list[str]] = {}
    lines = []
    for name in sorted(names):
        binding = _bindings(prelude).get(name)
        if binding is None:
            continue
        module, attribute = binding
        if attribute is None:
            lines.append(f"import {module}\n")
        elif attribute == name:
            by_module.setdefault(module, []).append(name)
    lines += [f"from {module} import {', '.join(names)}\n" for module, names in sorted(by_module.items())]
    return "".join(lines) + _RECURSION
