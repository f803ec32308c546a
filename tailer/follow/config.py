"""The settings of the follow loops: what every loop shares, and the tailer's own (``deltatail run``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from deltatail.tailer.log.follower import GAP_CHECK_SECONDS
from deltatail.tailer.read.feed import ChangeOptions


@dataclass
class FollowConfig:
    """Settings every follow loop shares: the tailers and the auditor (see ``deltatail run --help`` for each).

    ``starting_version`` and ``starting_timestamp_ms`` count only on a new state directory.
    """

    table: str
    state_dir: str
    starting_version: int | None = None
    starting_timestamp_ms: int | None = None
    poll_interval: float = 1.0
    max_poll_interval: float = 5.0
    watch: bool = True
    checkpoint_commits: int = 50
    checkpoint_seconds: float = 5.0
    snapshot_commits: int = 1000
    until_caught_up: bool = False
    parse_retries: int = 5
    parse_retry_delay: float = 0.05
    gap_check_seconds: float = GAP_CHECK_SECONDS
    #: Whether the tailer logs its own "following" status lines (``deltatail serve`` reports its
    #: tables in ``table_status`` lines instead, so that 200 tables do not fill the log).
    status_lines: bool = True
    #: The URL of an SQS queue that receives the S3 event notifications of the table's bucket
    #: (:mod:`tailer.log.notifications`): an object-store table is then looked at when one names its
    #: log, and otherwise every ``max_poll_interval`` (a safety poll), not at every ``poll_interval``.
    notifications: str | None = None
    #: Options of the table's object store (credentials, endpoint); never shown, logged or saved.
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass
class TailerConfig(FollowConfig):
    """Settings of one tailer (``deltatail run``; one table of ``deltatail serve``): the shared ones and these."""

    initial_snapshot: bool = False
    options: ChangeOptions = field(default_factory=ChangeOptions)
    #: What to do when the sink holds fewer rows than were delivered to it (a file truncated,
    #: deleted or rotated away): ``"fail"`` (refuse, naming the gap) or ``"accept"`` (warn, go on).
    on_sink_gap: str = "fail"
    #: What to do when data the tailer still needs is gone (the log cleaned up past the cursor, a
    #: file vacuumed): ``"fail"``, ``"resnapshot"`` or ``"skip"`` (see ``Tailer._data_lost``).
    on_data_loss: str = "fail"
    #: The sink is flushed and the cursor saved once this many rows were written since the last
    #: flush, inside a commit too: what a sink holds unflushed (the Parquet sink's rows, Kafka's
    #: unacknowledged messages) is bounded by it, not by the size of a commit.
    flush_rows: int = 262_144
