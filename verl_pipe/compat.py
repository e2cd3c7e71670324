"""Supported verl versions and the one-line setup errors verl-pipe raises.

Setup problems (wrong verl, no GPU and no ``VERL_PLATFORM=cpu``, a missing model folder, no bubblewrap) end in
one line that names the fix, not a deep traceback: they raise :class:`SetupError`, and the command-line entry
points print just its message.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from verl_pipe import SUPPORTED_VERL


class SetupError(RuntimeError):
    """A problem with the environment or the inputs that the user fixes; its message names the fix."""


def installed_verl_version() -> Version | None:
    try:
        return Version(version("verl"))
    except PackageNotFoundError:
        return None


def check_verl_version(found: Version | None = None) -> Version:
    """Raise :class:`SetupError` unless the installed verl is in the range verl-pipe was tested against."""
    found = found if found is not None else installed_verl_version()
    if found is None:
        raise SetupError(
            f"verl is not installed: run `make install` (or `pip install 'verl[verl-core]{SUPPORTED_VERL}'`)."
        )
    if found not in SpecifierSet(SUPPORTED_VERL, prereleases=True):
        raise SetupError(
            f"verl {found} is not supported by verl-pipe (needs verl{SUPPORTED_VERL}): "
            f"run `pip install 'verl[verl-core]{SUPPORTED_VERL}'`."
        )
    return found


def exit_on_setup_error(error: SetupError) -> None:
    """Print a setup error as one line and exit with status 2."""
    print(f"verl-pipe: {error}", file=sys.stderr)
    raise SystemExit(2)


def install_one_line_excepthook() -> None:
    """Make an uncaught :class:`SetupError` print one line instead of a traceback (driver process only)."""
    previous = sys.excepthook
    if getattr(previous, "__verl_pipe__", False):
        return

    def hook(exc_type, exc, tb):
        if isinstance(exc, SetupError):
            print(f"verl-pipe: {exc}", file=sys.stderr)
            return
        previous(exc_type, exc, tb)

    hook.__verl_pipe__ = True  # type: ignore[attr-defined]
    sys.excepthook = hook
