"""The newest metadata of a followed Iceberg table, looked at again and again (``run`` and ``audit --follow``).

Each look reads the newest metadata file's name (the catalog's pointer, the version hint, or one
listing of ``metadata/``) and parses the file only when the name changed.

A writer that is not done yet is waited for, never skipped nor taken as an error at once. A writer
on a local file system writes its files in place (pyiceberg does), so a look can find the newest
metadata file empty or cut short, and a Hadoop table's version hint can name a file not written
yet (the listing then decides, :meth:`~tailer.iceberg.metadata.IcebergTable.metadata_location`):

- a newest metadata file that does not parse while an older one was read: the older one stands,
  and the next look tries again, until it parses or has not parsed for :data:`TORN_SECONDS`;
- one that does not parse when nothing was read yet (a follower starting): looked at again after
  a short wait, for up to :data:`TORN_SECONDS`;
- a snapshot's manifest list that is not there yet (:meth:`MetadataLook.patiently`): read again
  after a short wait, for up to :data:`TORN_SECONDS`.

After that time the error is raised: it names the table and the file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from deltatail.state.errors import DeltaTailError, InvalidLogError, MissingFileError, UnsafePathError, VersionGapError
from deltatail.state.iceberg.ancestry import Ancestry
from deltatail.state.iceberg.model import TableState
from deltatail.tailer.iceberg.feed import IcebergFeed

log = logging.getLogger("deltatail")

#: How long a newest metadata file may not parse, or a manifest list be missing, before that is an error.
TORN_SECONDS = 10.0
#: The first wait before reading a file again (it doubles each time, up to :data:`MAX_WAIT`).
FIRST_WAIT = 0.05
MAX_WAIT = 1.0

T = TypeVar("T")
Seen = tuple[str, TableState, Ancestry]


class MetadataLook:
    """The newest metadata a follower has read, and the patience it has with files being written.

    Args:
        feed: the table's feed.
        clock: monotonic seconds.
        sleep: waits that many seconds (a follower's waits for a file being written).
    """

    def __init__(self, feed: IcebergFeed, clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
        self.feed = feed
        self._clock = clock
        self._sleep = sleep
        self.seen: Seen | None = None  # the last look's metadata
        self._torn: tuple[str, float] | None = None  # a file being waited for, since when

    def look(self) -> Seen:
        """The newest metadata: its location (one request), parsed only when it changed (see the module docstring).

        Raises:
            TableNotFoundError: if there is no metadata file.
            InvalidLogError: if the newest metadata file has not parsed for :data:`TORN_SECONDS`.
            UnsupportedFeatureError: for a format version deltatail does not read.
        """
        if self.seen is None:
            self.seen = self.patiently(self._read, (InvalidLogError, MissingFileError))
            return self.seen
        where = self.feed.iceberg.metadata_location()
        if self.seen[0] == where:
            return self.seen
        try:
            self.seen = self._read(where)
        except InvalidLogError:
            if not self._still_waiting(where):
                raise
            log.info("%s: the newest metadata file %s does not parse yet; looking again", self.feed.table, where)
            return self.seen
        self._torn = None
        return self.seen

    def last(self) -> Seen:
        """The last look's metadata (the versions being delivered were found in it)."""
        return self.seen if self.seen is not None else self.look()

    def _read(self, where: str | None = None) -> Seen:
        state, ancestry, location = self.feed.current(where)
        return location, state, ancestry

    def patiently(self, read: Callable[[], T], waits_for: tuple[type[DeltaTailError], ...] = (MissingFileError,)) -> T:
        """``read()``, done again after a short wait while it raises one of ``waits_for`` (a file not written yet).

        For up to :data:`TORN_SECONDS` (by the clock, or by the waits added up); a path outside the
        table or expired snapshots are not waited for.

        Raises:
            DeltaTailError: one of ``waits_for`` that ``read`` raised last, once the time is up.
        """
        wait, waited, since = FIRST_WAIT, 0.0, self._clock()
        while True:
            try:
                return read()
            except waits_for as e:
                late = max(waited, self._clock() - since) >= TORN_SECONDS
                if isinstance(e, UnsafePathError | VersionGapError) or late:
                    raise
                log.info("%s: %s is not complete yet; reading it again", self.feed.table, e.file)
                self._sleep(wait)
                waited += wait
                wait = min(wait * 2, MAX_WAIT)

    def _still_waiting(self, key: str) -> bool:
        """Whether the file ``key`` has failed for less than :data:`TORN_SECONDS` (counted from its first failure)."""
        now = self._clock()
        if self._torn is None or self._torn[0] != key:
            self._torn = (key, now)
        return now - self._torn[1] < TORN_SECONDS
