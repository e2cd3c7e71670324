"""docs/upstream.md and the README's paragraph on patches are written from the patch tables and kept current."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

from verl_pipe import patch_docs, patch_registry
from verl_pipe.bench.latency_hooks import LATENCY_MODEL_PATCHES
from verl_pipe.patch_registry import PATCHES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _copy_of_the_docs(tmp_path) -> str:
    (tmp_path / "docs").mkdir()
    for relative in (patch_docs.README, patch_docs.UPSTREAM_DOC):
        shutil.copy(os.path.join(REPO, relative), tmp_path / relative)
    return str(tmp_path)


def test_the_generated_docs_are_current():
    assert patch_docs.stale_files(REPO) == [], "run `make docs` and commit the result"


def test_every_patch_has_its_section_and_the_readme_counts_them():
    page = patch_docs.upstream_markdown()
    for patch in PATCHES + LATENCY_MODEL_PATCHES:
        assert f"### {patch.name}" in page and patch.fingerprint in page
    summary = " ".join(patch_docs.readme_summary().split())
    assert f"{len(PATCHES)} patches, all in one table" in summary
    assert "eight of its own, installed only inside `make bench`" in summary


def test_a_changed_table_makes_the_docs_stale_until_regenerated(tmp_path, monkeypatch, capsys):
    """The control: edit one entry's text, or add an entry, and the check fails; `make docs`'s command fixes it."""
    repo = _copy_of_the_docs(tmp_path)
    assert patch_docs.main(["--check", "--repo", repo]) == 0
    edited = dataclasses.replace(patch_registry.PRIVATE_STATE.patches[0], upstream="a brand-new upstream change")
    monkeypatch.setattr(patch_registry, "GROUPS", (*patch_registry.GROUPS[:-1],
                                                   dataclasses.replace(patch_registry.PRIVATE_STATE,
                                                                       patches=(edited, *PATCHES[:1]))))  # fmt: skip
    assert patch_docs.stale_files(repo) == [patch_docs.UPSTREAM_DOC, patch_docs.README]
    assert patch_docs.main(["--check", "--repo", repo]) == 1
    assert "out of date: docs/upstream.md (run `make docs`)" in capsys.readouterr().err
    assert patch_docs.main(["--repo", repo]) == 0
    assert patch_docs.stale_files(repo) == []
    assert "a brand-new upstream change" in (tmp_path / "docs" / "upstream.md").read_text()


def test_a_readme_without_its_markers_is_named(tmp_path):
    repo = _copy_of_the_docs(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace(patch_docs.README_END, ""))
    with pytest.raises(ValueError, match="README.md has lost its generated-patches markers"):
        patch_docs.stale_files(repo)


def test_doctor_markdown_prints_the_page(capsys):
    from verl_pipe.cli import main

    assert main(["doctor", "--markdown"]) == 0
    with open(os.path.join(REPO, patch_docs.UPSTREAM_DOC), encoding="utf-8") as handle:
        assert capsys.readouterr().out == handle.read()
