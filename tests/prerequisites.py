"""A test whose prerequisite is missing skips on a developer's machine and fails in CI.

The hardening tests need root (tmpfs mounts, the grader's privilege drop), cgroups, seccomp and a bubblewrap that
can make a pid namespace; the vLLM tests need the embedded SmolLM2. On a laptop without one of them the test skips,
saying what is missing. CI (``.ci/run`` sets ``VERL_PIPE_CI=1``) is where every defence must be seen working, so
there the same test fails, naming the missing piece: a green CI run never hides an untested defence in its skips.
"""

from __future__ import annotations

import os

import pytest

CI_ENV = "VERL_PIPE_CI"


def in_ci() -> bool:
    return os.environ.get(CI_ENV) == "1"


def missing(what: str, *, allow_module_level: bool = False) -> None:
    """Skip (a developer's machine) or fail (CI) because ``what`` is missing; never returns."""
    if in_ci():
        pytest.fail(f"{CI_ENV}=1 and a prerequisite of this test is missing: {what}", pytrace=False)
    pytest.skip(what, allow_module_level=allow_module_level)
