"""A Lance dataset's files through the storage seam: versions, manifests, transactions, deletion files, row ids.

Versions are found by Lance's naming rules (:func:`state.lance.manifest.parse_manifest_name`): the
``_versions/`` directory is listed (both naming schemes; anything else there is ignored, and
``latest_version_hint.json`` is never trusted), and a given version's manifest is looked up by its
name (one request), so following a dataset does not list ``_versions/`` for every new version.
A manifest visible under its final name is complete: Lance commits by an atomic create-if-absent.

Errors name the dataset, the version and the file: a version that is not there is a
:class:`~state.errors.VersionNotFoundError` (cleaned up by ``cleanup_old_versions`` when newer
versions exist, with a recovery hint); a missing deletion or row-id file is a
:class:`~state.errors.MissingFileError`; a file that does not decode is an
:class:`~state.errors.InvalidLogError`.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
from pyroaring import BitMap

from deltatail.state.errors import (
    DeletionVectorError,
    DeltaTailError,
    InvalidLogError,
    MissingFileError,
    StorageError,
    TableNotFoundError,
    UnsafePathError,
    VersionNotFoundError,
)
from deltatail.state.lance.manifest import (
    DeletionFile,
    ExternalRowIds,
    Fragment,
    Manifest,
    Transaction,
    decode_manifest,
    decode_transaction,
    manifest_name,
    parse_manifest_name,
    transaction_bytes,
)
from deltatail.state.lance.planning import VersionDiff
from deltatail.state.lance.row_ids import decode_row_ids
from deltatail.state.paths import resolve_logged_path
from deltatail.tailer.storage import FileInfo, Storage
from deltatail.tailer.table import table_storage

VERSIONS_DIR = "_versions"
#: Where a fragment's data files are, below the root.
DATA_DIR = "data"
#: Where transaction files are, below the root (a manifest names one by its name).
TRANSACTIONS_DIR = "_transactions"
#: What a user can do when the version a tailer or range needs was cleaned up.
CLEANED_UP_HINT = (
    "it was removed by cleanup_old_versions (or never existed); read from a version the dataset still holds "
    "(--starting-version), or start over with a new --state-dir and --initial-snapshot"
)


def join(root: str, *parts: str) -> str:
    """``root/part/...`` for a local path or a URI."""
    return "/".join([root.rstrip("/"), *parts])


def is_lance_dataset(directory: str | Path) -> bool:
    """Whether a local directory holds a Lance dataset (a manifest in ``_versions/``) rather than a ``_delta_log``."""
    base = Path(directory)
    if (base / "_delta_log").is_dir():
        return False
    try:
        names = os.listdir(base / VERSIONS_DIR)
    except OSError:
        return False
    return any(parse_manifest_name(n) is not None for n in names)


def looks_like_lance(root: str, storage: Storage) -> bool:
    """Whether ``root`` holds a Lance dataset: a ``_versions/`` directory with at least one manifest (one listing).

    The probe's own failure is never the error a user sees: when the store refuses to list
    ``_versions/`` (access denied, no such bucket), ``_delta_log/`` is listed instead, and a table
    whose ``_delta_log/`` lists is a Delta table; when the store cannot be reached at all (a
    transient failure: no second wait), or refuses ``_delta_log/`` too, the error is the table's,
    naming the table and its ``_delta_log`` (what a Delta reader reads first).

    Raises:
        StorageError: if the store cannot be reached or refuses access, with ``table`` set to ``root``
            and ``file`` to its ``_delta_log``.
    """
    try:
        listed = storage.list_from(join(root, VERSIONS_DIR))
    except MissingFileError:
        return False
    except StorageError as e:
        log_dir = join(root, "_delta_log")
        if not e.transient:
            try:
                storage.list_from(log_dir)
            except MissingFileError:
                return False  # the Delta reader reports the table missing
            except StorageError as again:
                raise StorageError(
                    again.message, transient=again.transient, table=root, file=log_dir, detail=again.detail
                ) from None
            else:
                return False
        raise StorageError(e.message, transient=e.transient, table=root, file=log_dir, detail=e.detail) from None
    return any(parse_manifest_name(f.name) is not None for f in listed)


@dataclass(frozen=True, slots=True)
class VersionFile:
    """One listed manifest: its version, its name, and whether it uses the V2 naming scheme."""

    version: int
    name: str
    v2: bool
    info: FileInfo


class _LazyRowIds(Mapping[tuple[int, int], pa.Array]):
    """Row-id sequences by ``(version, fragment id)``, decoded on first access (see :meth:`LanceDataset.row_id_map`)."""

    def __init__(self, dataset: LanceDataset, fragments: dict[tuple[int, int], Fragment]) -> None:
        self._dataset = dataset
        self._fragments = fragments
        self._decoded: dict[tuple[int, int], pa.Array] = {}

    def __getitem__(self, key: tuple[int, int]) -> pa.Array:
        if key not in self._decoded:
            self._decoded[key] = self._dataset.row_ids(self._fragments[key], key[0])
        return self._decoded[key]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._fragments)

    def __len__(self) -> int:
        return len(self._fragments)


class LanceDataset:
    """The files of one Lance dataset (see the module docstring). Thread-safe caches; no rows.

    Args:
        root: the dataset's root (a path or URI): the directory that holds ``_versions/``.
        storage: where it is; by default :func:`~tailer.table.table_storage` the root.
        cache: how many decoded manifests to keep.
        external_roots: roots outside the dataset whose files a manifest may name (:mod:`state.paths`).
    """

    def __init__(
        self, root: str, storage: Storage | None = None, *, cache: int = 8, external_roots: tuple[str, ...] = ()
    ) -> None:
        self.root = root.rstrip("/") or root
        self.external_roots = external_roots
        self.storage = storage if storage is not None else table_storage(root)
        self.versions_dir = join(self.root, VERSIONS_DIR)
        self._v2: bool | None = None
        self._lock = threading.Lock()
        self._manifests: OrderedDict[int, tuple[Manifest, bytes]] = OrderedDict()
        self._cache = cache

    # -- versions ------------------------------------------------------------------------------

    def list_versions(self) -> dict[int, VersionFile]:
        """Every version whose manifest is in ``_versions/``, by version.

        Raises:
            TableNotFoundError: if there is no ``_versions/`` directory or no manifest in it.
        """
        try:
            listed = self.storage.list_from(self.versions_dir)
        except MissingFileError as e:
            raise TableNotFoundError("no Lance dataset here (no _versions directory)", table=self.root) from e
        found: dict[int, VersionFile] = {}
        for info in listed:
            parsed = parse_manifest_name(info.name)
            if parsed is not None:
                version, v2 = parsed
                found[version] = VersionFile(version, info.name, v2, info)
        if not found:
            raise TableNotFoundError("no Lance dataset here (no manifest in _versions)", table=self.root)
        self._v2 = any(f.v2 for f in found.values())
        return found

    def latest_version(self) -> int:
        """The newest version (by listing ``_versions/``).

        Raises:
            TableNotFoundError: as :meth:`list_versions`.
        """
        return max(self.list_versions())

    def oldest_version(self) -> int:
        """The oldest version the dataset still holds.

        Raises:
            TableNotFoundError: as :meth:`list_versions`.
        """
        return min(self.list_versions())

    def manifest_path(self, version: int) -> str:
        """The path of ``version``'s manifest under the dataset's naming scheme (V2 unless V1 was seen)."""
        return join(self.versions_dir, manifest_name(version, v2=self._v2 is not False))

    def exists(self, version: int) -> bool:
        """Whether ``version``'s manifest is there (one request; both naming schemes if needed)."""
        return self.manifest_file(version) is not None

    def manifest_file(self, version: int) -> FileInfo | None:
        """``version``'s manifest file (size, modification time) if it is there, as :meth:`exists` looks."""
        paths = [self.manifest_path(version)]
        if self._v2 is None:
            paths.append(join(self.versions_dir, manifest_name(version, v2=False)))
        for path in paths:
            try:
                return self.storage.stat(path)
            except MissingFileError:
                continue
        return None

    # -- manifests -----------------------------------------------------------------------------

    def _read_manifest_bytes(self, version: int) -> bytes:
        names = [manifest_name(version, v2=True), manifest_name(version, v2=False)]
        if self._v2 is False:
            names.reverse()
        for name in names:
            try:
                data = self.storage.read(join(self.versions_dir, name))
            except MissingFileError:
                continue
            if self._v2 is None:  # the naming scheme, known now without a listing
                self._v2 = name == manifest_name(version, v2=True)
            return data
        raise self._missing_version(version)

    def _check_paths(self, manifest: Manifest, version: int) -> None:
        """Check every file the manifest names before anything reads it (pylance reads data files itself).

        Data files are below ``data/``, external row-id files below the root; deletion file names are
        built from numbers. See :func:`state.paths.resolve_logged_path`.

        Raises:
            UnsafePathError: naming the version and the manifest.
        """
        data_dir = join(self.root, DATA_DIR)
        for fragment in manifest.fragments:
            try:
                for data_file in fragment.files:
                    resolve_logged_path(data_dir, data_file.path, self.external_roots)
                if isinstance(fragment.row_ids, ExternalRowIds):
                    resolve_logged_path(self.root, fragment.row_ids.path, self.external_roots)
            except UnsafePathError as e:
                raise UnsafePathError(
                    f"fragment {fragment.id} of the manifest: {e.message}",
                    table=self.root,
                    version=version,
                    file=f"{self.manifest_path(version)} ({e.file})",
                ) from None

    def _missing_version(self, version: int) -> VersionNotFoundError:
        try:
            versions = self.list_versions()
        except TableNotFoundError:
            versions = {}
        file = self.manifest_path(version)
        if versions and version < max(versions):
            return VersionNotFoundError(
                f"version {version} is no longer in the dataset (oldest held: {min(versions)}); {CLEANED_UP_HINT}",
                table=self.root,
                version=version,
                file=file,
            )
        latest = max(versions) if versions else None
        return VersionNotFoundError(
            f"version {version} does not exist yet (latest: {latest})", table=self.root, version=version, file=file
        )

    def manifest(self, version: int) -> Manifest:
        """``version``'s manifest, decoded (cached), every file it names checked by the containment rule.

        Raises:
            VersionNotFoundError: if the version is not there (cleaned up, or not written yet).
            UnsafePathError: if a data or row-id file it names is outside the dataset and every external root.
            InvalidLogError: if the manifest does not decode, or names another version.
        """
        return self._manifest_and_bytes(version)[0]

    def _manifest_and_bytes(self, version: int) -> tuple[Manifest, bytes]:
        with self._lock:
            hit = self._manifests.get(version)
            if hit is not None:
                self._manifests.move_to_end(version)
                return hit
        data = self._read_manifest_bytes(version)
        try:
            manifest = decode_manifest(data)
        except DeltaTailError as e:
            raise e.at(table=self.root, version=version, file=self.manifest_path(version)) from None
        if manifest.version != version:
            raise InvalidLogError(
                f"the manifest of version {version} says it is version {manifest.version}",
                table=self.root,
                version=version,
                file=self.manifest_path(version),
            )
        self._check_paths(manifest, version)
        with self._lock:
            self._manifests[version] = (manifest, data)
            while len(self._manifests) > self._cache:
                self._manifests.popitem(last=False)
        return manifest, data

    def transaction(self, version: int) -> Transaction | None:
        """The transaction that made ``version``: from the manifest file, else ``_transactions/``; ``None`` if none.

        Raises:
            VersionNotFoundError: as :meth:`manifest`.
            MissingFileError: if the manifest names a transaction file that is not there.
            UnsafePathError: if that file is outside ``_transactions/`` (never opened).
            InvalidLogError: if the transaction does not decode.
        """
        manifest, data = self._manifest_and_bytes(version)
        file = self.manifest_path(version)
        if manifest.transaction_file:
            try:
                resolve_logged_path(join(self.root, TRANSACTIONS_DIR), manifest.transaction_file)
            except UnsafePathError as e:
                raise UnsafePathError(e.message, table=self.root, version=version, file=file) from None
        try:
            message = transaction_bytes(data, manifest)
            if message is None and manifest.transaction_file:
                file = resolve_logged_path(join(self.root, TRANSACTIONS_DIR), manifest.transaction_file)
                message = self.storage.read(file)
            return None if message is None else decode_transaction(message)
        except DeltaTailError as e:
            raise e.at(table=self.root, version=version, file=file) from None

    # -- what planning needs -------------------------------------------------------------------

    def deletion_set(self, deletion: DeletionFile, version: int) -> BitMap:
        """The deleted row offsets of a deletion file (``.arrow``: Arrow IPC offsets; ``.bin``: a Roaring bitmap).

        Raises:
            MissingFileError: if the file is not there.
            DeletionVectorError: if it does not decode.
        """
        path = join(self.root, deletion.path)
        try:
            data = self.storage.read(path)
        except MissingFileError as e:
            raise MissingFileError(
                f"deletion file of fragment {deletion.fragment_id} is missing",
                table=self.root,
                version=version,
                file=path,
            ) from e
        try:
            if deletion.bitmap:
                return BitMap.deserialize(data)
            table = ipc.open_file(pa.BufferReader(data)).read_all()
            if table.num_columns != 1 or not pa.types.is_integer(table.schema.field(0).type):
                raise ValueError(f"expected one integer column, got {table.schema}")
            column = table.column(0).combine_chunks()
            if column.null_count:
                raise ValueError("null offsets")
            values = column.to_pylist()
            if values and min(values) < 0:
                raise ValueError("negative offsets")
            return BitMap(values)
        except (ValueError, TypeError, OSError, pa.ArrowException) as e:
            raise DeletionVectorError(
                f"deletion file of fragment {deletion.fragment_id} cannot be read: {e}",
                table=self.root,
                version=version,
                file=path,
            ) from e

    def deletion_sets(self, diff: VersionDiff) -> dict[str, BitMap]:
        """Every deletion set :func:`~state.lance.planning.plan_version` needs for ``diff``, by path.

        Raises:
            MissingFileError, DeletionVectorError: as :meth:`deletion_set`.
        """
        version = diff.after.version
        return {d.path: self.deletion_set(d, version) for d in diff.deletion_files()}

    def row_ids(self, fragment: Fragment, version: int) -> pa.Array:
        """The stable row ids of ``fragment``'s physical rows at ``version``.

        Raises:
            InvalidLogError: if the fragment has no row ids, or they do not decode.
            MissingFileError: if an external row-id file is missing.
        """
        source = fragment.row_ids
        file = self.manifest_path(version)
        if source is None:
            raise InvalidLogError(
                f"fragment {fragment.id} has no row ids in a dataset with stable row ids",
                table=self.root,
                version=version,
                file=file,
            )
        if isinstance(source, ExternalRowIds):
            file = join(self.root, source.path)
            source = self.storage.read(file, source.offset, source.size)
        try:
            return decode_row_ids(source)
        except DeltaTailError as e:
            raise e.at(table=self.root, version=version, file=file) from None

    def row_id_map(self, diff: VersionDiff) -> Mapping[tuple[int, int], pa.Array]:
        """Every row-id sequence :func:`~state.lance.planning.plan_version` may need for ``diff``, read when asked.

        Planning asks only when a version both deletes and inserts rows (a pure delete never does), so
        the sequences are decoded on first access.
        """
        return _LazyRowIds(self, {(v, f.id): f for v, f in diff.row_id_fragments()})

    def timestamp_version(self, timestamp_us: int) -> int:
        """The first version made at or after ``timestamp_us`` (manifest timestamps; binary search).

        Raises:
            VersionNotFoundError: if every version is older.
            TableNotFoundError: as :meth:`list_versions`.
        """
        versions = sorted(self.list_versions())
        lo, hi = 0, len(versions)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.manifest(versions[mid]).timestamp_us >= timestamp_us:
                hi = mid
            else:
                lo = mid + 1
        if lo == len(versions):
            raise VersionNotFoundError(
                "no version was made at or after the starting timestamp", table=self.root, version=versions[-1]
            )
        return versions[lo]
