"""Parsers of settings given as text, one per kind: booleans, timestamps, byte sizes.

The command line, environment variables, TOML files, sink URIs and the Spark
source's options all parse through these, so a value means the same wherever
it is given. Each raises :class:`~state.errors.ConfigError` naming the setting.
"""

from __future__ import annotations

import datetime as dt
import re

from deltatail.state.errors import ConfigError

_TRUE = frozenset(("true", "1", "yes", "on"))
_FALSE = frozenset(("false", "0", "no", "off", ""))
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_BYTES = re.compile(r"^(\d+)\s*([kmgt]?)(?:i?b)?$", re.IGNORECASE)


def parse_bool(text: str, *, name: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``; any case; empty is false).

    Raises:
        ConfigError: if ``text`` is none of these.
    """
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={text!r} is not true or false")


def parse_timestamp_ms(text: str, *, name: str = "timestamp") -> int:
    """Epoch milliseconds of an ISO-8601 date or timestamp (no zone: UTC), or of digits (epoch milliseconds).

    Raises:
        ConfigError: if ``text`` is neither.
    """
    raw = text.strip()
    if raw.isdigit():
        return int(raw)
    try:
        moment = dt.datetime.fromisoformat(raw)
    except ValueError as e:
        raise ConfigError(
            f"{name}={text!r} is not an ISO-8601 date or timestamp (2024-05-01T12:00:00Z) or epoch milliseconds"
        ) from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return (moment - _EPOCH) // dt.timedelta(milliseconds=1)


def parse_bytes(text: str, *, name: str) -> int:
    """A positive byte count: digits with an optional binary unit (``k``, ``m``, ``g``, ``t``, optionally + ``b``).

    Raises:
        ConfigError: if ``text`` is not such a count.
    """
    m = _BYTES.match(text.strip())
    if m is None or int(m.group(1)) <= 0:
        raise ConfigError(f"{name}={text!r} is not a positive byte size such as 1048576, 64m or 1g")
    return int(m.group(1)) << (10 * " kmgt".index(m.group(2).lower() or " "))
