"""docs/cpu.md's "Running verl on CPU" override blocks are exactly what ``cpu_backend_overrides()`` returns.

Users copy those lines into their own verl commands; a key added to the code but not to the page (or the other
way round) would silently give them a different run than the plugin's own.
"""

from __future__ import annotations

import os
import re
import shlex

from verl_pipe.backends.cpu.overrides import CpuBackendConfig, cpu_backend_overrides

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "cpu.md")
SECTION = "## Running verl on CPU"
COMMAND_HEAD = "<your usual overrides>"


def _section_bash_blocks() -> list[str]:
    text = open(PAGE, encoding="utf-8").read()
    assert SECTION in text, f"docs/cpu.md lost its {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def _tokens(block: str) -> list[str]:
    return shlex.split(block.replace("\\\n", " "))


def test_the_documented_cpu_override_list_is_exactly_cpu_backend_overrides():
    blocks = _section_bash_blocks()
    assert len(blocks) == 2, f"expected the CPU list and the separate-pool addition, found {len(blocks)} blocks"
    head, _, listed = blocks[0].partition(COMMAND_HEAD)
    assert listed, f"the first block must be a verl command with {COMMAND_HEAD!r}, then the list"
    assert "VERL_PLATFORM=cpu" in head
    assert _tokens(listed) == cpu_backend_overrides()
    # The separate-pool lines are what sampler_ranks=1 appends to that same list.
    assert _tokens(listed) + _tokens(blocks[1]) == cpu_backend_overrides(CpuBackendConfig(sampler_ranks=1))
