"""What the two loops that follow a Delta log (the tailer and the auditor) build alike from their shared settings.

Each builds its :class:`~tailer.log.follower.LogFollower` and its
:class:`~tailer.follow.checkpointer.Checkpointer` here, from its
:class:`~tailer.follow.config.FollowConfig`, so a setting of either reaches both loops the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from deltatail.state.snapshot import Snapshot
from deltatail.tailer.follow.checkpointer import Checkpointer, Flushable
from deltatail.tailer.follow.config import FollowConfig
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.follower import AuditBuilder, Hints, LogFollower


def log_follower(
    log: DeltaLog,
    head: Snapshot,
    config: FollowConfig,
    *,
    previous_ms: int | None,
    table_id: str | None,
    hints: Hints,
    clock: Callable[[], float],
    audit: AuditBuilder | None,
    allow_non_additive: bool,
    require_cdf: bool = False,
    external_roots: tuple[str, ...] = (),
) -> LogFollower:
    """The follower of ``log`` from ``head``, with the loop's gap checks and parse retries (``config``)."""
    return LogFollower(
        log,
        head,
        previous_ms=previous_ms,
        table_id=table_id,
        allow_non_additive=allow_non_additive,
        require_cdf=require_cdf,
        external_roots=external_roots,
        hints=hints,
        gap_check_seconds=config.gap_check_seconds,
        parse_retries=config.parse_retries,
        retry_delay=config.parse_retry_delay,
        clock=clock,
        audit=audit,
    )


def checkpointer(
    store: StateStore,
    output: Flushable,
    config: FollowConfig,
    *,
    table: str,
    table_id: str,
    clock: Callable[[], float],
    earlier_order: Callable[[int], tuple[int, int] | None] | None = None,
) -> Checkpointer:
    """The checkpoints of a loop delivering into ``output``, due as ``config`` says.

    ``earlier_order``: the row order a cursor inside a version counts in if it is an earlier
    one (the feed's :meth:`~tailer.read.feed.ChangeFeed.earlier_order`).
    """
    return Checkpointer(
        store,
        output,
        table=table,
        table_id=table_id,
        checkpoint_commits=config.checkpoint_commits,
        checkpoint_seconds=config.checkpoint_seconds,
        snapshot_commits=config.snapshot_commits,
        clock=clock,
        earlier_order=earlier_order,
    )
