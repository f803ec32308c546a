"""The alert webhook against a real HTTP server on 127.0.0.1 that fails, hangs past the timeout and recovers.

The server (``http.server`` in a thread, started and stopped by the fixture) answers each POST as
its script says: an HTTP status, or ``hang`` (hold the request until the test releases it, so the
client's timeout fires). Everything it receives is recorded.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from deltatail.state.alerts import parse_alert_rules
from deltatail.state.errors import ConfigError
from deltatail.tailer.audit.alerts import AlertNotifier
from deltatail.tailer.audit.feed import AuditFeed
from deltatail.tailer.audit.webhook import Webhook, WebhookConfig, redact_url

SECRET_PATH = "/services/T000/B000/XsecretX"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    url: str
    script: list[str | int]
    received: list[Received] = field(default_factory=list)
    arrived: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    release: threading.Event = field(default_factory=threading.Event)

    def wait_for(self, n: int, timeout: float = 10.0) -> None:
        """Block until ``n`` more requests arrived (fails the test after ``timeout``)."""
        for _ in range(n):
            assert self.arrived.acquire(timeout=timeout), "the webhook did not call"


@pytest.fixture
def server() -> Iterator[Server]:
    yield from _server()


@pytest.fixture
def other_server() -> Iterator[Server]:
    yield from _server()


def _server() -> Iterator[Server]:
    state = Server(url="", script=[])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.received.append(Received(self.path, dict(self.headers.items()), body))
            action = state.script.pop(0) if state.script else 200
            state.arrived.release()
            location = None
            if action == "hang":
                state.release.wait(10)
                action = 200
            elif isinstance(action, str) and action.startswith("3"):  # "302 http://elsewhere/": a redirect
                action, location = action.split(" ", 1)
            try:
                self.send_response(int(action))
                if location is not None:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}{SECRET_PATH}?token=abc123"
    try:
        yield state
    finally:
        state.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def config(url: str, **kwargs: Any) -> WebhookConfig:
    # A generous timeout unless a test is about timeouts: on a loaded machine (the suite's workers on two
    # cores) an answer can take longer than a fraction of a second, and a timed-out attempt is retried.
    values: dict[str, Any] = {"timeout_s": 5.0, "retries": 3, "backoff_s": 0.05, "max_backoff_s": 0.2}
    values.update(kwargs)
    return WebhookConfig(url, **values)


def assert_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    text = caplog.text
    for secret in ("XsecretX", "token", "abc123", "s3cret"):
        assert secret not in text


def test_fails_times_out_then_recovers(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    server.script = [500, "hang", 200]
    caplog.set_level(logging.INFO, logger="deltatail.webhook")
    # a generous timeout: the held request is held for seconds, and a loaded machine must not time out the others
    hook = Webhook(config(server.url, timeout_s=2.0, headers={"Authorization": "Bearer s3cret"}))
    assert hook.send({"rule": "large delete", "version": 7}, label="alert 'large delete' at version 7")
    server.wait_for(3)
    hook.close()
    assert (hook.stats.delivered, hook.stats.failed, hook.stats.dropped, hook.stats.attempts) == (1, 0, 0, 3)
    assert [json.loads(r.body) for r in server.received] == [{"rule": "large delete", "version": 7}] * 3
    first = server.received[0]
    assert first.path == SECRET_PATH + "?token=abc123"
    assert first.headers["Content-Type"] == "application/json" and first.headers["Authorization"] == "Bearer s3cret"
    messages = [r.getMessage() for r in caplog.records]
    where = redact_url(server.url)
    assert where.startswith("http://127.0.0.1:") and where.endswith("/…")
    assert (
        messages[0]
        == f"webhook {where}: alert 'large delete' at version 7 failed (HTTP 500); attempt 1 of 4, next in 0.1 s"
    )
    assert messages[1].startswith(f"webhook {where}: alert 'large delete' at version 7 failed (no answer within 2 s")
    assert messages[2] == f"webhook {where}: alert 'large delete' at version 7 delivered at attempt 3"
    assert_no_secret(caplog)


def test_send_never_waits_for_a_hanging_server(server: Server) -> None:
    server.script = ["hang"]
    hook = Webhook(config(server.url, timeout_s=5.0))
    assert hook.send({"n": 1})
    server.wait_for(1)  # the worker is now inside a request the server holds
    assert all(hook.send({"n": n}) for n in (2, 3, 4))  # returns at once: only queued
    server.release.set()
    server.wait_for(3)
    hook.close()
    assert hook.stats.delivered == 4
    assert [json.loads(r.body)["n"] for r in server.received] == [1, 2, 3, 4]


def test_a_full_queue_drops_and_reports(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    server.script = ["hang"]
    hook = Webhook(config(server.url, timeout_s=5.0, queue_size=2))
    assert hook.send({"n": 1})
    server.wait_for(1)
    assert hook.send({"n": 2}) and hook.send({"n": 3})
    assert not hook.send({"n": 4}, label="alert 'x' at version 4")
    assert hook.stats.dropped == 1
    assert "is falling behind (2 documents waiting): alert 'x' at version 4 dropped" in caplog.text
    server.release.set()
    server.wait_for(2)
    hook.close()
    assert hook.stats.delivered == 3
    assert_no_secret(caplog)


def test_gives_up_after_the_retries(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    server.script = [503, 503, 503]
    hook = Webhook(config(server.url, retries=2))
    hook.send({"n": 1}, label="doc")
    server.wait_for(3)
    hook.close()
    assert (hook.stats.delivered, hook.stats.failed, hook.stats.attempts) == (0, 1, 3)
    assert f"webhook {redact_url(server.url)}: doc not delivered: HTTP 503" in caplog.text
    assert_no_secret(caplog)


def test_a_refusal_is_not_retried(server: Server) -> None:
    server.script = [400]
    hook = Webhook(config(server.url))
    hook.send({"n": 1})
    server.wait_for(1)
    hook.close()
    assert (hook.stats.failed, hook.stats.attempts, len(server.received)) == (1, 1, 1)


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failed_delivery_and_is_not_followed(
    code: int, server: Server, other_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = other_server.url.replace("token=abc123", "x=1")
    server.script = [f"{code} {elsewhere}"] * 20
    hook = Webhook(config(server.url, headers={"Authorization": "Bearer s3cret"}))
    hook.send({"rule": "large delete"}, label="alert")
    server.wait_for(1)
    hook.close()
    assert other_server.received == []  # neither the body nor the Authorization header went there
    assert (hook.stats.delivered, hook.stats.failed, hook.stats.attempts, len(server.received)) == (0, 1, 1, 1)
    assert f"webhook {redact_url(server.url)}: alert not delivered: HTTP {code}: a redirect" in caplog.text
    assert "127.0.0.1:" + elsewhere.split(":")[2].split("/")[0] not in caplog.text  # not the Location either
    assert_no_secret(caplog)


def test_connection_refused_is_retried_and_reported(caplog: pytest.LogCaptureFixture) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hook = Webhook(config(f"http://127.0.0.1:{port}/hook/XsecretX", retries=1))
    hook.send({"n": 1}, label="doc")
    hook.close(timeout_s=5)
    assert (hook.stats.failed, hook.stats.attempts) == (1, 2)
    assert "doc not delivered: connection failed:" in caplog.text
    assert_no_secret(caplog)


def test_close_delivers_what_is_queued_and_stops_at_its_deadline(server: Server) -> None:
    hook = Webhook(config(server.url))
    for n in range(5):
        hook.send({"n": n})
    hook.close()
    assert hook.stats.delivered == 5 and len(server.received) == 5
    assert not hook.send({"n": 9})
    assert hook.stats.dropped == 1
    hook.close()  # twice is harmless

    server.script = ["hang"] * 10
    slow = Webhook(config(server.url, timeout_s=5.0, retries=0))
    for n in range(3):
        slow.send({"n": n})
    server.wait_for(1)
    slow.close(timeout_s=0.2)  # the held request outlives the deadline: the rest are dropped, not waited for
    assert slow.stats.delivered == 0
    assert slow.stats.dropped == 2


def test_a_document_that_is_not_json_is_reported(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    hook = Webhook(config(server.url))
    assert not hook.send({"x": {1, 2}}, label="odd")
    hook.close()
    assert hook.stats.dropped == 1 and "odd is not JSON-serialisable" in caplog.text


def test_alerts_reach_the_webhook(server: Server, tmp_path: Any) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": [1, 2, 3]}))
    DeltaTable(str(table)).delete("id = 1")
    rules = parse_alert_rules([{"name": "deletes", "operation_in": ["DELETE"]}])
    notifier = AlertNotifier(rules, [Webhook(config(server.url))])
    for event in AuditFeed(str(table)).events():
        notifier.notify(event)
    notifier.close()
    (received,) = server.received
    doc = json.loads(received.body)
    assert doc["format"] == "deltatail.audit.alert/1" and doc["rule"] == "deletes" and doc["version"] == 1
    assert doc["event"]["counts"]["rows_deleted"] == 1


# -- configuration ------------------------------------------------------------------------------------


def test_redacted_urls() -> None:
    assert redact_url("https://hooks.example/services/T/B/X") == "https://hooks.example/…"
    assert redact_url("https://user:pw@hooks.example:8443/x?token=1") == "https://hooks.example:8443/…"
    assert redact_url("http://127.0.0.1:9000") == "http://127.0.0.1:9000"
    assert redact_url("http://[::1]:99999/x") == "<invalid URL>"


def test_bad_webhook_settings_never_show_the_url() -> None:
    with pytest.raises(ConfigError, match=r"webhook URL must be http\(s\)://host/...; got ftp://h/…") as e:
        WebhookConfig("ftp://h/XsecretX")
    assert "XsecretX" not in str(e.value)
    cases: tuple[tuple[dict[str, Any], str], ...] = (
        ({"timeout_s": 0}, "webhook timeout must be positive"),
        ({"retries": -1}, "retries and backoff not negative"),
        ({"queue_size": 0}, "queue_size must be at least 1"),
    )
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            WebhookConfig("https://h/x", **kwargs)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"url": "https://h/x", "tries": 3}, "audit.webhook: unknown key 'tries'"),
        ({}, "give exactly one of 'url' and 'url_env'"),
        ({"url": "https://h/x", "url_env": "X"}, "give exactly one of 'url' and 'url_env'"),
        ({"url": 3}, "key 'url': expected a string"),
        ({"url_env": ""}, "key 'url_env': expected the name of an environment variable"),
        ({"url": "https://h/x", "headers": ["a"]}, "key 'headers': expected a table"),
        ({"url": "https://h/x", "headers": {"A": "env:NOPE"}}, "key 'headers.A': environment variable NOPE is not set"),
        ({"url": "https://h/x", "timeout": "5"}, "key 'timeout': expected a number of seconds"),
        ({"url": "https://h/x", "retries": 1.5}, "key 'retries': expected a whole number"),
        ({"url": "https://h/x", "backoff": -1}, "audit.webhook: webhook timeout must be positive"),
        ({"url": "gopher://h/XsecretX"}, "audit.webhook: webhook URL must be http"),
    ],
)
def test_bad_webhook_tables(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        WebhookConfig.from_settings(raw, env={}, source="s.toml")
    assert e.value.file == "s.toml" and "XsecretX" not in str(e.value)


def test_stats_are_consistent_under_concurrent_sends(server: Server) -> None:
    hook = Webhook(config(server.url, queue_size=1000, timeout_s=2.0))
    threads = [threading.Thread(target=lambda k=k: [hook.send({"n": 25 * k + i}) for i in range(25)]) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 10
    while hook.stats.delivered < 100 and time.monotonic() < deadline:
        time.sleep(0.01)
    hook.close()
    assert hook.stats.delivered == 100 and hook.stats.dropped == 0
    # at least once: a request that timed out on a busy machine may have arrived before its retry
    assert {json.loads(r.body)["n"] for r in server.received} == set(range(100))
