"""Reading a Lance plan's rows with pylance (an optional dependency: ``pip install 'deltatail[lance]'``).

A :class:`~state.lance.planning.RowTask` names a fragment, the version to read it at, and the
physical row offsets (or every live row). pylance's ``LanceFragment.take`` takes *logical* indices —
counted without the rows deleted at that version — so each physical offset is shifted down by the
number of deleted offsets before it. Rows come back in the task's order.

Every batch is conformed to the schema of the version being planned (columns it lacks are nulls,
so a delete read from before a column was added fits the version's schema) and gets the three
change columns.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltatail.state.errors import ConfigError, DataFileError, DeltaTailError, MissingFileError, SchemaChangeError
from deltatail.state.feed import COMMIT_TIMESTAMP_TYPE
from deltatail.state.lance.planning import LancePlan, RowTask
from deltatail.tailer.lance.dataset import DATA_DIR, join
from deltatail.tailer.lance.store import pylance_options, scrub
from deltatail.tailer.storage import Storage

if TYPE_CHECKING:
    from lance.dataset import LanceDataset as PyLanceDataset


def lance_module() -> Any:
    """The ``lance`` module (pylance).

    Raises:
        ConfigError: if pylance is not installed.
    """
    try:
        import lance
    except ImportError as e:
        raise ConfigError("reading Lance datasets needs pylance: pip install 'deltatail[lance]'") from e
    return lance


_session: Any = None
_session_lock = threading.Lock()


def shared_session(lance: Any) -> Any:
    """The process's pylance session (``None`` if pylance has none), shared by every :class:`LanceRows`.

    Lance data files are immutable, so the metadata a session caches stays valid across versions
    and datasets: a reader started anew (a new range, a restarted tailer, a Spark task) finds the
    files' metadata in hand. The session bounds its caches itself.
    """
    global _session
    with _session_lock:
        if _session is None and hasattr(lance, "Session"):
            _session = lance.Session()
        return _session


def change_schema_of(data: pa.Schema) -> pa.Schema:
    """A Lance version's change-row schema: its columns plus the three change columns."""
    return (
        pa.schema(list(data))
        .append(pa.field("_change_type", pa.string()))
        .append(pa.field("_commit_version", pa.int64()))
        .append(pa.field("_commit_timestamp", COMMIT_TIMESTAMP_TYPE))
    )


class LanceRows:
    """Reads the rows of Lance plans (see the module docstring).

    Args:
        root: the dataset's root.
        storage: the dataset's storage (to name a missing data file).
        storage_options: deltatail's storage options (delta-rs's spelling) for object stores; pylance gets
            them translated by :func:`~tailer.lance.store.pylance_options`.
        batch_size: the most rows in one batch.
        cache: how many opened versions to keep.
        threads: threads taking rows by offset ahead of the consumer.
        read_ahead: takes in flight at most.

    Raises:
        ConfigError: if pylance is not installed, or a storage option cannot be given to it.
    """

    def __init__(
        self,
        root: str,
        storage: Storage,
        *,
        storage_options: Mapping[str, str] | None = None,
        batch_size: int = 65536,
        cache: int = 4,
        threads: int = 4,
        read_ahead: int = 8,
    ) -> None:
        self.root = root
        self.storage = storage
        self._given = dict(storage_options or {})
        self.storage_options = pylance_options(root, self._given)
        self.batch_size = batch_size
        self.threads = threads
        self.read_ahead = read_ahead
        self._cache = cache
        self._lock = threading.Lock()
        self._opened: OrderedDict[int, PyLanceDataset] = OrderedDict()
        self._lance = lance_module()
        self._session = shared_session(self._lance)

    def dataset(self, version: int) -> PyLanceDataset:
        """The pylance dataset at ``version`` (cached).

        Raises:
            DataFileError: if pylance cannot open it.
        """
        with self._lock:
            hit = self._opened.get(version)
            if hit is not None:
                self._opened.move_to_end(version)
                return hit
        try:
            ds: PyLanceDataset = self._lance.dataset(
                self.root, version=version, storage_options=self.storage_options or None, session=self._session
            )
        except Exception as e:  # pylance raises OSError, ValueError, RuntimeError...
            raise DataFileError(
                f"pylance cannot open the dataset: {scrub(str(e), self._given)}", table=self.root, version=version
            ) from None
        with self._lock:
            self._opened[version] = ds
            while len(self._opened) > self._cache:
                self._opened.popitem(last=False)
        return ds

    def schema(self, version: int) -> pa.Schema:
        """The change rows' schema at ``version``.

        Raises:
            DataFileError: as :meth:`dataset`.
        """
        return change_schema_of(self.dataset(version).schema)

    def batches(self, plan: LancePlan) -> Iterator[pa.RecordBatch]:
        """Every change row of ``plan``, in its order, in the schema of its version.

        Rows taken by offset are read by a few threads ahead of the consumer (``read_ahead`` takes
        of at most ``batch_size`` rows in flight; pylance releases the GIL while it reads); whole
        fragments are streamed when their turn comes.

        Raises:
            MissingFileError: if a data file is missing.
            DataFileError: if pylance cannot read a fragment.
            SchemaChangeError: if a column cannot be read as its type at the plan's version.
        """
        schema = self.schema(plan.version)
        units = [(task, start) for task in plan.tasks for start in self._starts(task)]
        pending: deque[Future[pa.Table]] = deque()
        ahead = iter([u for u in units if u[1] is not None])
        with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="lance-take") as pool:
            try:
                for task, start in units:
                    if start is None:
                        batches: Iterator[pa.RecordBatch] = self._scan(task)
                    else:
                        while len(pending) < self.read_ahead and (nxt := next(ahead, None)) is not None:
                            pending.append(pool.submit(self._take, nxt[0], nxt[1] or 0))
                        batches = iter(pending.popleft().result().to_batches())
                    for batch in batches:
                        if batch.num_rows:
                            yield _conform(batch, schema, task, plan, self.root)
            finally:
                for future in pending:
                    future.cancel()

    def _starts(self, task: RowTask) -> list[int | None]:
        if task.offsets is None:
            return [None]
        return list(range(0, len(task.offsets), self.batch_size))

    def _fragment(self, task: RowTask) -> Any:
        fragment = self.dataset(task.version).get_fragment(task.fragment.id)
        if fragment is None:
            raise DataFileError(
                f"fragment {task.fragment.id} is not in the version pylance opened",
                table=self.root,
                version=task.version,
            )
        return fragment

    def _scan(self, task: RowTask) -> Iterator[pa.RecordBatch]:
        try:
            yield from self._fragment(task).scanner(batch_size=self.batch_size).to_batches()
        except DeltaTailError as e:
            raise e.at(version=task.version) from None
        except Exception as e:  # pylance's errors are OSError, ValueError, RuntimeError...
            raise self._read_error(task, e) from None

    def _take(self, task: RowTask, start: int) -> pa.Table:
        """Rows ``start`` to ``start + batch_size`` of an offset task, in the task's order."""
        import numpy as np  # installed with pylance

        assert task.offsets is not None  # only offset tasks are taken
        try:
            part = task.offsets.slice(start, self.batch_size).to_numpy(zero_copy_only=False).astype(np.int64)
            deleted = (
                np.empty(0, np.int64)
                if task.deleted is None
                else task.deleted.to_numpy(zero_copy_only=False).astype(np.int64)
            )
            logical = part - np.searchsorted(deleted, part, side="left")
            order = np.argsort(logical, kind="stable")
            table = self._fragment(task).take(pa.array(logical[order]))
            inverse = np.empty_like(order)
            inverse[order] = np.arange(len(order))
            return table.take(pa.array(inverse)).combine_chunks()
        except DeltaTailError as e:
            raise e.at(version=task.version) from None
        except Exception as e:  # pylance's errors are OSError, ValueError, RuntimeError...
            raise self._read_error(task, e) from None

    def _read_error(self, task: RowTask, error: Exception) -> DeltaTailError:
        for data_file in task.fragment.files:
            path = join(self.root, DATA_DIR, data_file.path)
            if not self.storage.exists(path):
                return MissingFileError(
                    f"data file of fragment {task.fragment.id} is missing",
                    table=self.root,
                    version=task.version,
                    file=path,
                )
        return DataFileError(
            f"pylance cannot read fragment {task.fragment.id}: {scrub(str(error), self._given)}",
            table=self.root,
            version=task.version,
        )


def _conform(batch: pa.RecordBatch, schema: pa.Schema, task: RowTask, plan: LancePlan, root: str) -> pa.RecordBatch:
    """``batch`` in the plan's change schema, with the change columns filled."""
    n = batch.num_rows
    columns: list[pa.Array] = []
    names = batch.schema.names
    for field in schema:
        if field.name == "_change_type":
            columns.append(pa.repeat(pa.scalar(task.change_type, pa.string()), n))
        elif field.name == "_commit_version":
            columns.append(pa.repeat(pa.scalar(plan.version, pa.int64()), n))
        elif field.name == "_commit_timestamp":
            columns.append(pa.repeat(pa.scalar(plan.timestamp_us, COMMIT_TIMESTAMP_TYPE), n))
        elif field.name in names:
            column = batch.column(names.index(field.name))
            if column.type != field.type:
                try:
                    column = column.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
                    raise SchemaChangeError(
                        f"column {field.name!r} of type {column.type} cannot be read as {field.type}, its type at "
                        f"version {plan.version}",
                        table=root,
                        version=plan.version,
                    ) from e
            columns.append(column)
        else:
            columns.append(pa.nulls(n, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
