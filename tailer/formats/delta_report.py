"""A Delta snapshot rendered for people (text) and for programs (one JSON document): `deltatail snapshot`."""

from __future__ import annotations

from typing import Any

import orjson

from deltatail.state.snapshot import Snapshot


def snapshot_document(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as a JSON-ready dict with exactly the fields ``deltatail snapshot --json`` promises.

    Fields: ``version``, ``protocol``, ``metadata`` (``id``, ``schema``,
    ``partitionColumns``, ``configuration``), ``appTransactions`` (appId to
    version) and ``files``, sorted by path then DV id, each with ``path``,
    ``dvUniqueId``, ``dvCardinality``, ``size``, ``partitionValues`` and
    ``modificationTime``.
    """
    p, m = snap.require_valid()
    files = []
    for f in snap.live_files():
        dv = f.deletion_vector
        files.append(
            {
                "path": f.path,
                "dvUniqueId": None if dv is None else dv.unique_id,
                "dvCardinality": None if dv is None else dv.cardinality,
                "size": f.size,
                "partitionValues": f.partition_values or {},
                "modificationTime": f.timestamp,
            }
        )
    files.sort(key=lambda f: (f["path"], f["dvUniqueId"] or ""))
    return {
        "version": snap.version,
        "protocol": p.to_json(),
        "metadata": {
            "id": m.id,
            "schema": None if m.schema_string is None else orjson.loads(m.schema_string),
            "partitionColumns": list(m.partition_columns),
            "configuration": m.configuration,
        },
        "appTransactions": dict(sorted(snap.txns.items())),
        "files": files,
    }


def snapshot_text(snap: Snapshot) -> str:
    """A human-readable rendering of :func:`snapshot_document`."""
    doc = snapshot_document(snap)
    p, m = doc["protocol"], doc["metadata"]
    lines = [f"table    {snap.table}", f"version  {doc['version']}"]
    features = ""
    if p["readerFeatures"] is not None or p["writerFeatures"] is not None:
        features = f"  reader features {p['readerFeatures'] or []}  writer features {p['writerFeatures'] or []}"
    lines.append(f"protocol reader v{p['minReaderVersion']}, writer v{p['minWriterVersion']}{features}")
    lines.append(f"table id {m['id']}")
    lines.append("schema")
    for field in (m["schema"] or {}).get("fields", []):
        kind = field["type"] if isinstance(field["type"], str) else field["type"].get("type", "?")
        null = "" if field.get("nullable", True) else " not null"
        lines.append(f"  {field['name']}: {kind}{null}")
    lines.append(f"partition columns {m['partitionColumns'] or '(none)'}")
    for key, value in sorted(m["configuration"].items()):
        lines.append(f"  {key} = {value}")
    for app, version in doc["appTransactions"].items():
        lines.append(f"app transaction {app}: version {version}")
    total = sum(f["size"] or 0 for f in doc["files"])
    lines.append(f"live files {len(doc['files'])} ({total} bytes)")
    for f in doc["files"]:
        dv = "" if f["dvUniqueId"] is None else f"  dv {f['dvUniqueId']} ({f['dvCardinality']} rows deleted)"
        parts = ",".join(f"{k}={v}" for k, v in sorted(f["partitionValues"].items()))
        lines.append(f"  {f['path']}  {f['size']} B  mtime {f['modificationTime']}  {parts}{dv}".rstrip())
    return "\n".join(lines)
