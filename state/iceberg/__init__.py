"""Apache Iceberg tables, pure: snapshots, their ancestry and their change rows planned from file lists (no IO).

An Iceberg table is a chain of snapshots along its ``main`` branch, each naming (through its manifest
list and manifests) the live data files and delete files of the table at that point. This package
holds those values as deltatail sees them (:mod:`state.iceberg.model`, converted from pyiceberg's
objects at the edge in :mod:`tailer.iceberg`) and plans a snapshot's change rows by comparing its live
files with its parent's (:mod:`state.iceberg.planning`). It never imports pyiceberg.
"""
