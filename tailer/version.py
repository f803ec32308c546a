"""The installed distribution's version: what ``deltatail --version`` prints and ``deltatail.__version__`` holds.

A module of its own, importing only the standard library, so that the version is known without
importing the command line or pyarrow (``deltatail --version`` answers in the interpreter's start-up time).
"""

from __future__ import annotations

import importlib.metadata


def installed_version() -> str:
    """The installed distribution's version (``unknown`` when deltatail runs from a source tree not installed)."""
    try:
        return importlib.metadata.version("deltatail")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
