"""Logging for the command line: readable text by default, one JSON object per line on request.

JSON records carry ``ts`` (ISO-8601 UTC), ``level``, ``logger``, ``message`` and,
for the tailer's status lines, ``event`` (``catching_up``, ``following``,
``sink_unavailable``) with its fields (version, versions and rows done,
rows per second, seconds behind the newest commit, ...), so a log pipeline
can chart lag and progress without parsing prose.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line (without the newline)."""
        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if event is not None:
            doc["event"] = event
            fields = getattr(record, "fields", None)
            if isinstance(fields, dict):
                doc.update(fields)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


#: Client libraries whose INFO lines are connection chatter (one set per producer, so per table
#: in a service): shown only with --verbose; their warnings and errors always are.
CHATTY_LIBRARIES = ("kafka", "py4j")


def configure(*, verbose: bool, json_lines: bool) -> None:
    """Send logs to stderr, as text or as JSON lines; client libraries' INFO lines only when ``verbose``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
