"""LiveCodeBench's import prelude, bound name by name for what a program actually uses.

LiveCodeBench runs ``from string import *`` ... ``from typing import *`` and 18 ``import`` lines in front of
every candidate. Importing all of that costs ~14 ms per program in a fresh sandbox, a third of a whole
15-test grade. :func:`prelude_for` gives an equivalent, smaller prelude: every name the program may load as a
global is bound to exactly the object the full prelude would bind (later lines win, as in the original, so
``pow`` is the builtin, not ``math.pow``), and nothing else. A program that may look names up dynamically
(``eval``, ``exec``, ``compile``, ``__import__``, ``globals()``, ``vars()``, ``dir()``, ``locals()``) gets the
full prelude.

The program is hostile (written by the policy being trained), so it is never compiled here: compiling costs
hundreds of bytes per byte of source and raises ``RecursionError``/``MemoryError`` on deep nesting. The names
come from one linear scan of the source text instead; see :func:`prelude_for`.
"""

from __future__ import annotations

import functools
import importlib
import keyword
import re
import unicodedata

from .suites import LCB_PRELUDE

_DYNAMIC = frozenset({"eval", "exec", "globals", "vars", "dir", "locals", "compile", "__import__"})
_RECURSION = "__import__('sys').setrecursionlimit(50000)\n"
# What the `site` module adds to builtins; the sandbox runs `python -S`, where they do not exist.
_SITE_BUILTINS = frozenset({"exit", "quit", "copyright", "credits", "license", "help"})

# A name, or an attribute: a dot, spaces, a name (`x.count` loads no global `count`). Two unambiguous branches,
# so a failed attempt backtracks at most over the spaces after one dot: linear time.
_ASCII_WORD = r"[A-Za-z_][A-Za-z0-9_]*"
_ASCII_NAME = re.compile(rf"\.[ \t]*{_ASCII_WORD}|{_ASCII_WORD}")
# For a source with non-ASCII characters: outside strings and comments Python allows them only in names, so
# any run of name characters and non-ASCII characters there is exactly one name (before NFKC).
_ANY_WORD = r"[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*"
_ANY_NAME = re.compile(rf"\.[ \t]*{_ANY_WORD}|{_ANY_WORD}")
# The scan goes by chunks of about this many characters, so the matches it holds at once stay few. A chunk ends
# only where no match can run through: at a character that is neither a name character nor a space or tab, or
# at a space or tab right after a name character (an attribute dot's spaces follow a dot or a space).
_CHUNK_CHARS = 1 << 16
_ASCII_CUT = re.compile(r"[^A-Za-z0-9_ \t]|(?<=[A-Za-z0-9_])[ \t]")
_ANY_CUT = re.compile(r"[^A-Za-z0-9_ \t\x80-\U0010ffff]|(?<=[A-Za-z0-9_\x80-\U0010ffff])[ \t]")


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


@functools.lru_cache(maxsize=4)
def _importable(prelude: str) -> tuple[frozenset[str], int]:
    """The names a prelude line can bind by name, and the longest of them and of the dynamic names.
    ``True``, ``False`` and ``None`` are in ``vars(builtins)``, but ``from builtins import True`` is a
    syntax error: keywords are never names."""
    names = frozenset(name for name in _bindings(prelude) if not keyword.iskeyword(name))
    return names, max(len(name) for name in (*names, *_DYNAMIC))


def _names_used(program: str, prelude: str) -> set[str] | None:
    """The prelude's names that ``program`` may load as globals, or ``None`` if it may look names up
    dynamically. One pass of an unambiguous regex, chunk by chunk: time linear in ``len(program)``, memory
    bounded by one chunk's matches and the names the prelude binds."""
    bound, longest = _importable(prelude)
    ascii_only = program.isascii()
    pattern, cut = (_ASCII_NAME, _ASCII_CUT) if ascii_only else (_ANY_NAME, _ANY_CUT)
    names: set[str] = set()
    start = 0
    while start < len(program):
        boundary = cut.search(program, start + _CHUNK_CHARS)
        end = len(program) if boundary is None else boundary.start()
        for name in set(pattern.findall(program, start, end)):
            if name[0] == ".":
                continue  # an attribute
            if not ascii_only and not name.isascii():
                # Python reads names NFKC-normalised (`ｇｃｄ` is `gcd`). NFKC never makes a string shorter
                # unless the result holds a composed (non-ASCII) character, so a longer run is no prelude name.
                if len(name) > longest:
                    continue
                name = unicodedata.normalize("NFKC", name)
            if name in _DYNAMIC:
                return None
            if name in bound:
                names.add(name)
        start = end
    return names


def prelude_for(program: str, prelude: str = LCB_PRELUDE) -> str:
    """The prelude to run before ``program``: the full one, or the lines binding the names it uses.

    The names come from a scan of the source text for identifiers (linear time, memory independent of the
    program's size, nothing to raise), not from compiling it. The scan over-approximates: a name that appears
    only in a string, a comment, a keyword argument or as a local gets bound too. That is safe: every bound
    name is bound to the very object the full prelude binds, and the full prelude, which binds all of them, is
    the reference; a program can only tell a few more bindings apart by inspecting its namespace, which takes
    one of the dynamic names, and then it gets the full prelude. Missing a name the program loads would be
    wrong (a ``NameError`` the full prelude would not raise), so the scan leaves out only identifiers right
    after an attribute dot (``x.count``), which Python never loads as globals, and it reads non-ASCII names
    NFKC-normalised, as Python does. A program that does not compile gets what the scan found; the sandbox
    compiles it and reports the error exactly as it would after the full prelude.

    >>> print(prelude_for("print(gcd(4, 6), sorted('ba').count('a'))"), end="")
    from builtins import print, sorted
    from math import gcd
    __import__('sys').setrecursionlimit(50000)
    """
    if prelude != LCB_PRELUDE:
        return prelude
    names = _names_used(program, prelude)
    if names is None:
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
