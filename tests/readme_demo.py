"""The ``make demo`` command lines the README and docs/ tell a user to type, read as make and the quickstart read
them.

``make demo [ROLLOUT=hf|vllm] [ARGS="..."]`` runs ``verl-pipe quickstart --rollout $(ROLLOUT) $(ARGS)`` (Makefile),
so a line's config is what ``verl-pipe quickstart``'s own parser builds from those words. Tests that launch a
documented command build it here, from the pages' text, and never from a copy of it.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
DOCS = os.path.join(REPO, "docs")
MAKEFILE = os.path.join(REPO, "Makefile")


def makefile_default(variable: str) -> str:
    """A ``VAR ?= value`` default of the Makefile (what ``make demo`` uses when the line does not set it)."""
    found = re.search(rf"^{variable}\s*\?=\s*(\S*)\s*$", open(MAKEFILE, encoding="utf-8").read(), flags=re.M)
    assert found, f"the Makefile lost its {variable} ?= default"
    return found.group(1)


@dataclass(frozen=True)
class DemoCommand:
    line: str  # as the README writes it (without a trailing comment)
    rollout: str  # ROLLOUT=..., or the Makefile's default
    args: tuple[str, ...]  # ARGS="...", split as the shell splits it

    def with_args(self, *extra: str) -> "DemoCommand":
        """The same line with more words in ARGS (they come last, as a user would append them)."""
        return DemoCommand(self.line, self.rollout, self.args + tuple(extra))

    def quickstart_argv(self) -> list[str]:
        """What the Makefile's demo target hands ``verl-pipe``."""
        return ["quickstart", "--rollout", self.rollout, *self.args]

    def config(self):
        """The QuickstartConfig ``verl-pipe quickstart`` builds from this line."""
        from verl_pipe.cli import build_parser, quickstart_config

        return quickstart_config(build_parser().parse_args(self.quickstart_argv()))


def parse_demo_command(text: str) -> DemoCommand:
    """``make demo VAR=value ...`` (the rest of a line, a trailing ``# comment`` allowed) as a DemoCommand."""
    words = shlex.split(text, comments=True)
    assert words[:2] == ["make", "demo"], text
    variables = {}
    for word in words[2:]:
        name, equals, value = word.partition("=")
        assert equals and name.isupper(), f"{text!r}: {word!r} is not a make variable"
        variables[name] = value
    unknown = set(variables) - {"ROLLOUT", "ARGS"}
    assert not unknown, f"{text!r} sets {unknown}, which the demo target does not read"
    return DemoCommand(
        line=re.sub(r"\s+#.*$", "", text).strip(),  # the command, without the README's comment
        rollout=variables.get("ROLLOUT", makefile_default("ROLLOUT")),
        args=tuple(shlex.split(variables.get("ARGS", ""))),
    )


def documented_pages() -> list[str]:
    return [README, *sorted(os.path.join(DOCS, name) for name in os.listdir(DOCS) if name.endswith(".md"))]


def readme_demo_commands(paths: list[str] | None = None) -> list[DemoCommand]:
    """Every ``make demo`` command in the README and docs/: inline (```make demo ...```) and on code-block lines."""
    lines: list[str] = []
    for path in paths or documented_pages():
        text = open(path, encoding="utf-8").read()
        # `make demo` itself, not a target named after it (make demo-profile)
        lines += re.findall(r"`(make demo(?![\w-])[^`\n]*)`", text)
        for block in re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S):
            lines += [line for line in block.splitlines() if re.match(r"\s*make demo(?![\w-])", line)]
    # each line once, in the pages' order; ARGS="..." is the placeholder for "your flags", not a command
    return [parse_demo_command(line) for line in dict.fromkeys(lines) if 'ARGS="..."' not in line]


FIRST_SCREEN_LINES = 25


def first_screen_demo() -> DemoCommand:
    """The plain ``make demo`` of the README's first screen: the command a newcomer types first."""
    head = open(README, encoding="utf-8").read().splitlines()[:FIRST_SCREEN_LINES]
    plain = [line for line in head if re.fullmatch(r"make demo\s*(#.*)?", line.strip())]
    assert plain, f"the README's first {FIRST_SCREEN_LINES} lines lost their plain `make demo` line"
    return parse_demo_command(plain[0])
