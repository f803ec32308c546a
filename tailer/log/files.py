"""Classification of ``_delta_log`` file names, in one place.

Protocol, "Delta Log Entries" / "Checkpoints" and the newer revision's V2
checkpoints and log compaction:

- commit: ``<version:020>.json``
- classic checkpoint: ``<version:020>.checkpoint.parquet``
- multi-part checkpoint: ``<version:020>.checkpoint.<part:010>.<parts:010>.parquet``
- UUID-named (V2) checkpoint: ``<version:020>.checkpoint.<uuid>.json|parquet``
- log compaction: ``<first:020>.<last:020>.compacted.json``
- version checksum: ``<version:020>.crc``
- ``_last_checkpoint``

Anything else (temporary files, hidden files, ``.gitignore``, Hadoop ``.crc``
side files such as ``.00000000000000000000.json.crc``) is ``TEMPORARY`` or
``UNKNOWN`` and never read as log content.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CLASSIC = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTI = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_UUID = re.compile(
    r"^(\d{20})\.checkpoint\.([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})\.(json|parquet)$"
)
_COMPACTED = re.compile(r"^(\d{20})\.(\d{20})\.compacted\.json$")
_CRC = re.compile(r"^(\d{20})\.crc$")


class LogFileKind(enum.Enum):
    """What a file in ``_delta_log`` is."""

    COMMIT = "commit"
    CHECKPOINT_CLASSIC = "checkpoint-classic"
    CHECKPOINT_MULTI_PART = "checkpoint-multi-part"
    CHECKPOINT_UUID = "checkpoint-uuid"
    COMPACTION = "compaction"
    CRC = "crc"
    LAST_CHECKPOINT = "last-checkpoint"
    TEMPORARY = "temporary"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class LogFile:
    """A classified log file name.

    ``version`` is the file's version (for compaction files, the last version
    covered; ``first_version`` is the first). ``part``/``parts`` are set for
    multi-part checkpoints; ``fmt`` is ``json`` or ``parquet`` for checkpoints.
    """

    name: str
    kind: LogFileKind
    version: int = -1
    first_version: int = -1
    part: int = 0
    parts: int = 0
    fmt: str = ""

    @property
    def is_checkpoint(self) -> bool:
        """Whether the file is (part of) a checkpoint."""
        return self.kind in (
            LogFileKind.CHECKPOINT_CLASSIC,
            LogFileKind.CHECKPOINT_MULTI_PART,
            LogFileKind.CHECKPOINT_UUID,
        )


def classify(name: str) -> LogFile:
    """Classify one file name of ``_delta_log`` (a bare name, not a path)."""
    if m := _COMMIT.match(name):
        v = int(m.group(1))
        return LogFile(name, LogFileKind.COMMIT, v, v)
    if m := _CLASSIC.match(name):
        v = int(m.group(1))
        return LogFile(name, LogFileKind.CHECKPOINT_CLASSIC, v, v, 1, 1, "parquet")
    if m := _MULTI.match(name):
        v = int(m.group(1))
        return LogFile(name, LogFileKind.CHECKPOINT_MULTI_PART, v, v, int(m.group(2)), int(m.group(3)), "parquet")
    if m := _UUID.match(name):
        v = int(m.group(1))
        return LogFile(name, LogFileKind.CHECKPOINT_UUID, v, v, 1, 1, m.group(3))
    if m := _COMPACTED.match(name):
        return LogFile(name, LogFileKind.COMPACTION, int(m.group(2)), int(m.group(1)))
    if m := _CRC.match(name):
        v = int(m.group(1))
        return LogFile(name, LogFileKind.CRC, v, v)
    if name == "_last_checkpoint":
        return LogFile(name, LogFileKind.LAST_CHECKPOINT)
    if name.startswith((".", "_")) or ".tmp" in name or name.endswith((".tmp", ".partial")):
        return LogFile(name, LogFileKind.TEMPORARY)
    return LogFile(name, LogFileKind.UNKNOWN)


def start_after_for(version: int) -> str | None:
    """A ``start_after`` name that lists every file of ``version`` and later, and none before it."""
    return None if version <= 0 else f"{version - 1:020d}.~"
