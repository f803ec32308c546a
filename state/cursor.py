"""Positions in a change feed.

A :class:`Position` points at one change row: the commit ``version`` and the
row's ``index`` among that version's change rows (in the deterministic order
the change planner emits them). Rows of an initial snapshot are positions with
``snapshot=True`` at the snapshot's version; they sort before that version's
own (non-snapshot) rows, which never exist, since the initial snapshot *is*
that version. A cursor is the position of the *next* row to deliver, so
resuming is "deliver everything at or after the cursor" — no off-by-one.

A position is written ``VERSION:INDEX`` (``6:0``), and ``VERSION:sINDEX`` (``6:s0``) for a row of
the initial snapshot at that version: :meth:`Position.text` and ``str()``, the one spelling of logs,
errors and ``deltatail status``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deltatail.state.errors import ConfigError, StateError, VersionNotFoundError


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """A row's place in the feed; ordered by ``(version, not snapshot, index)``."""

    version: int
    snapshot_rank: int  # 0 for initial-snapshot rows, 1 for change rows; orders snapshot rows first
    index: int

    @staticmethod
    def change(version: int, index: int) -> Position:
        """The position of change row ``index`` of commit ``version``."""
        return Position(version, 1, index)

    @staticmethod
    def in_snapshot(version: int, index: int) -> Position:
        """The position of row ``index`` of the initial snapshot taken at ``version``."""
        return Position(version, 0, index)

    @property
    def snapshot(self) -> bool:
        """Whether the row belongs to an initial snapshot."""
        return self.snapshot_rank == 0

    @property
    def base_version(self) -> int:
        """The version whose snapshot this position reads on from: its own for snapshot rows, else the one before."""
        return self.version if self.snapshot else self.version - 1

    def text(self) -> str:
        """The position as users write it: ``6:0``, or ``6:s0`` for row 0 of the initial snapshot at version 6."""
        return f"{self.version}:{'s' if self.snapshot else ''}{self.index}"

    def __str__(self) -> str:
        """:meth:`text`: log lines and messages show ``6:0``, not the dataclass's repr."""
        return self.text()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"version", "index", "snapshot"}``."""
        return {"version": self.version, "index": self.index, "snapshot": self.snapshot}

    @staticmethod
    def from_json(raw: Any) -> Position:
        """Parse :meth:`to_json` output.

        Raises:
            StateError: if ``raw`` is not such a dict.
        """
        try:
            version, index, snap = raw["version"], raw["index"], raw["snapshot"]
            if not (type(version) is int and type(index) is int and isinstance(snap, bool)):
                raise TypeError("version and index must be integers, snapshot a boolean")
        except (KeyError, TypeError) as e:
            raise StateError(f"invalid position {raw!r}: {e}") from e
        return Position(version, 0 if snap else 1, index)


def version_range(table: str, starting_version: int, ending_version: int | None, latest: int) -> int:
    """Check a range of versions against the table's latest; returns its last version (``latest`` by default).

    Raises:
        VersionNotFoundError: if the start or the end is after the latest version.
        ConfigError: if the end is before the start.
    """
    end = latest if ending_version is None else ending_version
    if starting_version > latest:
        raise VersionNotFoundError(
            f"starting version {starting_version} is after the latest version {latest}", table=table
        )
    if end < starting_version:
        raise ConfigError(f"ending version {end} is before starting version {starting_version}", table=table)
    if end > latest:
        raise VersionNotFoundError(f"ending version {end} is after the latest version {latest}", table=table)
    return end
