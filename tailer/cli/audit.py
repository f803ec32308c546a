"""``deltatail audit TABLE``: who changed the table, what, when and how much, for a range or as commits land.

Range (the default): the events of ``--starting-version``/``--starting-timestamp`` ..
``--ending-version`` (default: the oldest auditable version .. the latest), printed on
standard output, as a table on a terminal and as JSON lines otherwise (``--format`` decides).
``--output FILE.jsonl|FILE.parquet`` writes the audit log instead, ``--html FILE`` the report
(:mod:`tailer.audit.report`); ``--alert-output FILE.jsonl`` appends the alerts raised.

Follow (``--follow --state-dir DIR``): the format's audit loop (:class:`~tailer.follow.audit.AuditFollower`,
:class:`~tailer.iceberg.audit_follow.IcebergAuditFollower`) goes on as
commits land and restarts where it stopped; ``--output`` appends to the audit log exactly once
(a ``.parquet`` log is then a directory of part files, see :mod:`tailer.audit.log`), and alerts
also go to the webhooks of ``[audit.webhook]``.

``--fail-on warning|critical`` makes the exit code :data:`EXIT_ALERTS` (3) when an alert of at
least that severity was raised (in a range, or in a ``--follow`` run until it stops), for a CI job
or a cron check; errors keep exit code 1 (2 for usage and configuration). ``--html`` checks that
its extra (``vl-convert-python``) is installed before anything is read.

Alert rules come from ``[[audit.alerts]]`` in the settings file (``--config`` or
``DELTATAIL_CONFIG``); each alert is logged to stderr. The follower's settings (state
directory, starting point, poll and checkpoint intervals, ``[storage]``) are those of
``deltatail run`` (:mod:`tailer.cli.settings`): flags, then ``DELTATAIL_*`` variables, then the file.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from collections.abc import Sequence
from typing import BinaryIO

import orjson

from deltatail.state.alerts import SEVERITIES, Alert
from deltatail.state.audit import AuditEvent
from deltatail.state.errors import ConfigError
from deltatail.tailer.audit.alerts import AlertNotifier
from deltatail.tailer.audit.log import AlertLog, AuditOutput, open_audit_log, write_audit_log
from deltatail.tailer.audit.report import require_report_extra, write_report
from deltatail.tailer.cli.configure import follow_fields
from deltatail.tailer.cli.lazy import EXIT_ALERTS
from deltatail.tailer.cli.model import AuditCommandSettings, audit_command_settings
from deltatail.tailer.cli.process import stop_on_signals
from deltatail.tailer.follow.audit import AuditFollowConfig
from deltatail.tailer.formats.registry import open_table
from deltatail.tailer.table import TableRef

log = logging.getLogger("deltatail.audit")


#: The columns of the table format: heading, width (``None``: the rest of the line), right-aligned.
COLUMNS: tuple[tuple[str, int | None, bool], ...] = (
    ("VERSION", 7, True),
    ("TIME (UTC)", 19, False),
    ("OPERATION", 17, False),
    ("USER", 18, False),
    ("+ROWS", 8, True),
    ("-ROWS", 8, True),
    ("~ROWS", 8, True),
    ("FILES +/-", 11, True),
    ("DETAILS", None, False),
)
#: The narrowest DETAILS column, however narrow the terminal.
MIN_DETAILS = 24


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def details(event: AuditEvent, alerts: Sequence[Alert] = ()) -> str:
    """A line for a person: alerts, what changed besides rows (schema, protocol, properties), the predicate."""
    parts = [f"ALERT {a.rule}" for a in alerts]
    if event.table_created:
        parts.append("table created")
    s = event.schema_change
    if s is not None:
        changes = [f"+{p}" for p in s.added] + [f"-{p}" for p in s.dropped]
        changes += [f"{r.old_path}→{r.new_path}" for r in s.renamed]
        changes += [f"{t.path}: {t.old_type}→{t.new_type}" for t in s.type_changed]
        changes += [f"{n.path} {'nullable' if n.new_nullable else 'not null'}" for n in s.nullability_changed]
        changes += [f"{p} metadata" for p in s.metadata_changed]
        parts.append("schema " + ", ".join(changes))
    p = event.protocol_change
    if p is not None:
        features = [f"+{f}" for f in sorted({*p.reader_features_added, *p.writer_features_added})]
        old = "none" if p.old_min_reader_version is None else f"r{p.old_min_reader_version}/w{p.old_min_writer_version}"
        new = f"r{p.new_min_reader_version}/w{p.new_min_writer_version}"
        parts.append(" ".join([f"protocol {old}→{new}", *features]))
    for v in event.property_changes:
        parts.append(f"unset {v.key}" if v.new is None else f"set {v.key}={v.new}")
    for v in event.domain_changes:
        parts.append(f"domain {v.key} {v.change}")
    if event.no_op:
        parts.append("no-op")
    if event.predicate:
        parts.append(f"where {event.predicate}")
    return "; ".join(parts)


def table_row(event: AuditEvent, alerts: Sequence[Alert] = ()) -> list[str]:
    """The cells of ``event`` in the table format, in :data:`COLUMNS` order."""
    c = event.counts
    return [
        str(event.version),
        event.timestamp_iso[:19].replace("T", " "),
        event.operation or "?",
        event.user or "-",
        _count(c.rows_inserted),
        _count(c.rows_deleted),
        _count(c.rows_updated),
        f"{c.files_added}/{c.files_removed}",
        details(event, alerts),
    ]


def format_line(cells: Sequence[str], width: int) -> str:
    """One line of the table, each cell clipped to its column, the last to what is left of ``width``."""
    fixed = sum(w for _, w, _ in COLUMNS if w is not None) + 2 * (len(COLUMNS) - 1)
    rest = max(width - fixed, MIN_DETAILS)
    out = []
    for (_, w, right), cell in zip(COLUMNS, cells, strict=True):
        cell = _clip(cell, rest if w is None else w)
        out.append(cell if w is None else (cell.rjust(w) if right else cell.ljust(w)))
    return "  ".join(out).rstrip()


class EventPrinter(AuditOutput):
    """Events on standard output: a table (a header, then a line per event) or JSON lines (``event.to_json()``).

    It cannot tell what it printed before: a follower that restarts prints the events after its
    saved cursor again.
    """

    def __init__(self, fmt: str, stream: BinaryIO | None = None, *, width: int | None = None) -> None:
        super().__init__("<stdout>")
        if fmt not in ("table", "jsonl"):
            raise ConfigError(f"--format must be table or jsonl, got {fmt!r}")
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stdout.buffer
        self.width = width if width is not None else shutil.get_terminal_size((160, 24)).columns
        self._header = fmt == "table"

    def open(self, table_id: str) -> int | None:
        """Nothing to open; it cannot tell what it printed before."""
        return None

    def write(self, event: AuditEvent, alerts: Sequence[Alert]) -> None:
        """Print the event (the header first, in the table format)."""
        if self.fmt == "jsonl":
            self.stream.write(orjson.dumps(event.to_json()) + b"\n")
            return
        if self._header:
            self._header = False
            self.stream.write((format_line([h for h, _, _ in COLUMNS], self.width) + "\n").encode())
        self.stream.write((format_line(table_row(event, alerts), self.width) + "\n").encode())

    def flush(self) -> None:
        """Flush the stream (a closed pipe ends the command quietly, as a pager quitting does)."""
        self.stream.flush()

    def close(self) -> None:
        """Flush what is left; the stream stays open."""
        self.stream.flush()


class SeverityWatch(AuditOutput):
    """An output that writes nothing and remembers the alerts at or above a severity (for ``--fail-on``)."""

    def __init__(self, threshold: str) -> None:
        super().__init__("<fail-on>")
        self.rank = SEVERITIES.index(threshold)
        self.fired: list[Alert] = []

    def open(self, table_id: str) -> int | None:
        """Nothing to open."""
        return None

    def write(self, event: AuditEvent, alerts: Sequence[Alert]) -> None:
        """Remember the alerts of at least the threshold's severity."""
        self.fired += [a for a in alerts if SEVERITIES.index(a.severity) >= self.rank]

    def flush(self) -> None:
        """Nothing to flush."""

    def close(self) -> None:
        """Nothing to close."""

    def exit_code(self) -> int:
        """:data:`EXIT_ALERTS` if an alert at or above the threshold was raised, else 0 (and logs why)."""
        if not self.fired:
            return 0
        worst = max(self.fired, key=lambda a: SEVERITIES.index(a.severity))
        log.error(
            "--fail-on %s: %d alerts of that severity or worse (the first: %s, %s, version %d); exit code %d",
            SEVERITIES[self.rank],
            len(self.fired),
            self.fired[0].rule,
            worst.severity,
            self.fired[0].event.version,
            EXIT_ALERTS,
        )
        return EXIT_ALERTS


# -- the command ------------------------------------------------------------------------------


def run_audit(args: argparse.Namespace) -> int:
    """The ``audit`` command: a range, or ``--follow``.

    Returns 0, or :data:`EXIT_ALERTS` when ``--fail-on`` is given and an alert of at least that
    severity was raised.

    Raises:
        ConfigError: if flags contradict each other, a file name has the wrong extension, the
            settings file is invalid (naming the key), or ``--html`` is given without its extra
            installed (checked before the table is read).
        DeltaTailError: what auditing the table raises.
    """
    s = audit_command_settings(args)
    if s.html is not None and not s.follow:
        require_report_extra()
    return _follow(s) if s.follow else _range(s)


def _start_version(text: object, latest: int | None) -> int | None:
    """``--starting-version``: a number, or ``latest`` (the latest version itself, or the one after with --follow)."""
    if text is None:
        return None
    if text == "latest":
        if latest is None:
            raise ConfigError("--starting-version latest needs the table's latest version")
        return latest
    try:
        return int(str(text))
    except ValueError:
        raise ConfigError(f"--starting-version must be a number or 'latest', got {text!r}") from None


def _open(s: AuditCommandSettings) -> TableRef:
    """The handle of the audited table (its format detected: one whose :meth:`audit_feed` refuses is refused)."""
    return open_table(s.table.uri, s.table.storage, external_roots=s.table.external_roots)


def _range(s: AuditCommandSettings) -> int:
    table = _open(s)
    feed = table.format.audit_feed(table)
    starting = _start_version(s.starting_version, feed.latest_version() if s.starting_version == "latest" else None)
    events = feed.events(
        starting,
        s.ending_version,
        starting_timestamp_ms=s.starting_timestamp_ms,
        counted=s.counted,
        track_table_rows=s.alerts.needs_table_rows,
    )
    outputs: list[AuditOutput] = []
    if s.output is None and s.html is None:
        outputs.append(EventPrinter(s.output_format))
    if s.alert_output is not None:
        outputs.append(AlertLog(s.alert_output))
    watch = SeverityWatch(s.fail_on) if s.fail_on else None
    if watch is not None:
        outputs.append(watch)
    notifier = AlertNotifier(s.alerts.rules) if s.alerts.rules else None  # a look back: no webhooks
    kept: list[AuditEvent] = []
    raised: list[Alert] = []
    keep = s.output is not None or s.html is not None
    opened: list[AuditOutput] = []
    try:
        for event in events:
            if not opened:
                for out in outputs:
                    out.open(event.table_id or feed.table_id())
                    opened.append(out)
            alerts = notifier.notify(event).alerts if notifier is not None else ()
            for out in outputs:
                out.write(event, alerts)
            raised += alerts
            if keep:
                kept.append(event)
        for out in opened:
            out.flush()
    finally:
        for out in opened:
            out.close()
    if s.output is not None:
        count = write_audit_log(kept, s.output)
        log.info("wrote %d events to %s", count, s.output)
    if s.html is not None:
        write_report(kept, raised, s.html)
        log.info("wrote the report of %d events and %d alerts to %s", len(kept), len(raised), s.html)
    return 0 if watch is None else watch.exit_code()


def _follow_config(s: AuditCommandSettings, table: TableRef) -> AuditFollowConfig:
    """The auditor's configuration from the command's settings (``run``'s, and the audit flags)."""
    f = s.following
    starting = f.starting_version
    if starting == "latest":  # only the commits after the latest now
        starting = table.format.start_of(table, starting)
    return AuditFollowConfig(
        table=table.uri,
        state_dir=f.state_dir,
        starting_version=_start_version(starting, None),
        **follow_fields(f),
        counted=s.counted,
        track_table_rows=s.alerts.needs_table_rows,
        external_roots=f.external_roots,
    )


def _follow(s: AuditCommandSettings) -> int:
    table = _open(s)
    config = _follow_config(s, table)
    outputs: list[AuditOutput] = []
    if s.output is not None:
        outputs.append(open_audit_log(s.output))
    else:
        outputs.append(EventPrinter(s.output_format))
    if s.alert_output is not None:
        outputs.append(AlertLog(s.alert_output))
    watch = SeverityWatch(s.fail_on) if s.fail_on else None
    if watch is not None:
        outputs.append(watch)
    notifier = AlertNotifier.from_settings(s.alerts) if s.alerts.rules else None  # its webhooks start here
    try:
        follower = table.format.audit_follower(table, config, outputs, notifier)
    except BaseException:
        if notifier is not None:
            notifier.close(0)
        raise
    stop_on_signals(follower.stop)
    progress = follower.run()
    log.info("stopped: %d versions audited, %d alerts raised", progress.versions, progress.alerts)
    return 0 if watch is None else watch.exit_code()
