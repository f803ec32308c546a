"""Event-driven following of object-store tables: the store's own notifications of new ``_delta_log`` objects.

Polling an object store costs a request per table per poll, whether anything happened or not.
A store can instead announce what was written: S3 event notifications delivered to an SQS queue
(built here), Azure Event Grid and GCS Pub/Sub (a :class:`NotificationSource` each, not built yet).
One :class:`NotificationHub` per queue in a process long-polls it on one thread (one request per
``WAIT_SECONDS`` while idle, whatever the number of tables) and wakes the followers of the tables
whose log a notification names.

Notifications are hints, never a source of truth: a follower woken by one still reads commits by
name from its own position and lists the log for gaps (:mod:`tailer.log.follower`), and keeps a slow
safety poll of its own (the ``max_poll_interval``). A lost notification delays a commit until that
poll; a duplicated, delayed or reordered one costs a look that finds nothing new: the rows delivered
are the same. A queue serves one process: two processes reading one queue take each other's
notifications (each then finds its commits by its safety poll only).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol
from urllib.parse import unquote_plus, urlsplit

from deltatail.state.errors import ConfigError, DeltaTailError, StorageError
from deltatail.tailer.storage.uris import parse_uri

log = logging.getLogger("deltatail")

#: Seconds of one long poll of a queue (SQS allows at most 20).
WAIT_SECONDS = 20
#: Messages taken at once (SQS allows at most 10).
BATCH = 10
#: Records of one notification looked at (an S3 event carries one; more is not an S3 event).
MAX_RECORDS = 100
#: Seconds between attempts while the queue cannot be read (the followers' safety polls go on meanwhile).
RETRY_SECONDS = 5.0


class NotificationSource(Protocol):
    """Where notifications of new objects come from (SQS; Azure Event Grid or GCS Pub/Sub would be others)."""

    def receive(self, wait_seconds: float) -> list[tuple[str, str]]:
        """The ``(bucket, key)`` of objects announced since the last call, waiting up to ``wait_seconds`` for one.

        The messages read stay taken (invisible to other readers) until :meth:`acknowledge`.

        Raises:
            StorageError: if the queue cannot be read.
        """
        ...

    def acknowledge(self) -> None:
        """Take the messages of the last :meth:`receive` off the queue (once their followers were woken).

        A message that is not taken off comes back later: a duplicated hint, which costs a look.

        Raises:
            StorageError: if the queue cannot be written.
        """
        ...

    def close(self) -> None:
        """Release the client."""
        ...


def s3_event_objects(body: str) -> Iterator[tuple[str, str]]:
    """The ``(bucket, key)`` of each record of an S3 event notification (keys arrive URL-encoded).

    Anything else (S3's ``s3:TestEvent`` when a configuration is saved, a body that is not such an
    event) names nothing and yields nothing: it is logged at debug level, as a hint that was not one.
    """
    try:
        event = json.loads(body)
    except ValueError:
        log.debug("a notification that is not JSON was ignored")
        return
    records = event.get("Records") if isinstance(event, dict) else None
    if not isinstance(records, list):
        return
    for record in records[:MAX_RECORDS]:
        s3 = record.get("s3") if isinstance(record, dict) else None
        if not isinstance(s3, dict):
            continue
        bucket, obj = s3.get("bucket"), s3.get("object")
        if isinstance(bucket, dict) and isinstance(obj, dict):
            name, key = bucket.get("name"), obj.get("key")
            if isinstance(name, str) and isinstance(key, str):
                yield name, unquote_plus(key)


class SqsNotifications:
    """S3 event notifications read from an SQS queue with boto3 (long polls; messages deleted once read).

    Args:
        queue_url: the queue's URL (``https://sqs.REGION.amazonaws.com/ACCOUNT/NAME``); its scheme
            and host are the endpoint the client talks to.
        options: the table's storage options: ``aws_region``, ``aws_access_key_id``,
            ``aws_secret_access_key`` and ``aws_session_token`` are used when given (else boto3's own
            chain: the environment, a profile, instance credentials).

    Raises:
        ConfigError: if ``queue_url`` is not an ``http(s)://`` URL with a host and a path.
    """

    def __init__(self, queue_url: str, options: Mapping[str, str] | None = None) -> None:
        parts = urlsplit(queue_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path in ("", "/"):
            raise ConfigError("notifications must be the URL of an SQS queue (https://sqs.REGION.amazonaws.com/...)")
        import boto3  # only where notifications are used

        o = {k.lower(): v for k, v in (options or {}).items()}
        region = o.get("aws_region") or o.get("aws_default_region") or _region_of(parts.hostname) or "us-east-1"
        self.queue_url = queue_url
        self._taken: list[str] = []  # receipt handles of the messages read and not yet deleted
        self._client: Any = boto3.client(
            "sqs",
            endpoint_url=f"{parts.scheme}://{parts.netloc}",
            region_name=region,
            aws_access_key_id=o.get("aws_access_key_id"),
            aws_secret_access_key=o.get("aws_secret_access_key"),
            aws_session_token=o.get("aws_session_token"),
        )

    def receive(self, wait_seconds: float) -> list[tuple[str, str]]:
        """See :meth:`NotificationSource.receive`.

        Raises:
            StorageError: if the queue cannot be read (the message names the queue and the failure, no secret).
        """
        try:
            answer = self._client.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=BATCH, WaitTimeSeconds=int(min(wait_seconds, WAIT_SECONDS))
            )
        except Exception as e:
            raise self._error("read", e) from None
        messages = answer.get("Messages", [])[:BATCH]
        self._taken.extend(str(m["ReceiptHandle"]) for m in messages if "ReceiptHandle" in m)
        return [obj for m in messages for obj in s3_event_objects(str(m.get("Body", "")))]

    def acknowledge(self) -> None:
        """See :meth:`NotificationSource.acknowledge` (one ``DeleteMessageBatch`` request, none when nothing was read).

        Deleting after the followers were woken keeps the delete off the path from a commit to its
        rows: the woken follower's GET of the commit goes out alongside it.

        Raises:
            StorageError: if the messages cannot be deleted (they come back: duplicated hints).
        """
        taken, self._taken = self._taken, []
        if not taken:
            return
        entries = [{"Id": str(i), "ReceiptHandle": handle} for i, handle in enumerate(taken)]
        try:
            self._client.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
        except Exception as e:
            raise self._error("write", e) from None

    def _error(self, what: str, e: Exception) -> StorageError:
        """The queue's error: its URL and the failure's kind, never the client's text (request URLs, keys)."""
        why = type(e).__name__
        return StorageError(f"cannot {what} the notification queue {self.queue_url}: {why}", transient=True)

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()


def _region_of(host: str) -> str | None:
    """``us-east-1`` of ``sqs.us-east-1.amazonaws.com``; ``None`` for another host."""
    parts = host.split(".")
    return parts[1] if len(parts) >= 4 and parts[0] == "sqs" and host.endswith(".amazonaws.com") else None


class NotificationHub:
    """One thread reading a :class:`NotificationSource`, calling the subscribers whose log an object is in.

    The thread runs while the hub has subscribers: the first subscription starts it, the last one's
    end stops it (after the long poll in hand, without waiting for it), and a later subscription
    starts a new one. Messages the thread reads while nobody listens are acknowledged and dropped:
    notifications are hints, and every follower looks at its log when it subscribes.

    Args:
        source: the queue.
        retry_seconds: the wait after a failed read before the next.
        wait_seconds: the length of one long poll (at most ``WAIT_SECONDS``, SQS's limit): an idle hub
            sends one request per ``wait_seconds``, and :meth:`close` waits up to that long for the
            poll in hand.
    """

    def __init__(
        self, source: NotificationSource, *, retry_seconds: float = RETRY_SECONDS, wait_seconds: float = WAIT_SECONDS
    ) -> None:
        self.source = source
        self.retry_seconds = retry_seconds
        self.wait_seconds = min(max(wait_seconds, 0.0), WAIT_SECONDS)
        self._lock = threading.Lock()
        self._subscribers: dict[int, tuple[str, str, Callable[[], None]]] = {}
        self._next_id = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The running thread's own stop (set when the last subscriber leaves), and every thread started.
        self._thread_stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: Notifications received that named a followed log, and all received (for metrics and tests).
        self.matched = 0
        self.received = 0

    def subscribe(self, log_dir: str, wake: Callable[[], None]) -> int:
        """Call ``wake`` whenever an object under ``log_dir`` (a ``_delta_log`` URI) is announced; returns a handle."""
        u = parse_uri(log_dir)
        prefix = u.key.rstrip("/") + "/"
        with self._lock:
            self._next_id += 1
            handle = self._next_id
            self._subscribers[handle] = (u.bucket, prefix, wake)
            if self._thread is None and not self._stop.is_set():
                self._thread_stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(self._thread_stop,), name="deltatail-notifications", daemon=True
                )
                self._threads = [t for t in self._threads if t.is_alive()] + [self._thread]
                self._thread.start()
        return handle

    def unsubscribe(self, handle: int) -> None:
        """Stop calling the subscriber of ``handle``; the last one's end stops the hub's thread."""
        with self._lock:
            self._subscribers.pop(handle, None)
            if not self._subscribers and self._thread is not None:
                self._thread_stop.set()
                self._thread = None

    @property
    def running(self) -> bool:
        """Whether the hub's thread is reading the queue (it has subscribers, and :meth:`close` was not called)."""
        with self._lock:
            return self._thread is not None

    def deliver(self, objects: list[tuple[str, str]]) -> None:
        """Wake the subscriber of each announced object's log (each at most once per call)."""
        with self._lock:
            subscribers = list(self._subscribers.values())
        woken: set[int] = set()
        for bucket, key in objects:
            self.received += 1
            for i, (b, prefix, wake) in enumerate(subscribers):
                if b == bucket and key.startswith(prefix):
                    self.matched += 1
                    if i not in woken:
                        woken.add(i)
                        wake()

    def _run(self, stop: threading.Event) -> None:
        while not (stop.is_set() or self._stop.is_set()):
            try:
                objects = self.source.receive(self.wait_seconds)
                self.deliver(objects)  # the followers' looks start now; the delete goes alongside them
                self.source.acknowledge()
            except DeltaTailError as e:
                if stop.is_set() or self._stop.is_set():
                    return
                log.warning("%s; retrying in %gs (the tables' safety polls go on)", e, self.retry_seconds)
                stop.wait(self.retry_seconds)

    def close(self) -> None:
        """Stop the threads (after the long poll in hand) and close the source."""
        self._stop.set()
        with self._lock:
            self._thread_stop.set()
            self._thread = None
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(self.wait_seconds + 5)
        self.source.close()


_hubs: dict[str, NotificationHub] = {}
_hubs_lock = threading.Lock()


def hub_for(queue_url: str, options: Mapping[str, str] | None = None) -> NotificationHub:
    """The process's hub of ``queue_url`` (made on first use, with ``options``' credentials): one per queue.

    Raises:
        ConfigError: if ``queue_url`` is not an SQS queue URL.
    """
    with _hubs_lock:
        hub = _hubs.get(queue_url)
        if hub is None:
            hub = _hubs[queue_url] = NotificationHub(SqsNotifications(queue_url, options))
        return hub


class Subscription:
    """``wake`` called whenever ``hub`` hears of an object under ``log_dir``, until :meth:`close`."""

    def __init__(self, hub: NotificationHub, log_dir: str, wake: Callable[[], None]) -> None:
        self._hub = hub
        self._handle = hub.subscribe(log_dir, wake)

    def close(self) -> None:
        """Stop calling ``wake``."""
        self._hub.unsubscribe(self._handle)


class NotifiedWatcher:
    """A :class:`~tailer.log.watch.Watcher` of one object-store log, woken by a :class:`NotificationHub`."""

    def __init__(self, hub: NotificationHub, log_dir: str) -> None:
        self._event = threading.Event()
        self._hub = hub
        self._handle = hub.subscribe(log_dir, self._event.set)

    def wait(self, timeout: float) -> bool:
        """Block until a notification names the log, :meth:`wake` is called, or ``timeout`` seconds pass."""
        signalled = self._event.wait(max(timeout, 0.0))
        self._event.clear()
        return signalled

    def wake(self) -> None:
        """End a :meth:`wait` now (or the next one)."""
        self._event.set()

    def close(self) -> None:
        """Stop listening (the hub goes on for the other tables)."""
        self._hub.unsubscribe(self._handle)
