"""Iceberg snapshots and content files as deltatail plans with them. Pure: no IO, no pyiceberg.

The values are filled at one edge (:mod:`tailer.iceberg.metadata`) from pyiceberg's parsed metadata,
manifest lists and manifests; everything after works on these frozen values.

Spec rules quoted where they matter:

- Snapshot ancestry: "``parent-snapshot-id``: the snapshot ID of the snapshot's parent. Omitted for
  any snapshot with no parent"; a branch's head is ``refs.main.snapshot-id`` (``current-snapshot-id``).
- Sequence numbers: "``sequence-number``: a monotonically increasing long that tracks the order of
  changes to a table" (v2+); v1 tables have none (it reads as 0).
- Content: "``content``: type of content stored by the data file: data, equality deletes, or
  position deletes (all v1 files are data files)": 0, 2 and 1 here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deltatail.state.errors import UnsupportedFeatureError

#: Manifest entry content kinds.
DATA = 0
POSITION_DELETES = 1
EQUALITY_DELETES = 2

#: The snapshot operations of the spec; ``replace`` "data and delete files were added and removed
#: without changing table data; i.e., compaction".
OPERATIONS = frozenset({"append", "replace", "overwrite", "delete"})

#: The format versions deltatail reads.
SUPPORTED_FORMAT_VERSIONS = frozenset({1, 2, 3})


@dataclass(frozen=True, slots=True)
class ContentFile:
    """One live data or delete file of a snapshot, as its manifest entry names it.

    Attributes:
        path: the file's location as written in the manifest (absolute URI or path).
        content: :data:`DATA`, :data:`POSITION_DELETES` or :data:`EQUALITY_DELETES`.
        spec_id: the partition spec the file was written with.
        partition: the file's partition values in spec order (``()`` when unpartitioned).
        record_count: rows in the file (for a delete file, deletes in it).
        size: the file's size in bytes.
        data_sequence: the entry's data sequence number (0 in v1 tables).
        file_format: ``PARQUET``, ``AVRO``, ``ORC`` or ``PUFFIN``.
        equality_ids: for equality deletes, the field ids the deletes compare.
        referenced_data_file: for position deletes, the one data file they name, if the writer says so.
        content_offset: for a deletion vector (a ``PUFFIN`` file), where its blob starts.
        content_size: for a deletion vector, its blob's length (``content_size_in_bytes``).
    """

    path: str
    content: int
    spec_id: int
    partition: tuple[Any, ...]
    record_count: int
    size: int
    data_sequence: int
    file_format: str = "PARQUET"
    equality_ids: tuple[int, ...] = ()
    referenced_data_file: str | None = None
    content_offset: int | None = None
    content_size: int | None = None

    @property
    def is_data(self) -> bool:
        """Whether the file holds rows (not deletes)."""
        return self.content == DATA

    @property
    def is_deletion_vector(self) -> bool:
        """Whether it is a v3 deletion vector: "position delete files [...] stored in Puffin files"."""
        return self.content == POSITION_DELETES and self.file_format == "PUFFIN"


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """One snapshot of the table's metadata.

    Attributes:
        snapshot_id: its id.
        parent_id: its parent's id, ``None`` for the first snapshot.
        sequence_number: its sequence number (0 in v1 tables).
        timestamp_ms: when it was committed (epoch ms).
        operation: ``summary.operation`` (``append``, ``overwrite``, ``delete``, ``replace``), if given.
        summary: the whole summary, sorted by key.
        schema_id: the schema current when it was written, if recorded.
        manifest_list: the location of its manifest list.
    """

    snapshot_id: int
    parent_id: int | None
    sequence_number: int
    timestamp_ms: int
    operation: str | None
    summary: tuple[tuple[str, str], ...]
    schema_id: int | None
    manifest_list: str


@dataclass(frozen=True, slots=True)
class TableState:
    """What a metadata file says about the table, as far as change rows go.

    Attributes:
        table_uuid: ``table-uuid``: a table dropped and re-created at the same place has another.
        format_version: 1, 2 or 3.
        location: ``location`` as written.
        snapshots: every snapshot the metadata still holds, by id.
        main_head: the head of the ``main`` branch, ``None`` before the first snapshot.
        unpartitioned_specs: ids of the partition specs with no fields.
        last_updated_ms: ``last-updated-ms``.
    """

    table_uuid: str
    format_version: int
    location: str
    snapshots: dict[int, SnapshotInfo]
    main_head: int | None
    unpartitioned_specs: frozenset[int]
    last_updated_ms: int

    def require_supported(self, table: str | None) -> None:
        """Refuse a format version deltatail does not read.

        Raises:
            UnsupportedFeatureError: for format versions other than 1, 2 and 3.
        """
        if self.format_version not in SUPPORTED_FORMAT_VERSIONS:
            raise UnsupportedFeatureError(
                f"Iceberg format version {self.format_version} is not supported (deltatail reads v1 to v3)",
                features=frozenset({f"format-version {self.format_version}"}),
                table=table,
            )
