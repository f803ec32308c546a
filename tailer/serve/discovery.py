"""Finding the tables under a directory: every directory a table format claims.

A Delta table holds a ``_delta_log``, a Lance dataset a ``_versions/`` with at least one manifest
(:meth:`~tailer.formats.base.TableFormat.claims` of each format in the registry).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from pathlib import Path

from deltatail.state.errors import ConfigError
from deltatail.tailer.formats.registry import claimed
from deltatail.tailer.storage.uris import is_object_uri


def find_tables(
    root: str, *, include: Sequence[str] = ("*",), exclude: Sequence[str] = (), max_depth: int = 8
) -> list[str]:
    """The tables under ``root`` (absolute paths, sorted): the directories a format claims.

    A directory is a table when a format of :data:`~tailer.formats.registry.FORMATS` claims it
    (:func:`~tailer.formats.registry.claimed`): a Delta table has a ``_delta_log`` subdirectory, a
    Lance dataset a manifest in ``_versions/``.

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
        if claimed(directory) is not None:
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


def _matches(relative: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(relative, p) for p in patterns)
