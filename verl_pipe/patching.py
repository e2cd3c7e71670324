"""Version-guarded monkeypatches of verl: the one mechanism every verl-pipe patch goes through.

A :class:`VerlPatch` carries a fingerprint of the verl source it replaces, so a verl that changed underneath
us is detected (by a test, and at run time) instead of being patched blindly, and names the upstream fix it
stands in for. :func:`apply_patches` applies those whose fingerprint still matches and skips the others with
a WARNING: patching code we have not read would be worse than running without the patch.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass
from typing import Callable, Iterable

from verl_pipe.compat import check_verl_version

logger = logging.getLogger("verl_pipe")

_PATCH_MARK = "__verl_pipe_patched__"


@dataclass(frozen=True)
class VerlPatch:
    name: str
    # "module:qualname" of the verl function whose source must contain `fingerprint`.
    target: str
    fingerprint: str
    # Why verl needs this: the upstream change that would make the patch unnecessary, in one line.
    upstream: str
    apply: Callable[[], None]

    def target_source(self) -> str:
        module_name, qualname = self.target.split(":")
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        while hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__
        return inspect.getsource(obj)

    def matches(self) -> bool:
        """True while verl still contains the code this patch was written against."""
        return self.fingerprint in self.target_source()


def mark_patched(original):
    """Mark a replacement as ours and keep the original reachable (``__wrapped__``) for fingerprinting."""

    def decorate(fn):
        setattr(fn, _PATCH_MARK, True)
        fn.__wrapped__ = original
        return fn

    return decorate


def is_patched(fn) -> bool:
    return getattr(fn, _PATCH_MARK, False)


def apply_patches(patches: Iterable[VerlPatch], group: str) -> list[str]:
    """Apply every patch whose target still matches; returns the names applied."""
    check_verl_version()
    applied = []
    for patch in patches:
        if not patch.matches():
            logger.warning(
                "verl-pipe: %s patch %r skipped: %s no longer contains the code it replaces (upstream: %s)",
                group,
                patch.name,
                patch.target,
                patch.upstream,
            )
            continue
        patch.apply()
        applied.append(patch.name)
    return applied
