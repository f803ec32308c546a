"""Locate the shared Delta table corpus and load its manifest, for tests and expectation generators.

The corpus is the directory ``<repo root>/../shared/delta-tables`` (``MANIFEST.md`` describes it,
``manifest.json`` lists its tables). It is large and shared between checkouts, so it is not part of
this repository: tests that need it skip when it is absent, unless ``DELTATAIL_REQUIRE_CORPUS=1`` is
set (CI sets it), in which case an absent corpus is a test failure.

:func:`find_corpus` and :func:`read_manifest` do not depend on pytest, so scripts can use them too.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

#: The repository root: the parent of ``tests/``.
REPO_ROOT = Path(__file__).resolve().parent.parent

#: Where the corpus is expected to be.
CORPUS_DIR = REPO_ROOT.parent / "shared" / "delta-tables"

#: Set to ``1`` to make a missing corpus a failure instead of a skip.
REQUIRE_ENV = "DELTATAIL_REQUIRE_CORPUS"

ManifestEntry = dict[str, Any]


def find_corpus() -> Path | None:
    """The corpus directory, or ``None`` if it (or its ``manifest.json``) is absent."""
    if (CORPUS_DIR / "manifest.json").is_file():
        return CORPUS_DIR
    return None


def corpus_required() -> bool:
    """Whether ``DELTATAIL_REQUIRE_CORPUS=1`` is set."""
    return os.environ.get(REQUIRE_ENV, "").strip() == "1"


def corpus_root() -> Path:
    """The corpus directory; skips the calling test when it is absent (fails if it is required)."""
    root = find_corpus()
    if root is None:
        why = f"shared Delta table corpus not found at {CORPUS_DIR} (no manifest.json there)"
        if corpus_required():
            pytest.fail(f"{why}, and {REQUIRE_ENV}=1 requires it")
        pytest.skip(f"{why}; set {REQUIRE_ENV}=1 to make this a failure")
    return root


@cache
def read_manifest(root: Path) -> tuple[ManifestEntry, ...]:
    """The parsed ``manifest.json`` of the corpus at ``root`` (one dict per table, in file order)."""
    with (root / "manifest.json").open(encoding="utf-8") as f:
        entries = json.load(f)
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "path" in e for e in entries):
        raise ValueError(f"{root / 'manifest.json'} is not a list of table entries with a 'path'")
    return tuple(entries)


def load_manifest() -> list[ManifestEntry]:
    """The parsed manifest list; skips (or fails, see :func:`corpus_root`) when the corpus is absent."""
    return list(read_manifest(corpus_root()))


def manifest_paths() -> list[str]:
    """Every table path in the manifest, or ``[]`` when the corpus is absent.

    For ``pytest.mark.parametrize`` at collection time, where skipping is not possible: tests
    parametrized over an empty list must still call :func:`corpus_root` somewhere so that the
    absence is reported (pytest reports an empty parametrization as a skip).
    """
    root = find_corpus()
    return [] if root is None else [e["path"] for e in read_manifest(root)]


def table_root(path: str) -> Path:
    """The table root directory of manifest entry ``path`` (skips/fails like :func:`corpus_root`)."""
    return corpus_root() / path


def corpus_table(relative: str) -> Path:
    """A corpus table root; skips when the corpus or the table is absent (fails under DELTATAIL_REQUIRE_CORPUS=1)."""
    root = corpus_root() / relative
    if not root.is_dir():
        if corpus_required():
            pytest.fail(f"corpus table {root} is missing and DELTATAIL_REQUIRE_CORPUS=1")
        pytest.skip(f"corpus table {root} is not present (set DELTATAIL_REQUIRE_CORPUS=1 to require it)")
    return root
