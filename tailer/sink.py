"""The sink contract: what the run loop needs from a destination of change rows.

The tailer drives a sink through a fixed life cycle::

    resume = sink.open(table)      # once; may report what the sink already holds
    sink.write(batch) ...          # any number of batches, in position order
    sink.flush()                   # durable on return; only then is the cursor saved
    sink.close()

Delivery: the tailer saves its cursor only after ``flush`` returned, so a crash
repeats at most the rows after the last saved cursor (at-least-once). A sink
that can tell where it stopped returns that position from ``open``; the tailer
then skips every row before it, which makes delivery exactly-once.

The implementations live in :mod:`sinks`; the values they receive are in :mod:`state.feed`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from deltatail.state.cursor import Position
from deltatail.state.feed import ChangeBatch, CommitEvent, FollowStatus, TableInfo


class Sink(ABC):
    """A destination for change rows. See the module docstring for the life cycle."""

    #: The columns the sink keys its messages by (Kafka's ``key=``); none by default. An on-demand
    #: snapshot of a run with no ``--key`` interleaves its chunks with the stream by these (docs/signals.md).
    key_columns: tuple[str, ...] = ()

    @abstractmethod
    def open(self, table: TableInfo) -> Position | None:
        """Prepare to receive rows of ``table``.

        Returns:
            The position just after the last row the sink already holds (rows
            before it must not be written again), or ``None`` if the sink
            cannot tell and relies on the tailer's cursor.

        Raises:
            SinkError: if the sink cannot be opened or holds rows of another table (the error
                names both tables and the sink's file).
        """

    @property
    def location(self) -> str | None:
        """The file, directory or topic the rows go to, for messages (``None``: not one place)."""
        return None

    @property
    def reports_holdings(self) -> bool:
        """Whether :meth:`open`'s ``None`` means "holds no row of this table" (not "cannot tell"); default no.

        For such a sink the tailer compares what it holds with what its saved cursor says was
        delivered, and treats rows delivered but no longer held as a gap (see
        :meth:`tailer.follow.change_loop.ChangeLoop._open_sink`).
        """
        return False

    @property
    def rows_held(self) -> int:
        """Rows given to :meth:`write` since :meth:`open` that the sink already held and did not write again.

        A sink that skips rows itself (Kafka with ``exactly_once``) counts them here, so that the
        tailer reports them as already held, not as delivered. Default 0.
        """
        return 0

    @abstractmethod
    def write(self, batch: ChangeBatch) -> None:
        """Accept a batch; may buffer. Batches arrive in position order.

        Raises:
            SinkError: if the rows cannot be accepted.
        """

    @abstractmethod
    def flush(self) -> None:
        """Make every accepted row durable before returning.

        Raises:
            SinkError: if any row could not be made durable; the tailer then keeps its cursor.
        """

    @property
    def wants_audit_events(self) -> bool:
        """Whether :meth:`commit_event` needs each commit's audit event (``CommitEvent.audit``); default no.

        Read once, before :meth:`open`. Building the event costs the tailer some tens of
        microseconds per commit (and, for a few writers' commits, a data file's footer), so it
        is built only for a sink that says so here.
        """
        return False

    @property
    def update_pair_key(self) -> tuple[str, ...]:
        """The key columns by which the sink makes one message of an update's two images; default none (``()``).

        Read once, before :meth:`open`. For a sink that names columns, the tailer delivers a commit
        with cdc files so that a key's ``update_preimage`` and ``update_postimage`` are side by side
        in one batch, whatever the commit's size (:mod:`tailer.read.update_pairs`: rows in key-hash
        passes, positions counting the reordered rows); otherwise in the writer's order, where a
        commit larger than a batch may separate them.
        """
        return ()

    def commit_event(self, event: CommitEvent) -> None:  # noqa: B027 - optional hook, no-op by default
        """Receive a commit's summary after its rows were written; ignored unless a sink overrides it."""

    def commit_started(self, version: int, operation: str | None) -> None:  # noqa: B027 - optional hook
        """Receive a commit's Delta operation (``WRITE``, ``MERGE``...) before its rows; ignored unless overridden.

        A sink must not rely on it: rows of a version may arrive without it (an initial snapshot, a
        tailer that does not call it).
        """

    def heartbeat(self, status: FollowStatus) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called whenever the tailer is idle (caught up, waiting for news), at most once per poll interval.

        A sink that sends heartbeats decides itself whether one is due. Nothing it sends here may
        touch what :meth:`open` reads back (heartbeats are not change rows).

        Raises:
            SinkError: if the sink has failed or cannot send.
        """

    @abstractmethod
    def close(self) -> None:
        """Release resources. Does not flush: call :meth:`flush` first."""
