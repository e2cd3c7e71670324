"""Pull the candidate program out of a model response.

Policies often think out loud and paste several drafts; the last fenced Python block is the one the model
settled on, so that is what gets graded. Blocks tagged with another language (``text``, ``bash``...) are
skipped so an example transcript is never executed as the answer.

The response is written by the policy being trained, so the scan costs time linear in its length whatever it
holds: no regular expression (one that backtracks made a 100 KB fence line cost ~40 s), each line looked at
once at most, and only the lines that hold three backticks in a row, found with ``str.find``.
"""

from __future__ import annotations

# A response longer than this is not scanned: it has no answer (``None``, a format error). verl already bounds a
# response by max_response_length tokens (a 32k-token budget is ~130k characters), so this is a backstop for
# any caller: the scan's worst case, a fence on every line, costs ~0.25 s per million characters, ~2 s at the
# cap. Anything shorter is scanned in full, so a response holding an over-long program still reaches the
# grader, which calls that a compile error (grading.MAX_PROGRAM_BYTES, 256 KiB).
MAX_RESPONSE_CHARS = 8 << 20

_PYTHON_TAGS = frozenset({"", "python", "py", "python3"})
_FENCE = "```"


def _language(info: str) -> str:
    # Info strings can carry attributes ("python title=x.py"); only the first word names the language.
    words = info.strip().split()
    return words[0].lower() if words else ""


def _iter_blocks(text: str) -> list[tuple[str, str]]:
    """Return ``(language, body)`` for every closed fenced block, in order of appearance.

    Lines end at ``\\n`` only (a ``\\r`` is part of the line). An opening fence is a line of optional
    spaces/tabs, three or more backticks, then an info string with no backtick. The block's closing fence is
    the next line of optional spaces/tabs, at least as many backticks, optional spaces/tabs and nothing else;
    any other line in between is body. An unterminated fence (usually a truncated generation) ends the scan:
    grading half a program is noise. Tildes are rare in model output and not supported.

    Only a line holding three backticks in a row can open or close a block, so the scan jumps from one such
    line to the next with ``str.find``, and looks at each line once at most: linear time.
    """
    blocks: list[tuple[str, str]] = []
    ticks = 0  # backticks of the open block's fence; 0 outside a block
    language, body_start = "", 0
    pos = 0  # always the start of a line
    while (hit := text.find(_FENCE, pos)) >= 0:
        start = text.rfind("\n", pos, hit) + 1 or pos  # rfind's -1: no newline in between, the line starts at pos
        end = text.find("\n", hit)
        if end < 0:
            end = len(text)
        fence = text[start:end].strip(" \t")
        run = len(fence) - len(fence.lstrip("`"))  # leading backticks, after leading spaces/tabs
        if not ticks:
            if run >= 3 and fence.find("`", run) < 0:
                ticks, language, body_start = run, _language(fence[run:]), end + 1
        elif run == len(fence) and run >= ticks:
            blocks.append((language, text[body_start:start]))
            ticks = 0
        pos = end + 1
    return blocks


def extract_last_python_block(text: str) -> str | None:
    """Return the body of the last fenced block tagged python/py/python3 or left untagged, else ``None``.

    A response longer than :data:`MAX_RESPONSE_CHARS` counts as having no block: ``None``, without a scan.
    Otherwise the time is linear in ``len(text)``.

    >>> extract_last_python_block("a\\n```python\\nprint(1)\\n```\\nb\\n```\\nprint(2)\\n```")
    'print(2)\\n'
    >>> extract_last_python_block("```bash\\nls\\n```") is None
    True
    >>> extract_last_python_block("```python\\n" + "x = 1\\n" * (MAX_RESPONSE_CHARS // 6) + "```") is None
    True
    """
    if not text or len(text) > MAX_RESPONSE_CHARS:
        return None
    for language, body in reversed(_iter_blocks(text)):
        if language in _PYTHON_TAGS and body.strip():
            return body
    return None
