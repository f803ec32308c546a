"""deltatail's pure core: actions, schema, snapshots, change planning, cursors.

Nothing in this package touches files, the network or the clock. It folds
parsed commits into snapshots and plans changes; :mod:`tailer` does the IO.
"""

from deltatail.state.errors import DeltaTailError

__all__ = ["DeltaTailError"]
