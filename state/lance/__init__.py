"""Lance datasets, pure: manifests and transactions decoded, versions planned into change rows (no IO).

A Lance dataset is a sequence of versions, each a manifest (``_versions/``) listing fragments (data
files plus an optional deletion file of row offsets) and naming the transaction that made it. This
package decodes those protobuf messages (:mod:`state.lance.manifest`; a fragment's stable row ids:
:mod:`state.lance.row_ids`) and plans a version's change rows from the previous manifest, the new
one and the transaction (:mod:`state.lance.planning`).
"""
