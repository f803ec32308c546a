"""Bytecode for the ``deltatail`` processes the suite starts (a pytest plugin, ``-p bytecode`` in addopts).

The suite starts the ``deltatail`` command hundreds of times. A wheel's modules are compiled when
pip installs it; a source checkout installed editable is compiled on first import, and the bytecode
written beside the source, unless ``PYTHONDONTWRITEBYTECODE`` is set (it is on the development and CI
machines): then every child compiles every deltatail module it imports, about 0.3 s of CPU a start.
Python still reads up-to-date bytecode with the variable set; it only stops writing it. So the
controller compiles the product's sources once when the session starts (``compileall``: only what is
missing or out of date; ``__pycache__`` is ignored by git), and every child, worker and test
launcher reads bytecode as a wheel user's process does.
"""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The product's source folders (``deltatail/`` holds the entry points and links to the other three,
#: which ``compileall`` does not follow).
SOURCES = ("deltatail", "state", "tailer", "sinks")


def compile_sources(root: Path = ROOT) -> bool:
    """Compile the product's modules that have no up-to-date bytecode; whether every one compiled."""
    return all(compileall.compile_dir(root / name, quiet=1) for name in SOURCES if (root / name).is_dir())


def pytest_configure(config: pytest.Config) -> None:
    """In the controller (not in an xdist worker, which it starts later), compile the sources."""
    if not hasattr(config, "workerinput"):
        compile_sources()
