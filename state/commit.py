"""One commit's actions, grouped and checked against the protocol's duplicate rules.

Protocol, "Writer Requirements": "A single log entry MUST NOT include more than
one action that reconciles with each other": add/remove actions with the same
``(path, DV)`` tuple, more than one metaData, more than one protocol, more than
one txn with the same appId. And, "Reconciliation": "for simplicity it is
required that there is at most one file action of the same type for any path
(regardless of dvId)" — so a path may appear at most once among a commit's adds
and at most once among its removes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from deltatail.state.actions import (
    Action,
    Add,
    AddCDCFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    Remove,
    Txn,
    parse_json_actions,
)
from deltatail.state.errors import DuplicateActionError, InvalidLogError


@dataclass(slots=True, unsafe_hash=True)
class Commit:
    """The actions of one table version (or of a compacted range ending at ``version``)."""

    version: Final[int]
    protocol: Final[Protocol | None]
    metadata: Final[Metadata | None]
    adds: Final[tuple[Add, ...]]
    removes: Final[tuple[Remove, ...]]
    cdcs: Final[tuple[AddCDCFile, ...]]
    txns: Final[tuple[Txn, ...]]
    domain_metadata: Final[tuple[DomainMetadata, ...]]
    commit_info: Final[CommitInfo | None]

    @property
    def in_commit_timestamp(self) -> int | None:
        """``commitInfo.inCommitTimestamp`` (epoch ms), if the commit carries one."""
        return None if self.commit_info is None else self.commit_info.in_commit_timestamp

    @staticmethod
    def from_json(version: int, data: bytes, *, check_duplicates: bool = True) -> Commit:
        """Parse a commit file (newline-delimited JSON actions) and group its actions (:meth:`from_actions`).

        A file without a single action line is refused: no writer commits nothing (Delta writers
        always write at least ``commitInfo``), so an empty commit file is a torn or failed write,
        and reading it as a version that changed nothing would silently drop its changes.

        Raises:
            InvalidLogError: if the file is empty or blank, or a line is not a valid action.
            DuplicateActionError: as :meth:`from_actions`.
        """
        if not data or data.isspace():  # isspace: no copy of a large commit
            raise InvalidLogError(
                "commit file is empty: a torn or failed write (a commit holds at least one action)", version=version
            )
        return Commit.from_actions(version, parse_json_actions(data), check_duplicates=check_duplicates)

    @staticmethod
    def from_actions(version: int, actions: Iterable[Action], *, check_duplicates: bool = True) -> Commit:
        """Group parsed actions; ``sidecar`` and ``checkpointMetadata`` are checkpoint-only and ignored here.

        Args:
            version: the commit's version.
            actions: its actions in file order.
            check_duplicates: apply the single-commit duplicate rules (off for
                log compaction files, which hold already reconciled actions).

        Raises:
            DuplicateActionError: if the commit breaks a duplicate-action rule;
                the message names the path, appId or action kind.
        """
        protocol: Protocol | None = None
        metadata: Metadata | None = None
        adds: list[Add] = []
        removes: list[Remove] = []
        cdcs: list[AddCDCFile] = []
        txns: dict[str, Txn] = {}
        domains: list[DomainMetadata] = []
        commit_info: CommitInfo | None = None
        for action in actions:
            if type(action) is Add:
                adds.append(action)
            elif type(action) is Remove:
                removes.append(action)
            elif type(action) is CommitInfo:
                commit_info = action
            elif type(action) is AddCDCFile:
                cdcs.append(action)
            elif type(action) is Protocol:
                if protocol is not None and check_duplicates:
                    raise DuplicateActionError("commit holds more than one protocol action", version=version)
                protocol = action
            elif type(action) is Metadata:
                if metadata is not None and check_duplicates:
                    raise DuplicateActionError("commit holds more than one metaData action", version=version)
                metadata = action
            elif type(action) is Txn:
                if action.app_id in txns and check_duplicates:
                    raise DuplicateActionError(
                        f"commit holds two txn actions for appId {action.app_id!r}", version=version
                    )
                txns[action.app_id] = action
            elif type(action) is DomainMetadata:
                domains.append(action)
            # sidecar and checkpointMetadata: checkpoint-only, ignored here
        if check_duplicates:  # (a check of one action or none is skipped: most commits hold one add)
            if len(adds) > 1:
                _check_unique_paths("add", (a.path for a in adds), version)
            if len(removes) > 1:
                _check_unique_paths("remove", (r.path for r in removes), version)
            if len(domains) > 1:
                _check_unique_paths("domainMetadata", (d.domain for d in domains), version)
            if adds and removes:
                removed = {(r.path, r.dv_id) for r in removes}
                for a in adds:
                    if (a.path, a.dv_id) in removed:
                        raise DuplicateActionError(
                            f"commit both adds and removes the logical file {a.path!r} (DV {a.dv_id})",
                            version=version,
                        )
        return Commit(
            version=version,
            protocol=protocol,
            metadata=metadata,
            adds=tuple(adds),
            removes=tuple(removes),
            cdcs=tuple(cdcs),
            txns=tuple(txns.values()),
            domain_metadata=tuple(domains),
            commit_info=commit_info,
        )


def _check_unique_paths(kind: str, names: Iterable[str], version: int) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DuplicateActionError(f"commit holds two {kind} actions for {name!r}", version=version)
        seen.add(name)
