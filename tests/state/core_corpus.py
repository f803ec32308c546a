"""Where the tests of the pure core find the shared Delta table corpus.

The corpus lives at ``<repo root>/../shared/delta-tables``. ``tests/corpus.py`` does the same lookup
but is not importable from here without putting ``tests/`` on ``sys.path`` (``tests`` is not a
package), which ``mypy tests/state`` cannot follow; and a ``conftest.py`` here would clash with
``tests/sinks/conftest.py`` under the project's whole-tree mypy run. So this module keeps the same
rules in a few lines: skip when the corpus is absent, fail instead when ``DELTATAIL_REQUIRE_CORPUS=1``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CORPUS_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "delta-tables"
REQUIRE_ENV = "DELTATAIL_REQUIRE_CORPUS"


def corpus_root() -> Path:
    """The corpus directory; skips the calling test when it is absent (fails if it is required)."""
    if (CORPUS_DIR / "manifest.json").is_file():
        return CORPUS_DIR
    why = f"shared Delta table corpus not found at {CORPUS_DIR} (no manifest.json there)"
    if os.environ.get(REQUIRE_ENV, "").strip() == "1":
        pytest.fail(f"{why}, and {REQUIRE_ENV}=1 requires it")
    pytest.skip(f"{why}; set {REQUIRE_ENV}=1 to make this a failure")
