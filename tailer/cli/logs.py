"""Logging for the command line: readable text by default, one JSON object per line on request.

JSON records carry ``ts`` (ISO-8601 UTC), ``level``, ``logger``, ``message`` and,
for the tailer's status lines, ``event`` (``catching_up``, ``following``,
``sink_unavailable``) with its fields (version, versions and rows done,
rows per second, seconds behind the newest commit, ...), so a log pipeline
can chart lag and progress without parsing prose.

In JSON mode every line on stderr is JSON, the last words too: a fatal error is a record with
``event`` ``fatal`` (:func:`fatal`), a usage error one with ``event`` ``usage_error``
(:class:`JsonErrorParser`). With ``-v`` a fatal error also shows its causes: the store's failure
(request, status, error code; never a credential or a query string) and the errors it wraps.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from datetime import UTC, datetime
from types import TracebackType
from typing import ClassVar, NoReturn

import orjson

from deltatail.state.errors import DeltaTailError, StorageError

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


_json_mode = False


def json_mode() -> bool:
    """Whether :func:`configure` chose JSON lines (nothing else may then write to stderr)."""
    return _json_mode


def configure(*, verbose: bool, json_lines: bool) -> None:
    """Send logs to stderr, as text or as JSON lines; client libraries' INFO lines only when ``verbose``.

    Python warnings become log records. With JSON lines, an exception nothing caught (in the main
    thread or another) is a JSON record too (``"event": "uncaught"``, with its traceback in
    ``exception``), not a traceback on stderr.
    """
    global _json_mode
    _json_mode = json_lines
    logging.captureWarnings(True)
    if json_lines:
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)


def _log_uncaught(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    logging.getLogger("deltatail").critical(
        "uncaught %s: %s", kind.__name__, error, exc_info=(kind, error, tb), extra={"event": "uncaught"}
    )


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("deltatail").critical(
        "uncaught %s in thread %s: %s",
        args.exc_type.__name__,
        name,
        args.exc_value,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        extra={"event": "uncaught"},
    )


def _stamp(created: float) -> str:
    return datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")


def _write_json(doc: dict[str, object]) -> None:
    sys.stderr.write(orjson.dumps(doc, default=str).decode() + "\n")
    sys.stderr.flush()


def fatal_line(message: str, *, json_lines: bool) -> None:
    """One ``deltatail: error:`` line (or its JSON record) for an error that is not a :class:`DeltaTailError`."""
    if json_lines:
        _write_json(
            {"ts": _stamp(time.time()), "level": "error", "logger": "deltatail", "message": message, "event": "fatal"}
        )
    else:
        print(f"deltatail: error: {message}", file=sys.stderr)


def causes(e: BaseException) -> list[str]:
    """What ``-v`` shows under a fatal error: the store failure's detail, then each wrapped error, one line each.

    Wrapped errors are followed through ``__cause__`` (and an unsuppressed ``__context__``). An
    object-store client's own errors are named by type only: their text holds request URLs, whose
    query strings may carry credentials; :attr:`StorageError.detail` says what they said, safely.
    """
    out: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen and len(out) < 10:
        seen.add(id(current))
        if isinstance(current, StorageError) and current.detail:
            out.append(current.detail)
        elif current is not e:
            kind = type(current)
            name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            if kind.__module__.startswith("obstore"):
                out.append(name)
            else:
                text = " ".join(str(current).split())[:500]
                out.append(f"{name}: {text}" if text else name)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return out


def fatal(e: DeltaTailError, *, verbose: bool, json_lines: bool, exit_code: int) -> None:
    """Report the error that ends the command: one line (text) or one JSON record, with its causes if ``verbose``.

    The JSON record has ``event`` ``fatal``, ``error`` (the class), ``exit_code``, ``table``,
    ``version`` and ``file`` where known, and ``causes`` (a list) with ``verbose``.
    """
    chain = causes(e) if verbose else []
    if json_lines:
        doc: dict[str, object] = {
            "ts": _stamp(time.time()),
            "level": "error",
            "logger": "deltatail",
            "message": str(e),
            "event": "fatal",
            "error": type(e).__name__,
            "exit_code": exit_code,
        }
        for key in ("table", "version", "file"):
            value = getattr(e, key)
            if value is not None:
                doc[key] = value
        if isinstance(e, StorageError):
            doc["transient"] = e.transient
        if verbose:
            doc["causes"] = chain
        _write_json(doc)
        return
    print(f"deltatail: error: {e}", file=sys.stderr)
    for line in chain:
        print(f"deltatail:   cause: {line}", file=sys.stderr)


class JsonErrorParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one JSON record when :attr:`json_lines` is set (exit code 2).

    A class attribute, as argparse builds each subcommand's parser from the parent's class.
    """

    json_lines: ClassVar[bool] = False

    def error(self, message: str) -> NoReturn:
        """Report a usage error and exit with 2."""
        if not JsonErrorParser.json_lines:
            super().error(message)
        _write_json(
            {
                "ts": _stamp(time.time()),
                "level": "error",
                "logger": "deltatail",
                "message": f"{self.prog}: {message}",
                "event": "usage_error",
                "usage": " ".join(self.format_usage().split()),
                "exit_code": 2,
            }
        )
        sys.exit(2)
