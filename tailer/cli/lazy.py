"""Code of the command line loaded when a command runs, not when the program starts.

Every command's parser is built on every start; a command's module (and the code behind it) is
imported only when that command runs, through :func:`deferred`. The module paths it is given are
edges of the import graph all the same (``tests/test_layers.py`` reads them).
"""

from __future__ import annotations

import importlib
from typing import Any

EXIT_ALERTS = 3
"""The exit code of ``audit --fail-on SEVERITY`` when an alert of at least that severity was raised."""


def deferred(module: str, name: str) -> Any:
    """``module.name``, importing ``module`` now: a command's code is loaded only when the command runs.

    For the command line's own modules only (``tailer/cli/``): the start of every other command
    does not pay for them.
    """
    return getattr(importlib.import_module(module), name)
