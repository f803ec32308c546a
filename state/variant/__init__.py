"""Parquet Variant values (Delta's ``variantType`` and ``variantShredding`` features): decode, JSON, shredding.

Three modules along the three jobs:

- :mod:`state.variant.decode`: the binary encoding (``VariantEncoding.md``): the metadata
  dictionary, objects, arrays and primitives, and a value as Python (:func:`variant_to_python`);
- :mod:`state.variant.json_text`: a value as Spark's ``to_json`` writes it (:func:`variant_to_json`);
- :mod:`state.variant.shredding`: variant columns as pyarrow reads them from Parquet, shredded
  (``VariantShredding.md``) or not, turned into the unshredded :data:`VARIANT_STORAGE_TYPE`
  (:func:`unshred`; the type is defined with the schema's types in :mod:`state.schema`, so that
  reading a schema loads none of this package), checked (:func:`check_values`) and converted to
  JSON (:func:`variant_json_array`).

The names below are the package's public API; import them from here. Names with a leading
underscore in the modules are the package's internals, shared between its modules only.
"""

from deltatail.state.schema import VARIANT_MARKER, VARIANT_STORAGE_TYPE
from deltatail.state.variant.decode import MAX_DEPTH, TimestampNanos, metadata_keys, variant_to_python
from deltatail.state.variant.json_text import java_double_text, json_string, variant_to_json
from deltatail.state.variant.shredding import (
    check_values,
    is_variant_group,
    is_variant_type,
    unshred,
    variant_json_array,
)

__all__ = [
    "MAX_DEPTH",
    "VARIANT_MARKER",
    "VARIANT_STORAGE_TYPE",
    "TimestampNanos",
    "check_values",
    "is_variant_group",
    "is_variant_type",
    "java_double_text",
    "json_string",
    "metadata_keys",
    "unshred",
    "variant_json_array",
    "variant_to_json",
    "variant_to_python",
]
