"""The one parser per kind of setting: booleans, timestamps, byte sizes."""

from __future__ import annotations

import pytest

from deltatail.state.errors import ConfigError
from deltatail.tailer.parse import parse_bool, parse_bytes, parse_timestamp_ms


def test_timestamps() -> None:
    assert parse_timestamp_ms("2024-01-02T03:04:05Z") == 1704164645000
    assert parse_timestamp_ms("2024-01-02T03:04:05") == 1704164645000  # no zone means UTC
    assert parse_timestamp_ms("2024-01-02T04:04:05+01:00") == 1704164645000
    assert parse_timestamp_ms(" 2024-01-02T03:04:05.123Z ") == 1704164645123
    assert parse_timestamp_ms("2024-01-02") == 1704153600000  # a date is its midnight, UTC
    assert parse_timestamp_ms("1704164645000") == 1704164645000  # digits are epoch milliseconds
    assert parse_timestamp_ms("1969-12-31T23:59:59.999Z") == -1  # exact integer arithmetic, before 1970 too


@pytest.mark.parametrize("text", ["yesterday", "2024-13-01", "", "-5", "1.5"])
def test_a_bad_timestamp_names_the_setting(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--starting-timestamp=.* is not an ISO-8601 date or timestamp"):
        parse_timestamp_ms(text, name="--starting-timestamp")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        *[("true", True), ("TRUE", True), (" 1 ", True), ("yes", True), ("on", True)],
        *[("false", False), ("0", False), ("No", False), ("off", False), ("", False)],
    ],
)
def test_booleans(text: str, value: bool) -> None:
    assert parse_bool(text, name="x") is value


def test_a_bad_boolean_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"option exactly_once='maybe' is not true or false"):
        parse_bool("maybe", name="option exactly_once")


@pytest.mark.parametrize(
    ("text", "value"), [("1048576", 1 << 20), ("64m", 64 << 20), ("2gb", 2 << 30), ("3K", 3072), ("1 TiB", 1 << 40)]
)
def test_byte_sizes(text: str, value: int) -> None:
    assert parse_bytes(text, name="x") == value


@pytest.mark.parametrize("text", ["0", "-1", "1.5m", "lots", "12p"])
def test_a_bad_byte_size_names_the_setting(text: str) -> None:
    with pytest.raises(ConfigError, match=r"maxBytesPerTrigger=.* is not a positive byte size"):
        parse_bytes(text, name="maxBytesPerTrigger")
