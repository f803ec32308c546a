"""Every action of the Delta protocol as an immutable, slotted value; parsed here and only here.

The values never change once built. Most are frozen dataclasses; the three built once per action
of a log (``Add``, ``Remove``, ``CommitInfo``), like ``Commit`` and the audit event's records,
declare every field ``Final`` instead: strict mypy refuses an assignment, and construction costs
a plain dataclass's (``frozen=True`` sets each field through ``object.__setattr__``, several times
dearer on the path every action of a log takes).

Protocol, "Actions": a commit file is newline-delimited JSON, one action per
line, each an object with a single key naming the action. The newer revision
adds: "readers MUST ignore unknown actions and unknown fields" — both are
ignored here. Paths in ``add``, ``remove`` and ``cdc`` "are URIs as specified
by RFC 2396 ... which need to be decoded to get the data file path": they are
percent-decoded once, here, and every other module sees decoded paths.

Parsing is strict about what the protocol types: a required field that is
missing or null, or a field of the wrong JSON type (``"dataChange": 1``,
``"size": "10"``, ``"size": 1.0``), is an :class:`~state.errors.InvalidLogError`
naming the action and the field; the readers of log files add the table,
version and file. Nothing is coerced: a wrong value would otherwise change
change rows silently.

Modules: the values (:mod:`state.actions.model`), the parsers (:mod:`state.actions.parsing`), and
each action's fields declared once with their checks and path decoding
(:mod:`state.actions.fields`). Import the names below from this package.
"""

from deltatail.state.actions.fields import decode_path
from deltatail.state.actions.model import (
    Action,
    Add,
    AddCDCFile,
    CheckpointMetadata,
    CommitInfo,
    DeletionVector,
    DomainMetadata,
    Format,
    Metadata,
    Protocol,
    Remove,
    Sidecar,
    Txn,
)
from deltatail.state.actions.parsing import (
    parse_action,
    parse_add,
    parse_json_actions,
    parse_metadata,
    parse_protocol,
    parse_remove,
)

__all__ = [
    "Action",
    "Add",
    "AddCDCFile",
    "CheckpointMetadata",
    "CommitInfo",
    "DeletionVector",
    "DomainMetadata",
    "Format",
    "Metadata",
    "Protocol",
    "Remove",
    "Sidecar",
    "Txn",
    "decode_path",
    "parse_action",
    "parse_add",
    "parse_json_actions",
    "parse_metadata",
    "parse_protocol",
    "parse_remove",
]
