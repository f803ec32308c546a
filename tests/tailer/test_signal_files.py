"""The signal files of a state directory, the Kafka signal topic's URI and its ``serve`` settings: their errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deltatail.state.errors import ConfigError, StateError
from deltatail.state.signals import SnapshotRequest
from deltatail.tailer.cli.serve import load_serve_config
from deltatail.tailer.follow import signals
from deltatail.tailer.serve.signal_topic import signal_topic


def test_a_request_is_asked_taken_cancelled_and_ended_through_its_files(tmp_path: Path) -> None:
    request = SnapshotRequest("r1", "id > 2", 5)
    signals.ask(tmp_path, request)
    assert signals.pending(tmp_path) == request
    signals.drop(tmp_path, "another")  # only the request named
    assert signals.pending(tmp_path) == request
    signals.ask_cancel(tmp_path, "r1")
    assert signals.cancel_asked(tmp_path, "r1") and not signals.cancel_asked(tmp_path, "r2")
    signals.drop(tmp_path, "r1")
    assert signals.pending(tmp_path) is None
    signals.record_end(tmp_path, request.taken_at(3, None), "cancelled")
    assert not signals.cancel_asked(tmp_path, "r1")  # the end forgets the cancel
    assert signals.last_end(tmp_path) == {
        "request": {
            "id": "r1",
            "where": "id > 2",
            "chunk_rows": 5,
            "version": 3,
            "first": 0,
            "key": [],
            "read": 0,
            "sent": 0,
            "after": -1,
        },
        "outcome": "cancelled",
        "error": None,
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not JSON"),
        (b'{"id": "a b"}', "invalid snapshot request"),
        (b" " * (signals.MAX_SIGNAL_BYTES + 1), "larger than"),
    ],
)
def test_a_request_file_that_is_not_one_names_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / signals.REQUEST_FILE).write_bytes(content)
    with pytest.raises(StateError, match=message) as caught:
        signals.pending(tmp_path)
    assert caught.value.file == str(tmp_path / signals.REQUEST_FILE)
    assert signals.last_end(tmp_path) is None


def test_a_signal_file_that_cannot_be_written_is_a_state_error(tmp_path: Path) -> None:
    (tmp_path / signals.CANCEL_FILE).mkdir()  # a directory in its place: the rename fails
    with pytest.raises(StateError, match="cannot write the signal") as caught:
        signals.ask_cancel(tmp_path, "r1")
    assert caught.value.file == str(tmp_path / signals.CANCEL_FILE)
    (tmp_path / signals.REQUEST_FILE).mkdir()
    with pytest.raises(StateError, match="cannot read the signal"):
        signals.ask(tmp_path, SnapshotRequest("r2"))
    (tmp_path / signals.END_FILE).mkdir()
    with pytest.raises(StateError, match="cannot write the signal"):
        signals.record_end(tmp_path, SnapshotRequest("r2"), "done")


def test_the_signal_topic_is_a_kafka_uri() -> None:
    assert signal_topic("kafka://b1:9092,b2:9092/dt.signals") == ("b1:9092,b2:9092", "dt.signals")
    for bad in ("kafka://b:9092", "kafka:///t", "http://b:9092/t", "kafka://b:9092/t?x=1", "kafka://b:9092/a/b"):
        with pytest.raises(ConfigError, match="signal_kafka_topic must be kafka://HOST:PORT/TOPIC"):
            signal_topic(bad)


def test_serve_names_its_file_for_a_bad_signal_topic(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [service]
            state_root = "{tmp_path / "state"}"
            signal_kafka_topic = "kafka://broker:9092"

            [[tables]]
            path = "{tmp_path / "t"}"
            """
        )
    )
    with pytest.raises(ConfigError, match="signal_kafka_topic") as caught:
        load_serve_config(str(config))
    assert caught.value.file == str(config)
    text = config.read_text().replace('broker:9092"', 'broker:9092/sig"\nsignal_kafka_key = "svc"')
    config.write_text(text)
    loaded = load_serve_config(str(config))
    assert (loaded.signal_kafka_topic, loaded.signal_kafka_key) == ("kafka://broker:9092/sig", "svc")
