"""Finding the tables under a directory: every directory holding a ``_delta_log`` (Delta) or Lance manifests.

A Lance dataset is a directory whose ``_versions/`` holds at least one manifest (Lance's naming
rules: :func:`state.lance.manifest.parse_manifest_name`).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from pathlib import Path

from state.errors import ConfigError
from state.lance.manifest import parse_manifest_name
from tailer.storage.uris import is_object_uri


def find_tables(
    root: str, *, include: Sequence[str] = ("*",), exclude: Sequence[str] = (), max_depth: int = 8
) -> list[str]:
    """The tables under ``root`` (absolute paths, sorted): Delta tables and Lance datasets.

    A Delta table is a directory with a ``_delta_log`` subdirectory, a Lance dataset one with a
    manifest in ``_versions/`` (:func:`is_lance_dataset` tells them apart).

    A table's own subdirectories are not searched (a table inside a table is not one);
    hidden directories are skipped. ``include`` and ``exclude`` are glob patterns matched
    against the table's path relative to ``root``.

    Raises:
        ConfigError: if ``root`` is an object-store URI (name those tables one by one) or not a directory.
    """
    if is_object_uri(root):
        raise ConfigError(f"discovery needs a local directory; name object-store tables one by one: {root}")
    base = Path(root)
    if not base.is_dir():
        raise ConfigError(f"discovery root is not a directory: {root}", file=root)
    found: list[str] = []
    start_depth = len(base.parts)
    for directory, subdirs, _ in os.walk(base):
        here = Path(directory)
        if "_delta_log" in subdirs or ("_versions" in subdirs and is_lance_dataset(directory)):
            relative = here.relative_to(base).as_posix()
            if _matches(relative, include) and not _matches(relative, exclude):
                found.append(str(here.resolve()))
            subdirs[:] = []
            continue
        if len(here.parts) - start_depth >= max_depth:
            subdirs[:] = []
            continue
        subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "_")))
    return sorted(found)


def is_lance_dataset(directory: str | Path) -> bool:
    """Whether a local directory holds a Lance dataset (a manifest in ``_versions/``) rather than a ``_delta_log``."""
    base = Path(directory)
    if (base / "_delta_log").is_dir():
        return False
    try:
        names = os.listdir(base / "_versions")
    except OSError:
        return False
    return any(parse_manifest_name(n) is not None for n in names)


def _matches(relative: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(relative, p) for p in patterns)
