"""Run a callback right after a module is imported, or at once if it already is.

verl loads our plugin on every ``import verl``, in every process. Importing the verl modules we extend
(core_algos, the engine workers, the trainers) at that moment would add seconds to each process, including
the many that never train; so registrations and patches wait for their target module to be imported, and
run the moment it is.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
import threading
from typing import Callable

from verl_pipe.compat import SetupError

logger = logging.getLogger("verl_pipe")

_CALLBACKS: dict[str, list[Callable[[object], None]]] = {}
_LOCK = threading.RLock()


def _run(module_name: str, module) -> None:
    for callback in _CALLBACKS.pop(module_name, []):
        try:
            callback(module)
        except SetupError:
            raise  # deliberate: e.g. a correctness-critical patch no longer matches verl; the run must stop
        except Exception as error:  # noqa: BLE001 - an import must not fail because of us; report loudly
            logger.warning(
                "verl-pipe: setting up %s after import failed: %s: %s",
                module_name,
                type(error).__name__,
                error,
                exc_info=True,
            )


class _CallbackLoader(importlib.abc.Loader):
    """Delegates to the real loader and runs the callbacks once the module has executed."""

    def __init__(self, loader, module_name: str):
        self._loader = loader
        self._module_name = module_name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self._loader  # inspect/linecache see the real loader
        self._loader.exec_module(module)
        with _LOCK:
            _run(self._module_name, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def spec_with_wrapped_loader(skip, fullname, path, target, wrap: Callable):
    """The spec the other meta-path finders (all but ``skip``) give ``fullname``, its loader wrapped by ``wrap``."""
    for finder in sys.meta_path:
        if finder is skip or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = wrap(spec.loader)
            return spec
    return None


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _CALLBACKS:
            return None
        return spec_with_wrapped_loader(self, fullname, path, target, lambda loader: _CallbackLoader(loader, fullname))


_FINDER = _PostImportFinder()


def when_imported(module_name: str, callback: Callable[[object], None]) -> None:
    """Call ``callback(module)`` once ``module_name`` has been imported (now, if it already has)."""
    with _LOCK:
        module = sys.modules.get(module_name)
        if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
            _CALLBACKS.setdefault(module_name, []).append(callback)
            _run(module_name, module)
            return
        _CALLBACKS.setdefault(module_name, []).append(callback)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
