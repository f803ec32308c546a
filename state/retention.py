"""How long a version stays readable under the table's retention settings. Pure.

A tailer behind its table needs each undelivered version's commit file (to plan it) and
the data files it adds and removes (to read its rows). Two table properties bound how long
a writer keeps them:

- ``delta.logRetentionDuration`` (default ``interval 30 days``): how long log entries are
  kept before metadata cleanup may delete them. The protocol: "Checkpoints ... allow
  metadata cleanup to delete expired JSON Delta log entries", and cleanup "must ensure a
  checkpoint for the oldest table version retained, which covers all deleted Delta log
  entries".
- ``delta.deletedFileRetentionDuration`` (default ``interval 1 week``): how long a removed
  file is kept. The protocol: "Data files that are no longer present in the latest version
  of the table can be lazily deleted by the vacuum command after a user-specified
  retention period (default 7 days)", and "A tombstone expires when current time
  (according to the node performing the cleanup) exceeds the expiration threshold added to
  the remove action timestamp."

A version committed at ``t`` is therefore readable at least until ``t + min(log retention,
deleted-file retention)``: its commit file is not older than the log retention before
then, the files it removes carry a deletion timestamp of about ``t``, and the files it adds
can only be removed later than ``t``. This is a lower bound (cleanup runs only when a writer
checkpoints or vacuums), which is what a warning wants.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deltatail.state.errors import InvalidLogError
from deltatail.state.snapshot import parse_interval_ms

LOG_RETENTION = "delta.logRetentionDuration"
FILE_RETENTION = "delta.deletedFileRetentionDuration"
#: The protocol's defaults of the two retention properties.
LOG_RETENTION_DEFAULT = "interval 30 days"
FILE_RETENTION_DEFAULT = "interval 1 week"


@dataclass(frozen=True, slots=True)
class Retention:
    """A table's two retention periods, in milliseconds."""

    log_ms: int
    file_ms: int

    @property
    def readable_ms(self) -> int:
        """How long after its commit a version stays readable at least: the shorter of the two."""
        return min(self.log_ms, self.file_ms)

    def readable_until_ms(self, commit_ms: int) -> int:
        """The epoch milliseconds until which a version committed at ``commit_ms`` stays readable at least."""
        return commit_ms + self.readable_ms

    def readable_seconds(self, commit_ms: int, now_ms: int) -> float:
        """Seconds left (negative once past) until a version committed at ``commit_ms`` may be cleaned up."""
        return (self.readable_until_ms(commit_ms) - now_ms) / 1000


def retention(configuration: Mapping[str, str], table: str | None = None) -> Retention:
    """The retention periods a table's ``configuration`` (its metadata's) sets, with the defaults for absent ones.

    Raises:
        InvalidLogError: if a retention property is set to something that is not an interval
            (``interval <number> <unit>``), naming the property and the table.
    """
    return Retention(
        log_ms=_period(configuration, LOG_RETENTION, LOG_RETENTION_DEFAULT, table),
        file_ms=_period(configuration, FILE_RETENTION, FILE_RETENTION_DEFAULT, table),
    )


def _period(configuration: Mapping[str, str], key: str, default: str, table: str | None) -> int:
    value = configuration.get(key, default)
    try:
        period = parse_interval_ms(value)
    except InvalidLogError:
        raise InvalidLogError(f"table property {key} = {value!r} is not an interval", table=table) from None
    if period < 0:
        raise InvalidLogError(f"table property {key} = {value!r} is negative", table=table)
    return period
