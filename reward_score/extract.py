"""Pull the candidate program out of a model response.

Policies often think out loud and paste several drafts; the last fenced Python block is the one the model
settled on, so that is what gets graded. Blocks tagged with another language (``text``, ``bash``...) are
skipped so an example transcript is never executed as the answer.
"""

from __future__ import annotations

import re

# An opening fence is three or more backticks at the start of a line followed by an optional info string;
# the closing fence must use at least as many backticks. Tildes are rare in model output and not supported.
_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,})[ \t]*([^\n`]*)$", re.MULTILINE)

_PYTHON_TAGS = frozenset({"", "python", "py", "python3"})


def _language(info: str) -> str:
    # Info strings can carry attributes ("python title=x.py"); only the first word names the language.
    words = info.strip().split()
    return words[0].lower() if words else ""


def _iter_blocks(text: str) -> list[tuple[str, str]]:
    """Return ``(language, body)`` for every closed fenced block, in order of appearance."""
    blocks: list[tuple[str, str]] = []
    pos = 0
    while True:
        opening = _FENCE_OPEN.search(text, pos)
        if opening is None:
            return blocks
        ticks = len(opening.group(1))
        closing = re.compile(rf"^[ \t]*`{{{ticks},}}[ \t]*$", re.MULTILINE)
        body_start = opening.end() + 1
        end = closing.search(text, body_start)
        if end is None:
            # An unterminated fence is usually a truncated generation; grading half a program is noise.
            return blocks
        blocks.append((_language(opening.group(2)), text[body_start : end.start()]))
        pos = end.end()


def extract_last_python_block(text: str) -> str | None:
    """Return the body of the last fenced block tagged python/py/python3 or left untagged, else ``None``.

    >>> extract_last_python_block("a\\n```python\\nprint(1)\\n```\\nb\\n```\\nprint(2)\\n```")
    'print(2)\\n'
    >>> extract_last_python_block("```bash\\nls\\n```") is None
    True
    """
    if not text:
        return None
    for language, body in reversed(_iter_blocks(text)):
        if language in _PYTHON_TAGS and body.strip():
            return body
    return None
