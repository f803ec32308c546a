"""The reader-feature gate: what deltatail can read, written down in one place.

Protocol, "Table Features": with ``minReaderVersion`` 3 a table lists its
``readerFeatures`` and "a reader MUST NOT read a table whose readerFeatures
contains a feature the reader does not support". Reader version 1 needs
nothing; version 2 means column mapping (the only reader-v2 feature).
"""

from __future__ import annotations

from deltatail.state.actions import Protocol
from deltatail.state.errors import UnsupportedFeatureError

#: Reader features deltatail reads correctly, with the reason it can.
SUPPORTED_READER_FEATURES: dict[str, str] = {
    "columnMapping": "name and id modes resolved when reading data, cdc files and partition values",
    "deletionVectors": "inline, relative and absolute DVs decoded and applied to rows",
    "timestampNtz": "timestamp_ntz maps to an Arrow timestamp without time zone",
    "v2Checkpoint": "UUID-named JSON and Parquet checkpoints with sidecars are read",
    "vacuumProtocolCheck": "asks nothing of readers beyond the protocol check",
    "typeWidening": "files written with narrower types are cast to the table schema",
    "typeWidening-preview": "same as typeWidening",
    "variantType": "variant columns are read in the Parquet variant encoding (state/variant/)",
    "variantType-preview": "same as variantType",
    "variantShredding": "shredded variant columns (typed_value) are reconstructed into the unshredded encoding",
    "variantShredding-preview": "same as variantShredding",
}

MAX_READER_VERSION = 3


def check_reader_support(protocol: Protocol, *, table: str | None = None, version: int | None = None) -> None:
    """Refuse a protocol deltatail cannot read.

    Raises:
        UnsupportedFeatureError: if ``minReaderVersion`` is above 3, or the table
            requires reader features not in :data:`SUPPORTED_READER_FEATURES`;
            the message lists the unsupported features and names the version.
    """
    if protocol.min_reader_version > MAX_READER_VERSION or protocol.min_reader_version < 1:
        raise UnsupportedFeatureError(
            f"reader version {protocol.min_reader_version} is not supported (deltatail reads versions 1 to 3)",
            table=table,
            version=version,
        )
    if protocol.min_reader_version < 3:
        return
    required = protocol.reader_features or frozenset()
    unsupported = frozenset(required - SUPPORTED_READER_FEATURES.keys())
    if unsupported:
        raise UnsupportedFeatureError(
            f"table requires reader features deltatail does not support: {', '.join(sorted(unsupported))}",
            features=unsupported,
            table=table,
            version=version,
        )
