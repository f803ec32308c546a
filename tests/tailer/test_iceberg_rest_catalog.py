"""Iceberg tables named by a REST catalog, through pyiceberg's ``RestCatalog`` and the stand-in server.

The stand-in (:mod:`rest_catalog`) answers the REST catalog protocol in front of a pyiceberg SQL
catalog on SQLite, which the tables are written through; the oracles are pyiceberg's scans of the
same tables and what the tests wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from iceberg_tables import SCHEMA, catalog, rows
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from rest_catalog import RestCatalogStandIn

from deltatail.state.errors import StorageError, TableNotFoundError
from deltatail.tailer.iceberg.catalog import catalog_pointer
from deltatail.tailer.iceberg.feed import IcebergFeed

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-3f9a1c77e2"


@pytest.fixture
def sql(tmp_path: Path) -> SqlCatalog:
    return catalog(tmp_path / "cat")


@pytest.fixture
def rest(sql: SqlCatalog) -> Iterator[RestCatalogStandIn]:
    server = RestCatalogStandIn(sql, token=TOKEN).start()
    yield server
    server.stop()


def rest_loader(uri: str, token: str = TOKEN) -> Callable[[str], Catalog]:
    """pyiceberg's REST catalog at ``uri`` with ``token``, by name (as its configuration would give it)."""
    return lambda name: load_catalog(name, type="rest", uri=uri, token=token)


def test_the_catalogs_pointer_is_the_sql_catalogs_metadata_file(sql: SqlCatalog, rest: RestCatalogStandIn) -> None:
    t = sql.create_table("db.orders", SCHEMA)
    t.append(rows([1, 2]))
    pointer = catalog_pointer("prod", "db.orders", load=rest_loader(rest.uri))
    assert pointer() == t.refresh().metadata_location
    t.append(rows([3]))
    assert pointer() == t.refresh().metadata_location  # asked again at every look
    feed = IcebergFeed(pointer().rsplit("/", 2)[0], pointer=pointer)
    assert [(r["_change_type"], r["id"]) for r in feed.read_table().to_pylist()] == [
        ("insert", 1),
        ("insert", 2),
        ("insert", 3),
    ]
    # every request carried the token; the catalog was configured once (one GET /v1/config)
    assert {auth for _, _, auth in rest.requests} == {f"Bearer {TOKEN}"}
    assert [path for _, path, _ in rest.requests].count("/v1/config") == 1
    with pytest.raises(TableNotFoundError, match=r"catalog prod has no table db\.nothing"):
        catalog_pointer("prod", "db.nothing", load=rest_loader(rest.uri))()


def test_refused_credentials_a_failing_and_an_unreachable_catalog_are_clear_errors(rest: RestCatalogStandIn) -> None:
    with pytest.raises(StorageError, match="catalog prod refused the credentials") as refused:
        catalog_pointer("prod", "db.orders", load=rest_loader(rest.uri, "wrong-token"))()
    assert not refused.value.transient
    assert "wrong-token" not in str(refused.value) and refused.value.__cause__ is None
    rest.failing = True
    with pytest.raises(StorageError, match=r"catalog prod did not give table db\.orders \(ServerError\)") as failed:
        catalog_pointer("prod", "db.orders", load=rest_loader(rest.uri))()
    assert failed.value.transient and "store is down" not in str(failed.value)
    uri = rest.uri
    rest.stop()
    with pytest.raises(StorageError, match="catalog prod cannot be reached") as down:
        catalog_pointer("prod", "db.orders", load=rest_loader(uri))()
    assert down.value.transient and down.value.__cause__ is None


@pytest.mark.slow
def test_snapshot_changes_and_run_through_the_rest_catalog(
    tmp_path: Path, sql: SqlCatalog, rest: RestCatalogStandIn
) -> None:
    t = sql.create_table("db.orders", SCHEMA)
    t.append(rows([1, 2, 3]))
    t.delete("id == 2")
    # pyiceberg reads its catalog configuration once, at import: a process of its own
    env = {**os.environ, "PYICEBERG_CATALOG__PROD__TYPE": "rest", "PYICEBERG_CATALOG__PROD__URI": rest.uri}
    env["PYICEBERG_CATALOG__PROD__TOKEN"] = TOKEN
    name = "iceberg://catalog:prod/db.orders"
    said: list[bytes] = []

    def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run([sys.executable, "-m", "deltatail", *args], cwd=ROOT, env=env, capture_output=True)
        said.extend([done.stdout, done.stderr])
        return done

    shot = cli("snapshot", name, "--json")
    assert shot.returncode == 0, shot.stderr
    doc = orjson.loads(shot.stdout)
    head = t.refresh().current_snapshot()
    assert head is not None
    assert (doc["snapshotId"], doc["metadataFile"]) == (head.snapshot_id, t.metadata_location)
    changes = cli("changes", name)
    assert changes.returncode == 0, changes.stderr
    found = [orjson.loads(line) for line in changes.stdout.splitlines()]
    assert [(r["_change_type"], r["id"]) for r in found] == [("insert", 1), ("insert", 2), ("insert", 3), ("delete", 2)]
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    run = ("-v", "run", name, "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up", "--no-watch")
    assert cli(*run).returncode == 0, said[-1]
    t.append(rows([4]))
    assert cli(*run).returncode == 0, said[-1]
    delivered = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [(r["_change_type"], r["id"]) for r in delivered][-1] == ("insert", 4)
    live = sorted(t.refresh().scan().to_arrow().column("id").to_pylist())
    net = {r["id"] for r in delivered if r["_change_type"] == "insert"} - {
        r["id"] for r in delivered if r["_change_type"] == "delete"
    }
    assert sorted(net) == live == [1, 3, 4]
    # a wrong token: a clear error, and the token is never printed
    env["PYICEBERG_CATALOG__PROD__TOKEN"] = "wrong-" + TOKEN
    refused = cli("-v", "changes", name)
    assert refused.returncode != 0 and b"refused the credentials" in refused.stderr
    stored = b"".join(p.read_bytes() for p in state.rglob("*") if p.is_file())
    assert all(TOKEN.encode() not in text for text in [*said, stored])
    assert f"Bearer {TOKEN}" in {auth for _, _, auth in rest.requests}
