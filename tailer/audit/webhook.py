"""Deliver JSON documents (alerts) to an HTTP webhook without ever holding up the tail.

:meth:`Webhook.send` only puts the document on a bounded queue and returns at
once; a background thread POSTs it (``Content-Type: application/json``) with a
timeout, and retries a failure (a connection error, a timeout, HTTP 408, 429 or
5xx) with exponential backoff: ``backoff_s``, twice that, ... at most
``max_backoff_s``, for ``retries`` more attempts. A document that still fails,
or that the server refuses (another 4xx), is dropped and the failure logged; a
document that finds the queue full is dropped and logged too. Redirects (3xx)
are never followed: the request would carry the document and the headers
(``Authorization``...) to wherever the answer points. A redirect is a failed
delivery, not retried, and logged with its status only (not its ``Location``). So a failing or
slow webhook costs the tail nothing but log lines.

The URL often holds a secret (a token in the path or the query, as chat
webhooks do). It is never logged nor put in an error: logs show only
:func:`redact_url` (scheme, host and port). Headers (``Authorization``...) are
never logged either.

Settings (``[audit.webhook]`` in the TOML file, :meth:`WebhookConfig.from_settings`):

=================  =============================================================
``url``            the endpoint (``http`` or ``https``); or ``url_env``, the name
                   of an environment variable holding it (keeps it out of files)
``headers``        a table of extra headers; a value ``"env:NAME"`` is read from
                   the environment variable ``NAME``
``timeout``        seconds per attempt (default 5)
``retries``        attempts after the first (default 3)
``backoff``        seconds before the first retry (default 0.5), doubling
``max_backoff``    the longest wait between attempts (default 30)
``queue_size``     documents waiting at most (default 1000)
=================  =============================================================
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from deltatail.state.errors import ConfigError

log = logging.getLogger("deltatail.webhook")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect: urllib then raises the 3xx as an :class:`urllib.error.HTTPError`."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


#: HTTP statuses worth another attempt: the server may recover.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


def redact_url(url: str) -> str:
    """``scheme://host[:port]/…``: the URL with its user info, path and query hidden (they may hold tokens)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid URL>"
    hidden = "/…" if (parts.path not in ("", "/") or parts.query or parts.fragment) else ""
    return f"{parts.scheme}://{host}{port}{hidden}"


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Where and how to POST. ``headers`` may hold secrets: never logged."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)
    timeout_s: float = 5.0
    retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    queue_size: int = 1000

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"webhook URL must be http(s)://host/...; got {redact_url(self.url)}")
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError("webhook timeout must be positive; retries and backoff not negative")
        if self.queue_size < 1:
            raise ConfigError("webhook queue_size must be at least 1")

    def __repr__(self) -> str:
        return f"WebhookConfig(url={redact_url(self.url)!r}, timeout_s={self.timeout_s}, retries={self.retries})"

    @staticmethod
    def from_settings(
        raw: Mapping[str, Any], *, env: Mapping[str, str] | None = None, source: str | None = None
    ) -> WebhookConfig:
        """Read ``[audit.webhook]`` (see the module docstring).

        Raises:
            ConfigError: naming the key, if a key is unknown or of the wrong type, neither or both
                of ``url`` and ``url_env`` are given, or a named environment variable is unset.
        """
        env = os.environ if env is None else env
        known = {"url", "url_env", "headers", "timeout", "retries", "backoff", "max_backoff", "queue_size"}
        for key in raw:
            if key not in known:
                raise ConfigError(
                    f"audit.webhook: unknown key {key!r}; known keys: {', '.join(sorted(known))}", file=source
                )
        if ("url" in raw) == ("url_env" in raw):
            raise ConfigError("audit.webhook: give exactly one of 'url' and 'url_env'", file=source)
        if "url" in raw:
            url = raw["url"]
            if not isinstance(url, str):
                raise ConfigError("audit.webhook: key 'url': expected a string", file=source)
        else:
            url = _from_env(env, raw["url_env"], "url_env", source)
        headers_raw = raw.get("headers", {})
        if not isinstance(headers_raw, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers_raw.items()
        ):
            raise ConfigError("audit.webhook: key 'headers': expected a table of name = \"value\"", file=source)
        headers = {
            k: _from_env(env, v[4:], f"headers.{k}", source) if v.startswith("env:") else v
            for k, v in headers_raw.items()
        }
        numbers: dict[str, float] = {}
        for key, default in (("timeout", 5.0), ("backoff", 0.5), ("max_backoff", 30.0)):
            value = raw.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"audit.webhook: key {key!r}: expected a number of seconds", file=source)
            numbers[key] = float(value)
        counts: dict[str, int] = {}
        for key, default_count in (("retries", 3), ("queue_size", 1000)):
            value = raw.get(key, default_count)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"audit.webhook: key {key!r}: expected a whole number", file=source)
            counts[key] = value
        try:
            return WebhookConfig(
                url=url,
                headers=headers,
                timeout_s=numbers["timeout"],
                retries=counts["retries"],
                backoff_s=numbers["backoff"],
                max_backoff_s=numbers["max_backoff"],
                queue_size=counts["queue_size"],
            )
        except ConfigError as e:
            raise ConfigError(f"audit.webhook: {e.message}", file=source) from None


def _from_env(env: Mapping[str, str], name: Any, key: str, source: str | None) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"audit.webhook: key {key!r}: expected the name of an environment variable", file=source)
    value = env.get(name)
    if not value:
        raise ConfigError(f"audit.webhook: key {key!r}: environment variable {name} is not set", file=source)
    return value


@dataclass(slots=True)
class WebhookStats:
    """What a webhook did so far."""

    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    attempts: int = 0


class _Stop:
    """Queue marker: the worker ends here."""


class Webhook:
    """A webhook with its delivery thread. Use as a context manager, or call :meth:`close`.

    Example:
        >>> with Webhook(WebhookConfig("https://hooks.example/T/B/X")) as hook:  # doctest: +SKIP
        ...     hook.send({"rule": "large delete", "version": 12})
    """

    def __init__(self, config: WebhookConfig) -> None:
        self.config = config
        self.stats = WebhookStats()
        self.where = redact_url(config.url)
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[bytes, str] | _Stop] = queue.Queue(maxsize=config.queue_size)
        self._closing = threading.Event()
        self._deadline: float | None = None
        self._opener = urllib.request.build_opener(_NoRedirects())
        self._thread = threading.Thread(target=self._run, name="deltatail-webhook", daemon=True)
        self._thread.start()

    def __enter__(self) -> Webhook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, document: Mapping[str, Any], *, label: str = "document") -> bool:
        """Queue ``document`` for delivery; never blocks.

        Args:
            document: a JSON-serialisable mapping.
            label: what the document is, for log lines (e.g. ``alert 'x' at version 12``).

        Returns:
            Whether it was queued (``False``: the webhook is closed or its queue is full; logged).
        """
        if self._closing.is_set():
            log.warning("webhook %s is closed: %s not sent", self.where, label)
            self._count("dropped", 1)
            return False
        try:
            body = orjson.dumps(document)
        except TypeError as e:
            log.error("webhook %s: %s is not JSON-serialisable (%s): not sent", self.where, label, e)
            self._count("dropped", 1)
            return False
        try:
            self._queue.put_nowait((body, label))
        except queue.Full:
            self._count("dropped", 1)
            log.warning(
                "webhook %s is falling behind (%d documents waiting): %s dropped",
                self.where,
                self.config.queue_size,
                label,
            )
            return False
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop taking documents, deliver what is queued for at most ``timeout_s``, then stop the thread.

        What is still queued at the deadline is dropped and counted (logged).
        """
        if self._closing.is_set():
            return
        self._deadline = time.monotonic() + timeout_s
        self._closing.set()
        with contextlib.suppress(queue.Full):  # a full queue: the worker stops at the deadline anyway
            self._queue.put(_Stop(), timeout=timeout_s)
        self._thread.join(max(0.0, self._deadline - time.monotonic()) + 1.0)
        left = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if not isinstance(item, _Stop):
                left += 1
        if left:
            self._count("dropped", left)
            log.warning("webhook %s: %d documents not delivered before closing", self.where, left)
        if self._thread.is_alive():  # still inside a request past the deadline: let it end after that one
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(_Stop())

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    # -- the delivery thread ------------------------------------------------------------------------

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, _Stop):
                return
            if self._past_deadline():
                self._count("dropped", 1)
                log.warning("webhook %s: closing deadline passed, %s not delivered", self.where, item[1])
                return
            body, label = item
            self._deliver(body, label)

    def _deliver(self, body: bytes, label: str) -> None:
        c = self.config
        delay = c.backoff_s
        attempts = c.retries + 1
        reason = ""
        for attempt in range(1, attempts + 1):
            self._count("attempts", 1)
            retry, reason = self._post(body)
            if not reason:
                self._count("delivered", 1)
                if attempt > 1:
                    log.info("webhook %s: %s delivered at attempt %d", self.where, label, attempt)
                return
            if not retry or attempt == attempts:
                break
            log.warning(
                "webhook %s: %s failed (%s); attempt %d of %d, next in %.1f s",
                self.where,
                label,
                reason,
                attempt,
                attempts,
                delay,
            )
            self._pause(delay)
            if self._past_deadline():
                break
            delay = min(delay * 2, c.max_backoff_s)
        self._count("failed", 1)
        log.error("webhook %s: %s not delivered: %s", self.where, label, reason)

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` before the next attempt, but never past the closing deadline."""
        end = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            limit = end if self._deadline is None else min(end, self._deadline)
            if now >= limit:
                return
            if self._closing.is_set():
                time.sleep(limit - now)
            else:
                self._closing.wait(limit - now)  # close() wakes us to apply its deadline

    def _post(self, body: bytes) -> tuple[bool, str]:
        """One attempt: ``(retry?, "")`` on success, else ``(worth retrying, reason without the URL)``."""
        headers = {"Content-Type": "application/json", "User-Agent": "deltatail", **self.config.headers}
        request = urllib.request.Request(self.config.url, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.config.timeout_s) as response:
                response.read()
                status = int(response.status)
        except urllib.error.HTTPError as e:
            e.close()
            if 300 <= e.code < 400:
                return False, f"HTTP {e.code}: a redirect (redirects are not followed; fix the webhook URL)"
            return e.code in RETRY_STATUSES, f"HTTP {e.code}"
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                return True, f"no answer within {self.config.timeout_s:g} s (connecting)"
            return True, self._scrub(f"connection failed: {e.reason}")
        except TimeoutError:
            return True, f"no answer within {self.config.timeout_s:g} s"
        except (OSError, ValueError) as e:
            return True, self._scrub(f"{type(e).__name__}: {e}")
        if 200 <= status < 300:
            return False, ""
        return status in RETRY_STATUSES, f"HTTP {status}"

    def _scrub(self, text: str) -> str:
        """``text`` with the URL and each of its parts that may be secret replaced by the redacted form."""
        parts = urlsplit(self.config.url)
        for secret in (self.config.url, parts.path, parts.query, parts.netloc):
            if secret and len(secret) > 1 and secret in text:
                text = text.replace(secret, "…")
        return text
