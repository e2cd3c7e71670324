"""The package layout the README promises (its Layout section): top-level folders installed under our namespace,
nothing squatted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_trainers_and_reward_score_live_under_the_namespace():
    import verl_pipe.reward_score
    import verl_pipe.trainers

    assert verl_pipe.trainers.__file__ == os.path.join(REPO, "trainers", "__init__.py")
    assert verl_pipe.reward_score.__file__ == os.path.join(REPO, "reward_score", "__init__.py")


def test_wheel_installs_only_the_verl_pipe_namespace(tmp_path):
    """What `pip install verl-pipe` puts into site-packages: verl_pipe/ (with trainers and reward_score inside)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), REPO],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("verl_pipe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"verl_pipe"}, top_level
    assert "verl_pipe/trainers/__init__.py" in names and "verl_pipe/reward_score/__init__.py" in names
    assert "verl_pipe/config/verl_pipe/grpo_plus.yaml" in names  # the GRPO+ hydra preset ships in the wheel
    assert "verl_pipe/data/embedded/problems.jsonl" in names
    # Every module of the source tree ships (a subpackage missing from setup.py's list would not).
    for folder, installed_as in (("verl_pipe", "verl_pipe"), ("trainers", "verl_pipe/trainers"),
                                 ("reward_score", "verl_pipe/reward_score")):  # fmt: skip
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if name.endswith(".py"):
                    relative = os.path.relpath(os.path.join(root, name), os.path.join(REPO, folder))
                    assert f"{installed_as}/{relative}" in names, relative
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "verl_pipe = verl_pipe.register" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_this_suite_is_not_shadowed_by_site_packages_tests(request):
    """TransferQueue's wheel installs a top-level `tests` package (with `tests/e2e`, as ours has); a test module
    imported under the dotted name `tests.e2e...` could resolve to theirs. pytest.ini asks for importlib mode, which
    imports each file by its path: every test module loaded in this session must be one of our files."""
    assert request.config.getoption("importmode") == "importlib", "pytest.ini's --import-mode=importlib is gone"
    ours = os.path.join(REPO, "tests") + os.sep
    loaded = {
        name: os.path.abspath(module.__file__)
        for name, module in list(sys.modules.items())
        if os.path.basename(getattr(module, "__file__", None) or "").endswith("_on_cpu.py")
    }
    assert __name__ in loaded, "this module is not among the loaded test modules"
    foreign = {name: path for name, path in loaded.items() if not path.startswith(ours)}
    assert not foreign, f"test modules loaded from outside {ours}: {foreign}"


# --- layers: no module imports one of a higher layer ------------------------------------------------------------

# Lowest first. A module may import its own layer and the layers below it. The table is what the code does: a
# new module goes where its imports put it, and an import that points up is a design change to discuss, not to
# slip in (the hf rollout server once imported the benchmark's latency model: it now has a timing slot instead).
LAYERS = (
    # foundation: version checks, patch machinery, run-on-import hooks, the JSON report writer, hydra presets, the
    # table of trainer modes, running verl jobs on a private Ray head (the tests and the benchmarks), whether a step's
    # rollout came from the actor's weights
    ("foundation", ("verl_pipe", "verl_pipe.compat", "verl_pipe.import_hooks", "verl_pipe.patching",
                    "verl_pipe.step_metrics", "verl_pipe.reports", "verl_pipe.config", "verl_pipe.trainer_modes",
                    "verl_pipe.local_jobs", "verl_pipe.engine_agreement")),
    # self-contained parts: the reward itself, the rollout extension every platform runs, the CPU backend built on
    # it, placement of pools on Ray nodes, /dev/shm clean-up, local models, GRPO+
    ("components", ("verl_pipe.reward_score", "verl_pipe.rollout", "verl_pipe.backends", "verl_pipe.pool_nodes",
                    "verl_pipe.shm", "verl_pipe.models", "verl_pipe.algorithms")),
    # built on the reward: the reward manager inside verl's reward loop, dataset tooling, run summaries and phase
    # tables
    ("reward plumbing and data", ("verl_pipe.reward_manager", "verl_pipe.data", "verl_pipe.run_metrics",
                                  "verl_pipe.run_profile")),
    # the pipelined modes on verl's V1 trainer: they read the reward manager's per-sample timestamps
    ("trainers", ("verl_pipe.trainers",)),
    # draws what the layers below record
    ("plotting", ("verl_pipe.plot",)),
    # what a user runs: each may drive a trainer, a model, the reward, and plot
    ("commands", ("verl_pipe.quickstart", "verl_pipe.baseline", "verl_pipe.evaluation", "verl_pipe.bench",
                  "verl_pipe.recipe_check", "verl_pipe.chaos", "verl_pipe.gpu_check")),
    # entry points: verl's plugin hook, the table of patches it installs (whose code lives with each feature), the
    # docs written from that table, and the `verl-pipe` command: they reach everything
    ("entry points", ("verl_pipe.register", "verl_pipe.patch_registry", "verl_pipe.patch_docs", "verl_pipe.cli")),
)  # fmt: skip
SOURCE_FOLDERS = {"verl_pipe": "verl_pipe", "trainers": "verl_pipe.trainers", "reward_score": "verl_pipe.reward_score"}


def _source_modules() -> dict[str, str]:
    """Every module of the distribution by its installed name -> its file (what setup.py's package_dir maps)."""
    modules = {}
    for folder, package in SOURCE_FOLDERS.items():
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if name.endswith(".py"):
                    parts = os.path.relpath(os.path.join(root, name), os.path.join(REPO, folder))[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    modules[".".join([package, *parts])] = os.path.join(root, name)
    return modules


def _imports(module: str, path: str, known: set[str]):
    """(line, imported module) for each verl-pipe import in the file, read with ast (nothing is imported)."""
    import ast

    is_package = path.endswith("__init__.py")
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), filename=path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            # `from package import submodule` imports the submodule
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            if target == "verl_pipe" or target.startswith("verl_pipe."):
                yield node.lineno, target


def _layer_of(module: str) -> int | None:
    candidates = [module] + [module.rsplit(".", i)[0] for i in range(1, module.count("."))]
    for candidate in candidates:  # the most specific entry wins; the bare root matches only itself
        for index, (_, members) in enumerate(LAYERS):
            if candidate in members:
                return index
    return None


def test_no_module_imports_a_higher_layer():
    modules = _source_modules()
    unplaced = sorted(m for m in modules if _layer_of(m) is None)
    assert not unplaced, f"modules with no layer (add them to LAYERS in {__file__}): {unplaced}"
    entries = [entry for _, members in LAYERS for entry in members]
    stale = sorted(e for e in entries if not any(m == e or m.startswith(e + ".") for m in modules))
    assert not stale, f"LAYERS names modules that do not exist: {stale}"
    upward, unknown = [], []
    for module, path in sorted(modules.items()):
        layer = _layer_of(module)
        for line, target in _imports(module, path, set(modules)):
            where = f"{os.path.relpath(path, REPO)}:{line}: {module} ({LAYERS[layer][0]}) imports {target}"
            target_layer = _layer_of(target)
            if target_layer is None:
                unknown.append(where)  # e.g. a module renamed without its importers
            elif target_layer > layer:
                upward.append(f"{where} ({LAYERS[target_layer][0]})")
    assert not unknown, "imports of verl-pipe modules that do not exist:\n" + "\n".join(unknown)
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def _cpu_backend_imports(modules: dict[str, str]) -> list[str]:
    """Where a trainer module imports the CPU backend, or names one of its modules (an import by string)."""
    found = []
    for module, path in sorted(modules.items()):
        if not module.startswith("verl_pipe.trainers"):
            continue
        for line, target in _imports(module, path, set(modules)):
            if target.startswith("verl_pipe.backends"):
                found.append(f"{os.path.relpath(path, REPO)}:{line}: imports {target}")
        for number, text in enumerate(open(path, encoding="utf-8"), start=1):
            if "verl_pipe.backends" in text and "import" not in text and not text.lstrip().startswith("#"):
                found.append(f"{os.path.relpath(path, REPO)}:{number}: names {text.strip()[:80]}")
    return found


def test_the_trainers_import_nothing_of_the_cpu_backend(tmp_path):
    """The trainers run on GPU clusters: what they need of a rollout comes from verl_pipe.rollout (every platform),
    never from verl_pipe.backends.cpu (a GPU path that only the CPU backend's classes made work is how
    in_flight_pipeline came to refuse every GPU engine)."""
    modules = _source_modules()
    assert _cpu_backend_imports(modules) == []
    # the control: a trainer module with a planted import of the CPU backend is found
    planted = tmp_path / "planted.py"
    planted.write_text("from verl_pipe.backends.cpu.hf_replica import HFReplica\n", encoding="utf-8")
    found = _cpu_backend_imports({**modules, "verl_pipe.trainers.planted": str(planted)})
    assert found == [f"{os.path.relpath(str(planted), REPO)}:1: imports verl_pipe.backends.cpu.hf_replica"], found


def _patch_tables() -> dict[str, tuple]:
    """Every module that declares patches of verl -> the patches it declares (its module-level tuples of them)."""
    import importlib

    from verl_pipe.patching import VerlPatch

    tables = {}
    for module, path in _source_modules().items():
        if module == "verl_pipe.patching" or "VerlPatch(" not in open(path, encoding="utf-8").read():
            continue
        values = vars(importlib.import_module(module)).values()
        tables[module] = tuple(
            {id(p): p for value in values if isinstance(value, tuple) for p in value if isinstance(p, VerlPatch)}.values()
        )
    return tables


def _upward_apply_targets(tables: dict[str, tuple]) -> list[str]:
    """A table's ``apply`` targets are imports the plugin makes on its behalf: none may point to a higher layer."""
    found = []
    for module, patches in tables.items():
        for patch in patches:
            target_layer, layer = _layer_of(patch.apply_module), _layer_of(module)
            if target_layer is None or target_layer > layer:
                found.append(f"{module} ({LAYERS[layer][0]}) applies {patch.name} from {patch.apply_module}")
    return found


def test_no_patch_table_applies_code_of_a_higher_layer():
    tables = _patch_tables()
    assert set(tables) == {"verl_pipe.patch_registry", "verl_pipe.bench.latency_hooks"}, sorted(tables)
    assert sum(len(patches) for patches in tables.values()) >= 26
    assert _upward_apply_targets(tables) == []
    # the control: the registry placed in the foundation, where it once was, applies code from above it
    from verl_pipe.patching import VerlPatch

    planted = VerlPatch("planted", "verl:x", "x", "why", "upstream", apply="verl_pipe.trainers.patches:_patch_x")
    assert len(_upward_apply_targets({"verl_pipe.patching": (planted,)})) == 1


# A reader of the repo has neither our issue tracker, nor the design notes, nor the numbered source documents the
# project began from: comments and docs say what is true and why, citing public sources, without pointing at those.
OUTSIDE_REFERENCES = re.compile(
    r"\b[Ii]ssues? #?\d+|\bDESIGN\.md\b|\b[Ss]eeds? \d{3}\b|\bshared/(reference|seeds)/|\b[Rr]eference §\d"
)


def _outside_references(paths: list[str]) -> list[str]:
    found = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, 1):
                if OUTSIDE_REFERENCES.search(line):
                    found.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()[:100]}")
    return found


def test_no_comment_or_doc_points_outside_the_repo(tmp_path):
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    texts = [os.path.join(REPO, p) for p in tracked.split()
             if p.endswith((".py", ".md", ".sh", ".yaml", ".cfg", ".toml")) or p in ("Makefile", ".ci/run")]  # fmt: skip
    assert len(texts) > 100
    assert _outside_references(texts) == []
    planted = tmp_path / "planted.py"  # the controls: a comment that cites an issue, or a source document, is found
    planted.write_text("x = 1  # see issue" + " 19\ny = 2  # after seed" + " 004\nz = 3  # reference" + " §4\n")
    assert len(_outside_references([str(planted)])) == 3
