"""Iceberg format v3 deletion vectors for the tests, built from the spec (pyiceberg 0.12 writes no v3 tables).

A table is written by pyiceberg (format v2, SQL catalog on SQLite); :func:`commit_vectors` adds one
snapshot whose delete manifest holds the table's deletion vectors, written as the specs say:

- Puffin ("File structure"): ``Magic Blob₁ ... Blobₙ Footer``, the footer ``Magic FooterPayload
  FooterPayloadSize Flags Magic`` (magic ``PFA1``, the payload size a 4-byte little-endian integer,
  the payload the JSON list of blobs with their ``type``, ``fields``, ``snapshot-id``,
  ``sequence-number``, ``offset``, ``length`` and ``properties``);
- a ``deletion-vector-v1`` blob: the combined length of the magic and the vector (4 bytes,
  big-endian), the magic ``D1 D3 39 64``, the vector as a portable 64-bit Roaring bitmap, and the
  CRC-32 of the magic and the vector (4 bytes, big-endian); its properties ``referenced-data-file``
  and ``cardinality``;
- the manifest entry: ``content`` 1 (position deletes), ``file_format`` ``PUFFIN``,
  ``referenced_data_file``, ``content_offset`` and ``content_size_in_bytes`` (the blob's place in
  the Puffin file), ``record_count`` the vector's cardinality. "At most one deletion vector is
  allowed per data file in a snapshot": a new vector for a file replaces the old one (the old
  entry ``DELETED``) and holds its positions too.

The snapshot is committed with pyiceberg's manifest-list writer and its metadata updates;
:func:`as_v3` then writes the newest metadata again marked format version 3 (``next-row-id``
added), as the newest metadata file of the table's directory.
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from collections.abc import Mapping

from iceberg_tables import _DeleteManifestWriter
from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    write_manifest_list,
)
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.typedef import Record
from pyroaring import BitMap64

PUFFIN_MAGIC = b"PFA1"
DV_MAGIC = bytes([0xD1, 0xD3, 0x39, 0x64])
#: The reserved field id of ``_pos``, which a deletion vector's blob names in ``fields``.
ROW_POSITION_ID = 2147483645
#: Where ``referenced_data_file`` is in a v3 ``data_file`` record (pyiceberg's records are positional).
REFERENCED_DATA_FILE = 17


def dv_blob(positions: list[int], *, magic: bytes = DV_MAGIC, crc_delta: int = 0) -> bytes:
    """A ``deletion-vector-v1`` blob of ``positions`` (``magic`` and a CRC off by ``crc_delta`` to damage it)."""
    body = magic + BitMap64(positions).serialize()
    crc = (zlib.crc32(body) + crc_delta) & 0xFFFFFFFF
    return len(body).to_bytes(4, "big") + body + crc.to_bytes(4, "big")


def puffin_file(blobs: list[tuple[str, bytes, int]]) -> tuple[bytes, list[tuple[int, int]]]:
    """A Puffin file of ``(referenced data file, blob, cardinality)`` blobs; and each blob's ``(offset, length)``."""
    out = bytearray(PUFFIN_MAGIC)
    placed, described = [], []
    for data_file, blob, cardinality in blobs:
        placed.append((len(out), len(blob)))
        described.append(
            {
                "type": "deletion-vector-v1",
                "fields": [ROW_POSITION_ID],
                "snapshot-id": -1,
                "sequence-number": -1,
                "offset": len(out),
                "length": len(blob),
                "properties": {"referenced-data-file": data_file, "cardinality": str(cardinality)},
            }
        )
        out += blob
    payload = json.dumps({"blobs": described}).encode()
    out += PUFFIN_MAGIC + payload + len(payload).to_bytes(4, "little") + bytes(4) + PUFFIN_MAGIC
    return bytes(out), placed


class _VectorManifestWriter(_DeleteManifestWriter):
    """A delete manifest whose data files carry the v3 fields (``referenced_data_file``, ``content_offset``, ...)."""

    @property
    def version(self) -> int:  # type: ignore[override]
        return 3

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        schema = self._with_partition(3)
        return AvroOutputFile[ManifestEntry](
            output_file=self._output_file,
            file_schema=schema,
            record_schema=schema,
            schema_name="manifest_entry",
            metadata=self._meta,
        )


def _entry(status: ManifestEntryStatus, snapshot_id: int | None, sequence: int | None, df: DataFile) -> ManifestEntry:
    return ManifestEntry.from_args(
        3,
        status=status,
        snapshot_id=snapshot_id,
        sequence_number=sequence,
        file_sequence_number=sequence,
        data_file=df,
    )


def vector_file(
    table: Table,
    data_file: str,
    positions: list[int],
    *,
    blob: bytes | None = None,
    location: str | None = None,
    content_size: int | None = None,
    cardinality: int | None = None,
) -> DataFile:
    """Write a Puffin file holding one deletion vector of ``data_file`` and give its manifest data file.

    ``blob``, ``location`` (a ``file://`` URI), ``content_size`` and ``cardinality`` replace what the spec
    asks for, to build damaged tables.
    """
    blob = dv_blob(positions) if blob is None else blob
    count = len(set(positions)) if cardinality is None else cardinality
    content, [(offset, length)] = puffin_file([(data_file, blob, count)])
    location = location or f"{table.location()}/data/dv-{uuid.uuid4()}.puffin"
    with table.io.new_output(location).create(overwrite=True) as out:
        out.write(content)
    df = DataFile.from_args(
        3,
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PUFFIN,
        partition=Record(),
        record_count=count,
        file_size_in_bytes=len(content),
        referenced_data_file=data_file,
        content_offset=offset,
        content_size_in_bytes=length if content_size is None else content_size,
    )
    df.spec_id = table.metadata.default_spec_id
    return df


def commit_vectors(table: Table, vectors: Mapping[str, list[int] | DataFile]) -> Table:
    """Commit one snapshot giving each data file of ``vectors`` a deletion vector (its positions, or a built file).

    The snapshot's delete manifest holds every deletion vector of the table: the parent's, ``EXISTING``,
    or ``DELETED`` where ``vectors`` gives the file a new one (which must hold the old positions too).
    """
    md = table.metadata
    parent = md.current_snapshot()
    assert parent is not None
    snapshot_id, sequence = md.new_snapshot_id(), md.next_sequence_number()
    data_manifests, old = [], []
    for m in parent.manifests(table.io):
        if m.content == ManifestContent.DATA:
            data_manifests.append(m)
        else:
            old.extend(_read_v3_entries(table, m.manifest_path, m.sequence_number))
    manifest_path = f"{table.location()}/metadata/{uuid.uuid4()}-dv.avro"
    spec = md.spec()
    writer = _VectorManifestWriter(spec, table.schema(), table.io.new_output(manifest_path), snapshot_id, "null")
    removed, added = [], []
    with writer as w:
        for entry in old:
            replaced = entry.data_file[REFERENCED_DATA_FILE] in vectors
            status = ManifestEntryStatus.DELETED if replaced else ManifestEntryStatus.EXISTING
            w.add_entry(_entry(status, entry.snapshot_id, entry.sequence_number, entry.data_file))
            if replaced:
                removed.append(entry.data_file)
        for data_file, given in vectors.items():
            df = given if isinstance(given, DataFile) else vector_file(table, data_file, given)
            w.add_entry(_entry(ManifestEntryStatus.ADDED, snapshot_id, None, df))
            added.append(df)
    list_path = f"{table.location()}/metadata/snap-{snapshot_id}-{uuid.uuid4()}.avro"
    with write_manifest_list(
        2, table.io.new_output(list_path), snapshot_id, parent.snapshot_id, sequence, "null"
    ) as lw:
        lw.add_manifests([*data_manifests, writer.to_manifest_file()])
    snapshot = Snapshot.model_validate(
        {
            "snapshot-id": snapshot_id,
            "parent-snapshot-id": parent.snapshot_id,
            "sequence-number": sequence,
            "timestamp-ms": max(int(time.time() * 1000), md.last_updated_ms + 1),
            "manifest-list": list_path,
            "summary": Summary(Operation.DELETE, **_summary(added, removed)),
            "schema-id": md.current_schema_id,
        }
    )
    ref = SetSnapshotRefUpdate.model_validate(
        {"snapshot-id": snapshot_id, "ref-name": "main", "type": SnapshotRefType.BRANCH}
    )
    tx = table.transaction()
    tx._apply(
        (AddSnapshotUpdate(snapshot=snapshot), ref),
        (AssertRefSnapshotId.model_validate({"snapshot-id": parent.snapshot_id, "ref": "main"}),),
    )
    return tx.commit_transaction()


def _summary(added: list[DataFile], removed: list[DataFile]) -> dict[str, str]:
    """The summary Iceberg's Java writer gives such a snapshot ("Optional Snapshot Summary Fields")."""
    return {
        "added-dvs": str(len(added)),
        "added-delete-files": str(len(added)),
        "added-position-deletes": str(sum(f.record_count for f in added)),
        "added-files-size": str(sum(f.file_size_in_bytes for f in added)),
        "removed-dvs": str(len(removed)),
        "removed-delete-files": str(len(removed)),
        "removed-position-deletes": str(sum(f.record_count for f in removed)),
        "removed-files-size": str(sum(f.file_size_in_bytes for f in removed)),
    }


def _read_v3_entries(table: Table, path: str, sequence: int) -> list[ManifestEntry]:
    """The live entries of a delete manifest, read with the v3 fields, a null sequence number the manifest's."""
    from pyiceberg.avro.file import AvroFile
    from pyiceberg.manifest import MANIFEST_ENTRY_SCHEMAS

    with AvroFile[ManifestEntry](
        table.io.new_input(path),
        MANIFEST_ENTRY_SCHEMAS[3],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        entries = [e for e in reader if e.status != ManifestEntryStatus.DELETED]
    for e in entries:
        if e.sequence_number is None:
            e.sequence_number = e.file_sequence_number = sequence
    return entries


def as_v3(table: Table) -> str:
    """Write the table's newest metadata again as format version 3, the newest file of ``metadata/``.

    Returns:
        Its location: a local path for a local table, else the URI (``s3://...``).
    """
    with table.io.new_input(table.metadata_location).open() as f:
        doc = json.loads(f.read())
    doc.update({"format-version": 3, "next-row-id": 0})
    location = f"{table.location()}/metadata/99999-{uuid.uuid4()}.metadata.json"
    with table.io.new_output(location).create() as out:
        out.write(json.dumps(doc).encode())
    return location.removeprefix("file://")
