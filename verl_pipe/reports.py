"""The one way verl-pipe's commands save a JSON report (eval, data curate, baseline, benchmarks)."""

from __future__ import annotations

import json
import os
from typing import Any


def write_json(path: str, report: Any) -> str:
    """Write ``report`` as indented JSON at ``path``, creating its folder; returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
    return path
