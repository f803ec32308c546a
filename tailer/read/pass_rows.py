"""A commit's change rows held for its key-hash passes without what the commit's rows share.

Net changes and update pairs hold a pass of a commit's rows until they are reordered
(:mod:`tailer.read.net_changes`, :mod:`tailer.read.update_pairs`), and spill the passes to disk
in between (:mod:`tailer.read.spill`). Two of the three change columns are the same in every row
of one commit. The protocol's Change Data Files: ``_commit_version`` is "The table version
containing the change", ``_commit_timestamp`` "The timestamp associated when the commit was
created" (a removed row read in the schema before the commit carries the commit's own too,
:meth:`state.planning.VersionPlan.context_of`); and ``_change_type`` holds one of a few strings.
Held as they are, they were half of a pass of a three-column table (16 bytes a row, and ~19 for
the text of ``update_preimage``). So the passes hold the rows *slim*: those two columns left out
and ``_change_type`` dictionary-encoded (:meth:`SlimRows.slim`, 4 bytes a row); each batch taken
from a pass is made whole again as it is delivered (:meth:`SlimRows.restore`), with exactly the
values and the schema the rows were read with. Nothing else changes: the same rows, in the same
order, hash to the same passes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pyarrow as pa

from deltatail.tailer.read.rows import change_types_as_strings
from deltatail.tailer.read.tasks import constant_int64s

#: The type ``_change_type`` is held in.
CODED = pa.dictionary(pa.int32(), pa.string())


@dataclass(frozen=True)
class SlimRows:
    """The change rows of one commit, slim and made whole again (see the module docstring).

    Args:
        schema: the rows' schema as read (``state.feed.change_schema``: the table's columns, then
            ``_change_type``, ``_commit_version`` and ``_commit_timestamp``).
        version: the commit's version.
        timestamp_ms: the commit's timestamp in milliseconds.
    """

    schema: pa.Schema
    version: int
    timestamp_ms: int

    @functools.cached_property
    def slim_schema(self) -> pa.Schema:
        """The schema of slim rows: the table's columns, then ``_change_type`` dictionary-encoded."""
        kept = self.schema.remove(len(self.schema) - 1).remove(len(self.schema) - 2)
        last = len(kept) - 1
        return kept.set(last, kept.field(last).with_type(CODED))

    def slim(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (rows of :attr:`schema`, all of this commit) in :attr:`slim_schema`."""
        import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

        kinds = batch.column(batch.num_columns - 3)
        coded = kinds if kinds.type == CODED else pc.dictionary_encode(kinds)
        return pa.RecordBatch.from_arrays([*batch.columns[:-3], coded], schema=self.slim_schema)

    def restore(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (slim rows; ``_change_type`` coded or already strings) in :attr:`schema` again."""
        kinds = change_types_as_strings(batch).column(batch.num_columns - 1)
        n = batch.num_rows
        return pa.RecordBatch.from_arrays(
            [
                *batch.columns[:-1],
                kinds,
                constant_int64s(self.schema.field(len(self.schema) - 2).type, self.version, n),
                constant_int64s(self.schema.field(len(self.schema) - 1).type, self.timestamp_ms * 1000, n),
            ],
            schema=self.schema,
        )
