"""How verl-pipe changes verl at run time: version-guarded patches, applied when verl imports their target.

Every patch is declared once, as a :class:`VerlPatch`: the verl code it replaces (a *fingerprint*: text that
must still be in that code), why, the upstream change that would make it unnecessary, when it applies, and
whether skipping it would silently change what is trained. The product's patches are one table,
:mod:`verl_pipe.patch_registry`; the benchmark declares its own (:mod:`verl_pipe.bench.latency_hooks`). The
plugin hands each table to :func:`install`, which also makes it what this process checks critical patches
against (:func:`require_patches`, :func:`refuse_if_skipped`).

When verl's code no longer matches a fingerprint, patching it blindly would be worse than not patching, so the
patch is not applied, and then:

* a **correctness-critical** patch that this run needs stops the run with one line naming the verl version,
  the patch and the fix (:class:`CriticalPatchMissing`); ``VERL_PIPE_ALLOW_UNPATCHED=name[,name]`` runs anyway;
* any other patch is skipped with a WARNING (a missing one fails loudly later, or only loses a metric).

Fingerprints are read from verl's source files with ``ast``, without importing the module, so a start-up check
of every critical patch costs milliseconds. With ``VERL_PIPE_PATCH_LEDGER`` set to a folder, each process
appends to it which patches it applied and which of them were called (the end-to-end tests read it).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import logging
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable

from verl_pipe.compat import SetupError, check_verl_version, installed_verl_version
from verl_pipe.import_hooks import when_imported

logger = logging.getLogger("verl_pipe")

_PATCH_MARK = "__verl_pipe_patched__"
ALLOW_UNPATCHED_ENV = "VERL_PIPE_ALLOW_UNPATCHED"
LEDGER_ENV = "VERL_PIPE_PATCH_LEDGER"

# When a critical patch is needed. Each condition is read from the process environment, which every verl
# process of a run shares (Ray workers get it through the job's runtime_env); ``grpo_plus`` depends on the
# config instead and is checked where the config is validated (:func:`require_patches`).
CRITICAL_WHEN = {
    "cpu platform": lambda: os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu",
    "latency model": lambda: bool(os.environ.get("VERL_PIPE_LATENCY_MODEL")),
    "grpo_plus": lambda: False,
}


def _vllm_on_cpu() -> bool:
    """VERL_PLATFORM=cpu with vLLM importable (found, not imported: this runs in every process)."""
    try:
        return CRITICAL_WHEN["cpu platform"]() and importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


# When a patch applies (its ``when``); "always" means every process that loads the plugin.
ACTIVE_WHEN = {
    "always": lambda: True,
    **{k: v for k, v in CRITICAL_WHEN.items() if k != "grpo_plus"},
    # Its patches act only when verl imports its vLLM rollout, i.e. with rollout.name=vllm.
    "vllm on cpu": _vllm_on_cpu,
    # The process a user started as ``python -m verl.trainer.<entrypoint>``, not the workers.
    "verl driver": lambda: is_driver_of_a_verl_run(),
}
# ``trigger`` of a patch applied while the plugin loads rather than when verl imports its target.
AT_PLUGIN_LOAD = "plugin load"


class CriticalPatchMissing(SetupError):
    """A correctness-critical patch cannot be applied to the installed verl; the run must not start."""


@dataclass(frozen=True)
class VerlPatch:
    name: str
    # "module:qualname" of the verl code whose source must contain ``fingerprint`` ("module" alone: the module).
    target: str
    fingerprint: str
    # What goes wrong in verl without the patch, in one line.
    why: str
    # The upstream change that would make the patch unnecessary, in one line.
    upstream: str
    # The function that applies the patch, or its "module:function" (imported only when the patch applies).
    apply: str | Callable[[], None]
    # The module whose import applies the patch (default: the target's module).
    trigger: str = ""
    # When it applies: a key of ACTIVE_WHEN.
    when: str = "always"
    # Set for correctness-critical patches: the CRITICAL_WHEN condition under which the run must not start
    # without it, and what would silently go wrong.
    critical_when: str | None = None
    consequence: str = ""

    @property
    def critical(self) -> bool:
        return self.critical_when is not None

    @property
    def trigger_module(self) -> str:
        return self.trigger or self.target.split(":")[0]

    @property
    def apply_module(self) -> str:
        """The module whose code applies the patch (what the layering test places)."""
        return self.apply.split(":")[0] if isinstance(self.apply, str) else self.apply.__module__

    @property
    def active(self) -> bool:
        """Whether the patch applies in this process (its ``when`` holds)."""
        return ACTIVE_WHEN[self.when]()

    def target_source(self) -> str:
        return _source_of(self.target)

    def matches(self) -> bool:
        """True while verl still contains the code this patch was written against."""
        try:
            return self.fingerprint in self.target_source()
        except (LookupError, OSError, SyntaxError):
            return False

    def run_apply(self) -> None:
        if callable(self.apply):
            self.apply()
            return
        module_name, function_name = self.apply.split(":")
        getattr(importlib.import_module(module_name), function_name)()

    def needed_now(self) -> bool:
        """Whether this process's run must not start without the patch (see CRITICAL_WHEN)."""
        return self.critical_when is not None and CRITICAL_WHEN[self.critical_when]()

    def missing_message(self) -> str:
        found = installed_verl_version()
        return (
            f"verl {found} no longer contains the code that the correctness-critical patch {self.name!r} replaces "
            f"({self.target}), so without it {self.consequence}. Fix: install the verl-pipe release that supports "
            f"verl {found}, or pin the verl version this verl-pipe was built for (see `verl-pipe doctor`); to run "
            f"anyway, set {ALLOW_UNPATCHED_ENV}={self.name}."
        )


@dataclass(frozen=True)
class PatchGroup:
    """Patches that serve one feature, with what they share (a heading and a note in docs/upstream.md)."""

    title: str
    note: str
    patches: tuple[VerlPatch, ...]


def flatten(groups: Iterable[PatchGroup]) -> tuple[VerlPatch, ...]:
    return tuple(patch for group in groups for patch in group.patches)


# --- reading verl's source without importing it ------------------------------------------------------------


def _module_file(module_name: str) -> str:
    """Path of a verl module's source file, found without importing the module or its parent packages."""
    top, _, rest = module_name.partition(".")
    root_spec = importlib.util.find_spec(top)
    if root_spec is None or not root_spec.submodule_search_locations:
        raise LookupError(f"{top} is not installed")
    base = os.path.join(list(root_spec.submodule_search_locations)[0], *rest.split(".")) if rest else None
    for candidate in ([f"{base}.py", os.path.join(base, "__init__.py")] if base else [root_spec.origin]):
        if candidate and os.path.exists(candidate):
            return candidate
    raise LookupError(f"no source file for {module_name}")


@lru_cache(maxsize=None)
def _parsed(path: str) -> tuple[str, ast.Module]:
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    return source, ast.parse(source)


def _source_of(target: str) -> str:
    module_name, _, qualname = target.partition(":")
    source, tree = _parsed(_module_file(module_name))
    if not qualname:
        return source
    node: ast.AST = tree
    for part in qualname.split("."):
        node = _child_named(node, part, target)
    return ast.get_source_segment(source, node) or ""


def _child_named(node: ast.AST, name: str, target: str) -> ast.AST:
    for child in getattr(node, "body", []):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == name:
            return child
        if isinstance(child, (ast.Assign, ast.AnnAssign)):
            targets = child.targets if isinstance(child, ast.Assign) else [child.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return child
    raise LookupError(f"{target}: {name} not found in verl's source")


# --- marking replacements -----------------------------------------------------------------------------------


def mark_patched(original):
    """Mark a replacement as ours and keep the original reachable (``__wrapped__``)."""

    def decorate(fn):
        setattr(fn, _PATCH_MARK, True)
        fn.__wrapped__ = original
        return fn

    return decorate


def is_patched(fn) -> bool:
    return getattr(fn, _PATCH_MARK, False)


# --- what happened, per process -----------------------------------------------------------------------------

# name -> "applied" | "skipped: ..." for the patches this process got to (doctor and tests read it).
STATUS: dict[str, str] = {}
_FIRED: set[str] = set()


def _ledger(event: str, name: str) -> None:
    folder = os.environ.get(LEDGER_ENV)
    if not folder:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as handle:
            handle.write(json.dumps({"patch": name, "event": event}) + "\n")
    except OSError:
        pass  # the ledger is a test aid; it must never disturb a run


def fired(name: str) -> None:
    """Called by a replacement each time it runs; records its first call (cheap after that)."""
    if name not in _FIRED:
        _FIRED.add(name)
        _ledger("fired", name)


def allowed_unpatched() -> set[str]:
    return {n.strip() for n in os.environ.get(ALLOW_UNPATCHED_ENV, "").split(",") if n.strip()}


def apply_patches(patches: Iterable[VerlPatch]) -> list[str]:
    """Apply every patch whose target still matches; returns the names applied.

    A mismatching patch that this run needs (:meth:`VerlPatch.needed_now`) raises
    :class:`CriticalPatchMissing` unless allowed by ``VERL_PIPE_ALLOW_UNPATCHED``; others are skipped loudly.
    """
    check_verl_version()
    applied = []
    for patch in patches:
        if STATUS.get(patch.name) == "applied":
            applied.append(patch.name)  # idempotent: a second call reports what is in place
            continue
        if not patch.matches():
            STATUS[patch.name] = "skipped: verl's code changed"
            _ledger("skipped", patch.name)
            if patch.needed_now() and patch.name not in allowed_unpatched():
                raise CriticalPatchMissing(patch.missing_message())
            logger.warning(
                "verl-pipe: patch %r skipped: %s no longer contains the code it replaces%s (upstream: %s)",
                patch.name,
                patch.target,
                f"; {patch.consequence}" if patch.critical else "",
                patch.upstream,
            )
            continue
        patch.run_apply()
        STATUS[patch.name] = "applied"
        _ledger("applied", patch.name)
        applied.append(patch.name)
    return applied


def missing_critical(patches: Iterable[VerlPatch], condition: str | None = None) -> list[VerlPatch]:
    """Critical patches (all, or those of one ``critical_when`` condition) whose fingerprint no longer matches."""
    allowed = allowed_unpatched()
    return [
        p
        for p in patches
        if p.critical and (condition is None or p.critical_when == condition) and p.name not in allowed
        and not p.matches()
    ]


def refuse_to_start(message: str) -> None:
    """End the process with one line: used where verl would swallow an exception (plugin loading)."""
    print(f"verl-pipe: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


# --- the tables this process installed ---------------------------------------------------------------------

# Every patch handed to :func:`install` in this process, by name: what the critical checks read.
INSTALLED: dict[str, VerlPatch] = {}


def install(patches: Iterable[VerlPatch]) -> None:
    """Apply every active patch of a table: now for plugin-load ones, else as soon as verl imports its trigger."""
    patches = tuple(patches)
    INSTALLED.update((patch.name, patch) for patch in patches)
    apply_patches([p for p in patches if p.active and p.trigger == AT_PLUGIN_LOAD])
    by_trigger: dict[str, list[VerlPatch]] = {}
    for patch in patches:
        if patch.active and patch.trigger != AT_PLUGIN_LOAD:
            by_trigger.setdefault(patch.trigger_module, []).append(patch)
    for module_name, waiting in by_trigger.items():
        when_imported(module_name, lambda _module, waiting=tuple(waiting): apply_patches(waiting))


def preflight(patches: Iterable[VerlPatch]) -> None:
    """Stop a run at start-up if a critical patch its environment needs no longer matches verl (no imports)."""
    patches = tuple(patches)
    for condition, needed in CRITICAL_WHEN.items():
        if needed():
            missing = missing_critical(patches, condition)
            if missing:
                refuse_to_start(missing[0].missing_message())


def _installed_for(condition: str) -> list[VerlPatch]:
    needed = [patch for patch in INSTALLED.values() if patch.critical_when == condition]
    if not needed:  # never vacuous: a process without the plugin's tables cannot vouch for its patches
        raise CriticalPatchMissing(
            f"no patch for {condition!r} is installed in this process, so verl-pipe cannot check the patches "
            "it needs. Fix: import verl (which loads the verl-pipe plugin) before using it, and check that "
            "`verl-pipe doctor` lists the patches."
        )
    return needed


def require_patches(condition: str) -> None:
    """Raise :class:`CriticalPatchMissing` if a critical patch that ``condition`` needs no longer matches."""
    missing = missing_critical(_installed_for(condition), condition)
    if missing:
        raise CriticalPatchMissing(missing[0].missing_message())


def refuse_if_skipped(condition: str) -> None:
    """Backstop where the config is known: raise if this process skipped a critical patch ``condition`` needs."""
    for patch in _installed_for(condition):
        skipped = STATUS.get(patch.name, "").startswith("skipped")
        if skipped and patch.name not in allowed_unpatched():
            raise CriticalPatchMissing(patch.missing_message())


def is_driver_of_a_verl_run() -> bool:
    """True in the process a user started as ``python -m verl.trainer.<entrypoint>``.

    verl loads the plugin while ``python -m`` imports the entrypoint's parent packages, before ``__main__`` is
    the entrypoint, so the command line is read as well.
    """
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        return spec.name.startswith("verl.trainer.")
    argv = list(getattr(sys, "orig_argv", []))
    return any(arg == "-m" and nxt.startswith("verl.trainer.") for arg, nxt in zip(argv, argv[1:]))


def patch_table(patches: Iterable[VerlPatch], import_triggers: bool = True) -> list[str]:
    """One line per patch: when it applies, if it is critical, whether verl still matches it, what happened here.

    With ``import_triggers`` the active patches' trigger modules are imported first (seconds), so "here" says
    whether each one applied in this process rather than that it is waiting for its module.
    """
    patches = tuple(patches)
    if import_triggers:
        for patch in patches:
            if patch.active and patch.trigger != AT_PLUGIN_LOAD:
                try:
                    importlib.import_module(patch.trigger_module)
                except Exception as error:  # noqa: BLE001 - the table reports it instead
                    STATUS.setdefault(patch.name, f"trigger module failed to import: {type(error).__name__}")
    rows = [("patch", "applies", "critical when", "verl code", "here")]
    for patch in patches:
        here = STATUS.get(patch.name, f"waits for {patch.trigger_module}") if patch.active else (
            f"not active (needs {patch.when})"
        )
        rows.append((patch.name, patch.when, patch.critical_when or "-", "matches" if patch.matches() else "CHANGED",
                     here))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4] for row in rows]
