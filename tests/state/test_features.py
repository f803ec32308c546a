"""The reader-feature gate (protocol, "Table Features" and "Protocol Evolution").

Reader version 1 needs nothing, reader version 2 means column mapping, reader version 3 lists
``readerFeatures`` and "a reader MUST NOT read a table whose readerFeatures contains a feature the
reader does not support". Writer features ask nothing of readers. deltatail reads column mapping,
deletion vectors, timestamp_ntz, V2 checkpoints, vacuumProtocolCheck and type widening; it does
not read catalog-managed tables, variants, geospatial types or collations-as-reader-features.
Protocols are real ones taken from the corpus where one exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from core_corpus import corpus_root

from deltatail.state.actions import Protocol, parse_json_actions
from deltatail.state.errors import DeltaTailError, UnsupportedFeatureError
from deltatail.state.features import check_reader_support


@pytest.fixture
def corpus() -> Path:
    return corpus_root()


def _protocol_of(table: Path, version: int = 0) -> Protocol:
    path = table / "_delta_log" / f"{version:020d}.json"
    [protocol] = [a for a in parse_json_actions(path.read_bytes()) if isinstance(a, Protocol)]
    return protocol


def _protocol(reader: int, writer: int, readers: list[str] | None = None, writers: list[str] | None = None) -> Protocol:
    body: dict[str, object] = {"minReaderVersion": reader, "minWriterVersion": writer}
    if readers is not None:
        body["readerFeatures"] = readers
    if writers is not None:
        body["writerFeatures"] = writers
    [protocol] = parse_json_actions(json.dumps({"protocol": body}).encode())
    assert isinstance(protocol, Protocol)
    return protocol


@pytest.mark.parametrize(
    "protocol",
    [
        _protocol(1, 1),
        _protocol(1, 2),
        _protocol(1, 7, writers=["changeDataFeed", "appendOnly", "invariants"]),
        _protocol(2, 5),
        _protocol(3, 7, readers=[], writers=[]),
        _protocol(3, 7, readers=["deletionVectors"], writers=["deletionVectors"]),
        _protocol(3, 7, readers=["columnMapping", "deletionVectors"], writers=["columnMapping", "deletionVectors"]),
        _protocol(3, 7, readers=["timestampNtz"], writers=["timestampNtz"]),
        _protocol(3, 7, readers=["v2Checkpoint"], writers=["v2Checkpoint", "appendOnly", "invariants"]),
        _protocol(3, 7, readers=["vacuumProtocolCheck"], writers=["vacuumProtocolCheck"]),
        _protocol(3, 7, readers=["typeWidening"], writers=["typeWidening"]),
        _protocol(3, 7, readers=["typeWidening-preview"], writers=["typeWidening-preview"]),
        _protocol(3, 7, readers=["variantType"], writers=["variantType"]),
        _protocol(3, 7, readers=["variantType-preview"], writers=["variantType-preview"]),
        _protocol(3, 7, readers=["variantType", "variantShredding"], writers=["variantType", "variantShredding"]),
        _protocol(3, 7, readers=["deletionVectors", "variantShredding-preview", "variantType"], writers=[]),
    ],
    ids=lambda p: f"r{p.min_reader_version}w{p.min_writer_version}-{'+'.join(sorted(p.reader_features or ()))}",
)
def test_supported_protocols_are_accepted(protocol: Protocol) -> None:
    check_reader_support(protocol, table="t", version=0)


@pytest.mark.parametrize(
    "table",
    [
        "kernel-rs/table-with-dv-small",
        "kernel-rs/cdf-column-mapping-id-mode",
        "kernel-rs/cdf-table",
        "delta-rs/table_with_liquid_clustering",
        "delta-rs/checkpoint-v2-table",
        "delta-golden/table-with-columnmapping-mode-id/delta",
        "delta-spark/variant-stats-no-checkpoint",
        "delta-kernel-java/spark-variant-stable-feature-checkpoint",
        "kernel-rs/unshredded-variant",
    ],
)
def test_supported_corpus_tables_are_accepted(corpus: Path, table: str) -> None:
    check_reader_support(_protocol_of(corpus / table), table=table, version=0)


@pytest.mark.parametrize(
    ("table", "version", "unsupported"),
    [
        ("kernel-rs/catalog_managed_0", 0, {"catalogManaged"}),
        ("delta-kernel-java/workload-basic_catalog_managed/delta", 0, {"catalogManaged"}),
        ("kernel-rs/table-with-geo", 0, {"geospatial"}),
        ("delta-rs/data_err_logs/table_e", 0, {"catalogOwned"}),
    ],
)
def test_unsupported_reader_features_from_the_corpus(
    corpus: Path, table: str, version: int, unsupported: set[str]
) -> None:
    protocol = _protocol_of(corpus / table, version)
    with pytest.raises(UnsupportedFeatureError) as info:
        check_reader_support(protocol, table=table, version=version)
    assert info.value.features == frozenset(unsupported)
    for name in unsupported:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("readers", "unsupported"),
    [
        (["catalogManaged"], {"catalogManaged"}),
        (["variantType", "geospatial"], {"geospatial"}),
        (["catalogManaged", "vacuumProtocolCheck"], {"catalogManaged"}),
        (["deletionVectors", "variantShredding-preview", "collations"], {"collations"}),
        (["columnMapping", "deletionVectors", "someFutureFeature"], {"someFutureFeature"}),
    ],
)
def test_unsupported_reader_features_are_listed_exactly(readers: list[str], unsupported: set[str]) -> None:
    with pytest.raises(UnsupportedFeatureError) as info:
        check_reader_support(_protocol(3, 7, readers=readers, writers=readers), table="tbl", version=12)
    assert info.value.features == frozenset(unsupported)
    assert info.value.version == 12
    assert "version 12" in str(info.value)
    for name in unsupported:
        assert name in str(info.value)
    for name in set(readers) - unsupported:
        assert name not in str(info.value)


@pytest.mark.parametrize("reader", [4, 5, 99])
def test_reader_versions_above_three_are_refused(reader: int) -> None:
    with pytest.raises(UnsupportedFeatureError) as info:
        check_reader_support(_protocol(reader, 7, readers=[], writers=[]), table="tbl", version=3)
    assert str(reader) in info.value.message
    assert info.value.version == 3
    assert "version 3" in str(info.value)
    assert info.value.features == frozenset()


def test_invalid_protocol_version_table_from_the_corpus(corpus: Path) -> None:
    protocol = _protocol_of(corpus / "delta-golden/deltalog-invalid-protocol-version/delta")
    assert protocol.min_reader_version == 99
    with pytest.raises(UnsupportedFeatureError, match="99"):
        check_reader_support(protocol)


def test_reader_version_five_with_an_unknown_feature_from_the_corpus(corpus: Path) -> None:
    protocol = _protocol_of(corpus / "delta-rs/simple_table_features")
    assert protocol.min_reader_version == 5
    with pytest.raises(UnsupportedFeatureError):
        check_reader_support(protocol)


@pytest.mark.parametrize(
    "writers",
    [
        ["catalogManaged", "someFutureWriterFeature"],
        ["inCommitTimestamp", "rowTracking", "domainMetadata", "clustering", "icebergCompatV2"],
        ["collations", "materializePartitionColumns", "identityColumns", "generatedColumns", "checkConstraints"],
    ],
)
def test_writer_only_features_never_block_reading(writers: list[str]) -> None:
    check_reader_support(_protocol(1, 7, writers=writers))
    check_reader_support(_protocol(3, 7, readers=["deletionVectors"], writers=[*writers, "deletionVectors"]))


def test_unsupported_feature_error_is_a_deltatail_error() -> None:
    with pytest.raises(DeltaTailError):
        check_reader_support(_protocol(3, 7, readers=["catalogManaged"], writers=["catalogManaged"]))
