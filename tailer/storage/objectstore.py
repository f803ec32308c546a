"""Object stores (S3, Azure Blob / ADLS Gen2, GCS) as a :class:`~tailer.storage.base.Storage`, on obstore.

Built on obstore, the Python binding of the Rust ``object_store`` crate that
delta-rs uses; chosen over ``pyarrow.fs`` because it lists from a key (S3
``start-after``, Azure ``startFrom``, GCS ``start-after``: one request for the
new files of a ``_delta_log`` however long it is, where ``pyarrow.fs`` lists
the whole prefix) and reads without an extra HEAD (see ``benchmarks/README.md``).
One :class:`ObjectStoreStorage` serves every URI of the three clouds
(:mod:`tailer.storage.uris`), with one client per (cloud, bucket, account),
configured by :mod:`tailer.storage.options`.

Parquet files are read through :class:`ObjectInputFile`: ranged GETs, the
first of which fetches the file's last 64 KiB (its footer) in one request;
with ``pre_buffer`` Arrow coalesces the column chunks it needs into few reads.

Errors: a missing object is :class:`~state.errors.MissingFileError`, as
locally. A store that cannot be reached, throttles, fails or refuses access is
a :class:`~state.errors.StorageError` (``transient`` where trying again later
may work) whose message holds the operation, the URI and the HTTP status or
connection failure, never a credential: obstore's own text (which carries
request URLs and response bodies) is not passed on.
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import obstore as obs
import pyarrow as pa

from deltatail.state.errors import DeltaTailError, MissingFileError
from deltatail.tailer.storage.base import FileInfo
from deltatail.tailer.storage.failures import translate
from deltatail.tailer.storage.options import Store, build_store, merge_options, reading_config, redacted, retry_config
from deltatail.tailer.storage.prefetch import Prefetcher
from deltatail.tailer.storage.uris import Cloud, ObjectUri, parse_uri

if TYPE_CHECKING:
    from obstore import ObjectMeta

DEFAULT_TAIL_BYTES = 64 << 10
"""How much of a file's end :meth:`ObjectStoreStorage.open_input` fetches in its first request (the footer)."""


#: The kinds :class:`RequestCounter` counts as requests: a listing call (not its pages), a concurrent
#: multi-range read (not its ranges), and each single request.
REQUESTS = frozenset({"head", "get", "get_range", "get_ranges", "list"})


class RequestCounter:
    """Requests issued, by kind (thread-safe).

    Kinds: ``head``, ``get`` (whole object), ``get_range`` (one range), ``get_ranges`` (calls of the
    concurrent multi-range read), ``list`` (listing calls), ``list_page`` (chunks of at most 1,000
    listed objects: S3's and GCS's page size; an Azure page holds up to 5,000) and ``listed`` (objects
    returned: not a request).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._requests = 0

    def add(self, kind: str, n: int = 1, *, requests: bool | None = None) -> None:
        """Count ``n`` of ``kind``; ``requests`` says whether they are requests (default: by kind, :data:`REQUESTS`)."""
        with self._lock:
            self._counts[kind] += n
            if kind in REQUESTS if requests is None else requests:
                self._requests += n

    def snapshot(self) -> dict[str, int]:
        """The counts so far."""
        with self._lock:
            return dict(self._counts)

    def take(self) -> dict[str, int]:
        """The counts so far, and reset them."""
        with self._lock:
            self._requests = 0
            out = dict(self._counts)
            self._counts.clear()
            return out

    def requests(self) -> int:
        """The requests sent so far, at least: never more than the store saw.

        A listing counts one request (its further pages are not told apart from the first's), and a
        concurrent multi-range read one (object_store may merge its ranges into fewer requests, or
        split them into more).
        """
        with self._lock:
            return self._requests


class ObjectInputFile(io.RawIOBase):
    """One object opened for random access by ranged GETs, for ``pa.PythonFile`` and ``pyarrow.parquet``.

    The first read fetches the object's last ``tail_bytes`` (or all of a smaller object) in one
    request and keeps them: the Parquet footer, and often the last column chunks, are served from
    there. Every other read is one ranged GET of exactly the bytes asked for. :meth:`prefetch`
    fetches a set of ranges concurrently (object_store merges close ones) for reads that follow.
    """

    def __init__(
        self,
        store: Store,
        key: str,
        uri: str,
        size: int,
        *,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        counter: RequestCounter | None = None,
    ) -> None:
        super().__init__()
        self._store = store
        self._key = key
        self._uri = uri
        self._size = size
        self._pos = 0
        self._tail_bytes = tail_bytes
        self._counter = counter or RequestCounter()
        self._cached: list[tuple[int, bytes]] = []  # (start, bytes), few entries
        self._tail_fetched = tail_bytes <= 0

    # io.RawIOBase
    def readable(self) -> bool:
        """Always."""
        return True

    def seekable(self) -> bool:
        """Always."""
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` (from the start, the current position or the end)."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        """The current position."""
        return self._pos

    def size(self) -> int:
        """The object's size in bytes."""
        return self._size

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` from the current position; fewer bytes only at the end of the object."""
        view = memoryview(buffer).cast("B")
        data = self._read_at(self._pos, len(view))
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes from the current position (all to the end if ``size`` is negative or ``None``)."""
        n = self._size - self._pos if size is None or size < 0 else size
        data = self._read_at(self._pos, n)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        """The rest of the object."""
        return self.read(-1)

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch ``(start, length)`` ranges now, concurrently, for reads that follow.

        Raises:
            MissingFileError: if the object is gone.
            StorageError: if the store fails.
        """
        wanted = [(s, min(n, self._size - s)) for s, n in ranges if n > 0 and s < self._size]
        if not wanted:
            return
        try:
            bufs = obs.get_ranges(self._store, self._key, starts=[s for s, _ in wanted], lengths=[n for _, n in wanted])
        except Exception as e:
            raise translate(e, "read", self._uri) from None
        self._counter.add("get_ranges")
        self._counter.add("get_range", len(wanted), requests=False)  # the call above counted as the request
        self._cached.extend((s, bytes(b)) for (s, _), b in zip(wanted, bufs, strict=True))

    def _read_at(self, pos: int, n: int) -> bytes:
        n = min(n, self._size - pos)
        if n <= 0:
            return b""
        if not self._tail_fetched:
            start = max(0, self._size - self._tail_bytes)
            self._cached.append((start, self._fetch(start, self._size - start)))
            self._tail_fetched = True
        for start, data in self._cached:
            if start <= pos and pos + n <= start + len(data):
                return data[pos - start : pos - start + n]
        return self._fetch(pos, n)

    def _fetch(self, start: int, length: int) -> bytes:
        try:
            buf = obs.get_range(self._store, self._key, start=start, length=length)
        except Exception as e:
            raise translate(e, "read", self._uri) from None
        self._counter.add("get_range")
        return bytes(buf)


class ObjectStoreStorage:
    """:class:`~tailer.storage.base.Storage` over S3, Azure Blob / ADLS Gen2 and GCS (see the module doc).

    Args:
        options: merged storage options (:func:`merge_options`), delta-rs spelling.
        counter: where requests are counted (a new one if not given); see :attr:`counter`.
        tail_bytes: what :meth:`open_input` fetches first from a file's end.
        concurrency: requests in flight in :meth:`read_many` and when fetching ahead (default: the
            ``deltatail_concurrency`` option, 16).
        read_ahead_bytes: the most bytes fetched ahead and not yet read (default: the
            ``deltatail_read_ahead_bytes`` option, 64 MiB); 0 fetches nothing ahead.

    Raises:
        ConfigError: if a retry or reading option is malformed (client options are checked when a bucket
            is first used).
    """

    remote = True
    local_files = False

    def __init__(
        self,
        options: Mapping[str, str] | None = None,
        *,
        counter: RequestCounter | None = None,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        concurrency: int | None = None,
        read_ahead_bytes: int | None = None,
    ) -> None:
        self.options = merge_options(options)
        retry_config(self.options)  # fail early on a malformed retry option
        configured_concurrency, configured_bytes = reading_config(self.options)
        self.counter = counter or RequestCounter()
        self.tail_bytes = tail_bytes
        self.concurrency = configured_concurrency if concurrency is None else concurrency
        self.read_ahead_bytes = configured_bytes if read_ahead_bytes is None else read_ahead_bytes
        self._stores: dict[tuple[Cloud, str, str | None], Store] = {}
        self._lock = threading.Lock()
        self._prefetcher = Prefetcher(self._fetch, concurrency=self.concurrency, max_bytes=self.read_ahead_bytes)

    def __repr__(self) -> str:
        return f"ObjectStoreStorage(options={redacted(self.options)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles as its options (obstore clients are rebuilt on the other side; obstore stores pickle too).

        Only for handing to reader processes on the same machine: options may hold secrets, so a pickled
        storage must never be written to offsets, checkpoints or logs.
        """
        return (_rebuild, (self.options, self.tail_bytes, self.concurrency, self.read_ahead_bytes))

    # -- clients

    def _resolve(self, path: str) -> tuple[Store, ObjectUri]:
        u = parse_uri(path)
        ident = (u.cloud, u.bucket, u.account)
        with self._lock:
            store = self._stores.get(ident)
            if store is None:
                store = self._stores[ident] = build_store(u, self.options)
        return store, u

    def _resolve_object(self, path: str) -> tuple[Store, ObjectUri]:
        """Like :meth:`_resolve`, for a single object: a URI of a bucket itself names none.

        Raises:
            MissingFileError: if ``path`` names a bucket, not an object in it.
        """
        store, u = self._resolve(path)
        if not u.key:
            raise MissingFileError("not an object: the URI names a bucket or container", file=path)
        return store, u

    # -- Storage

    def list_from(self, directory: str, start_after: str | None = None) -> list[FileInfo]:
        """Files directly in ``directory`` named after ``start_after``, in name order (see ``Storage.list_from``).

        One listing request from ``start_after`` (S3 ``start-after``, Azure ``startFrom``, GCS
        ``start-after``), paging on while there are more; names are checked again here, as an emulator
        or an old API version may ignore the offset. A subdirectory (``_delta_log/_sidecars/``) is
        skipped over with a new listing that starts after it, instead of paging through its files.

        Raises:
            MissingFileError: if ``start_after`` is ``None`` and nothing lies under ``directory``.
            StorageError: if the store cannot be reached or refuses access.
        """
        store, u = self._resolve(directory)
        prefix = u.key
        out: list[FileInfo] = []
        floor = start_after  # names at or below it are not wanted, whatever the server returns
        seen_any = False
        while True:
            skip_to: str | None = None
            offset = None if floor is None else (f"{prefix}/{floor}" if prefix else floor)
            self.counter.add("list")
            try:
                for chunk in obs.list(store, prefix or None, offset=offset, chunk_size=1000):
                    self.counter.add("list_page")
                    self.counter.add("listed", len(chunk))
                    for meta in chunk:
                        seen_any = True
                        name = _relative(meta["path"], prefix)
                        if floor is not None and name <= floor:
                            continue
                        if "/" in name:
                            # '0' follows '/': a listing after "<sub>0" starts past the whole subdirectory
                            skip_to = name.split("/", 1)[0] + "0"
                            break
                        out.append(_info(meta, name))
                    if skip_to is not None:
                        break
            except DeltaTailError:
                raise
            except Exception as e:
                raise translate(e, "list", directory) from None
            if skip_to is None:
                break
            floor = skip_to  # strictly greater than before: the loop ends
        if not seen_any and start_after is None:
            raise MissingFileError("directory does not exist (no object under it)", file=directory)
        out.sort(key=lambda f: f.name)
        return out

    def prefetch(self, files: Sequence[tuple[str, int | None]]) -> None:
        """Start fetching whole ``(path, size)`` files concurrently, for reads to come (see ``Storage.prefetch``)."""
        self._prefetcher.prefetch(files)

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """See ``Storage.read``: one GET (ranged unless the whole object is asked for), or a prefetched file.

        Raises:
            MissingFileError: if the object does not exist.
            StorageError: if the store cannot be reached or refuses access.
        """
        if offset == 0 and length is None:
            prefetched = self._prefetcher.take(path)
            return prefetched if prefetched is not None else self._fetch(path)
        store, u = self._resolve_object(path)
        try:
            self.counter.add("get_range")
            if length is None:
                return bytes(obs.get(store, u.key, options={"range": {"offset": offset}}).bytes())
            if length == 0:
                return b""
            return bytes(obs.get_range(store, u.key, start=offset, length=length))
        except Exception as e:
            raise translate(e, "read", path) from None

    def _fetch(self, path: str) -> bytes:
        """The whole object: one GET.

        Raises:
            MissingFileError: if the object does not exist.
            StorageError: if the store cannot be reached or refuses access.
        """
        store, u = self._resolve_object(path)
        self.counter.add("get")
        try:
            return bytes(obs.get(store, u.key).bytes())
        except Exception as e:
            raise translate(e, "read", path) from None

    def read_many(self, paths: Sequence[str]) -> list[bytes]:
        """The whole contents of each of ``paths``, in order, fetched :attr:`concurrency` at a time.

        Raises:
            MissingFileError: if one of them does not exist (the first, in ``paths`` order).
            StorageError: if the store cannot be reached or refuses access.
        """
        if not paths:
            return []
        resolved = [self._resolve_object(p) for p in paths]

        async def fetch_all() -> list[bytes | BaseException]:
            sem = asyncio.Semaphore(self.concurrency)

            async def one(store: Store, key: str) -> bytes:
                async with sem:
                    self.counter.add("get")
                    result = await obs.get_async(store, key)
                    return bytes(await result.bytes_async())

            return await asyncio.gather(*(one(s, u.key) for s, u in resolved), return_exceptions=True)

        results = _run(fetch_all())
        out: list[bytes] = []
        for path, r in zip(paths, results, strict=True):
            if isinstance(r, BaseException):
                if not isinstance(r, Exception):
                    raise r
                raise translate(r, "read", path) from None
            out.append(r)
        return out

    def open_input(self, path: str, size: int | None = None) -> pa.NativeFile:
        """``path`` for random access (see ``Storage.open_input``); ``size`` saves the HEAD request.

        A prefetched file is served from memory.

        Raises:
            MissingFileError: if the object does not exist (found at once without ``size``, else on first read).
            StorageError: if the store cannot be reached or refuses access.
        """
        prefetched = self._prefetcher.take(path)
        if prefetched is not None:
            return pa.BufferReader(prefetched)
        return pa.PythonFile(self.open_object(path, size), mode="r")

    def open_object(self, path: str, size: int | None = None) -> ObjectInputFile:
        """Like :meth:`open_input`, but the Python file itself, whose :meth:`ObjectInputFile.prefetch` is usable.

        Raises:
            MissingFileError: if the object does not exist (found at once without ``size``, else on first read).
            StorageError: if the store cannot be reached or refuses access.
        """
        store, u = self._resolve_object(path)
        if size is None:
            size = self.stat(path).size
        return ObjectInputFile(store, u.key, path, size, tail_bytes=self.tail_bytes, counter=self.counter)

    def stat(self, path: str) -> FileInfo:
        """See ``Storage.stat``: one HEAD request.

        Raises:
            MissingFileError: if the object does not exist.
            StorageError: if the store cannot be reached or refuses access.
        """
        store, u = self._resolve_object(path)
        self.counter.add("head")
        try:
            meta = obs.head(store, u.key)
        except Exception as e:
            raise translate(e, "stat", path) from None
        return _info(meta, u.key.rsplit("/", 1)[-1])

    def stat_keeping(self, path: str) -> FileInfo:
        """See ``Storage.stat_keeping``: one GET, whose bytes the next :meth:`read` of the file takes.

        A GET costs what a HEAD costs, and a commit file that exists is read right after it is found.

        Raises:
            MissingFileError: if the object does not exist.
            StorageError: if the store cannot be reached or refuses access.
        """
        store, u = self._resolve_object(path)
        self.counter.add("get")
        try:
            result = obs.get(store, u.key)
            data = bytes(result.bytes())
        except Exception as e:
            raise translate(e, "stat", path) from None
        self._prefetcher.keep(path, data)
        return _info(result.meta, u.key.rsplit("/", 1)[-1])

    def exists(self, path: str) -> bool:
        """Whether the object ``path`` exists: one HEAD request (a "directory" is not an object here).

        Raises:
            StorageError: if the store cannot be reached or refuses access.
        """
        try:
            self.stat(path)
        except MissingFileError:
            return False
        return True


def _rebuild(options: dict[str, str], tail_bytes: int, concurrency: int, read_ahead_bytes: int) -> ObjectStoreStorage:
    return ObjectStoreStorage(
        options, tail_bytes=tail_bytes, concurrency=concurrency, read_ahead_bytes=read_ahead_bytes
    )


def _relative(path: str, prefix: str) -> str:
    return path[len(prefix) + 1 :] if prefix else path


def _info(meta: ObjectMeta, name: str) -> FileInfo:
    """A FileInfo whose mtime is in whole seconds.

    A HEAD's ``Last-Modified`` header has no finer resolution and a listing may have (GCS): whole
    seconds make both ways of learning a commit's time agree.
    """
    seconds = int(meta["last_modified"].timestamp())
    return FileInfo(name, int(meta["size"]), seconds * 1000)


_loop_local = threading.local()


def _run(coro: Any) -> Any:
    """Run a coroutine to completion on this thread's own event loop (kept for reuse)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_loop_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _loop_local.loop = asyncio.new_event_loop()
    return loop.run_until_complete(coro)
