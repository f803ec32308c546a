"""Alert rules over audit events: the rule language, its parsing, and evaluation. Pure.

Rules live in the TOML settings as an array of tables, ``[[audit.alerts]]``.
Each rule has a ``name``, an optional ``severity`` and one or more
*conditions*; a rule fires on a commit when **all** its conditions hold (write
two rules for "either"). Example::

    [[audit.alerts]]
    name = "large delete"
    severity = "critical"
    operation_in = ["DELETE", "MERGE"]
    rows_deleted_pct_over = 10          # more than 10 % of the table's rows

    [[audit.alerts]]
    name = "change data feed or retention touched"
    property_change = ["delta.enableChangeDataFeed", "delta.*RetentionDuration"]

    [[audit.alerts]]
    name = "restore or vacuum"
    operation_in = ["RESTORE", "VACUUM START", "VACUUM END"]

    [[audit.alerts]]
    name = "writer outside the allow-list"
    user_not_in = ["etl@corp.example", "4242"]

Keys of a rule:

=========================  ==================================================================
``name``                   required, unique: names the rule in alerts and errors
``severity``               ``info``, ``warning`` (default) or ``critical``
``operation_in``           the operation is one of these (case-insensitive)
``operation_not_in``       the operation is none of these (a commit without one qualifies)
``user_in``                the user name or user id is one of these (case-insensitive)
``user_not_in``            neither the user name nor the user id is one of these; a commit
                           that records no user qualifies unless ``allow_unrecorded_user``
``allow_unrecorded_user``  ``true``: commits without a user never match ``user_not_in``
``rows_inserted_over``     more than N rows inserted
``rows_deleted_over``      more than N rows deleted
``rows_updated_over``      more than N rows updated
``rows_deleted_pct_over``  more than P % of the table's rows (before the commit) deleted
``schema_change``          ``true`` (any change) or a list of kinds: ``added``, ``dropped``,
                           ``renamed``, ``type_changed``, ``nullability_changed``,
                           ``metadata_changed``
``protocol_change``        ``true``: the protocol changed (versions or features)
``property_change``        ``true`` (any table property) or a list of keys; ``*`` and ``?``
                           are wildcards, matched case-insensitively
``property_set``           a table of key = value: the property changed to that value
                           (case-insensitive), e.g. ``{"delta.enableChangeDataFeed" = "false"}``
``retention_shortened``    ``true``: ``delta.deletedFileRetentionDuration`` (default 1 week) or
                           ``delta.logRetentionDuration`` (default 30 days) became shorter
``domain_change``          ``true`` (any domain) or a list of domain names (wildcards allowed)
``readable_under_seconds`` the commit, when audited, stays readable for less than N seconds:
                           its commit time plus the shorter of the two retention durations
                           (:mod:`state.retention`) minus the time it is audited (decided by
                           ``audit --follow``, which knows that time; undecided otherwise)
``include_create``         ``true``: the table's creation commit counts as a schema, protocol,
                           property or domain change (by default it does not)
=========================  ==================================================================

A condition over a figure the event does not know (rows deleted by a writer
that records no metrics, the share of a table whose size is not tracked)
cannot be decided: if every other condition holds, the rule is reported as
*undecided* for that commit (never silently passed over), and the caller
logs it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from deltatail.state.audit import AuditEvent, ValueChange, iso_utc
from deltatail.state.errors import ConfigError, InvalidLogError
from deltatail.state.schema_diff import SchemaDiff
from deltatail.state.snapshot import parse_interval_ms

#: The ``format`` tag of an alert's dict form.
ALERT_FORMAT = "deltatail.audit.alert/1"

SEVERITIES = ("info", "warning", "critical")

#: Retention settings ``retention_shortened`` watches, with the protocol's defaults.
RETENTION_DEFAULTS = {
    "delta.deletedFileRetentionDuration": "interval 1 week",
    "delta.logRetentionDuration": "interval 30 days",
}

_ALL = ("*",)


@dataclass(frozen=True, slots=True)
class AlertRule:
    """One parsed rule; ``None`` (or ``False``) means the condition is absent. See the module docstring."""

    name: str
    severity: str = "warning"
    operation_in: frozenset[str] | None = None
    operation_not_in: frozenset[str] | None = None
    user_in: frozenset[str] | None = None
    user_not_in: frozenset[str] | None = None
    allow_unrecorded_user: bool = False
    rows_inserted_over: int | None = None
    rows_deleted_over: int | None = None
    rows_updated_over: int | None = None
    rows_deleted_pct_over: float | None = None
    schema_change: frozenset[str] | None = None
    protocol_change: bool = False
    property_change: tuple[str, ...] | None = None
    property_set: Mapping[str, str] | None = field(default=None, hash=False)
    retention_shortened: bool = False
    domain_change: tuple[str, ...] | None = None
    readable_under_seconds: float | None = None
    include_create: bool = False


@dataclass(frozen=True, slots=True)
class Alert:
    """A rule that fired on a commit, with the reasons (one per condition, in words)."""

    rule: str
    severity: str
    event: AuditEvent
    reasons: tuple[str, ...]

    @property
    def version(self) -> int:
        """The commit's version."""
        return self.event.version

    @property
    def message(self) -> str:
        """One line for a person: rule, table, version, operation, user and reasons."""
        who = self.event.user or "an unrecorded user"
        operation = self.event.operation or "an unnamed operation"
        return (
            f"alert {self.rule!r} ({self.severity}): {self.event.table_path} version {self.event.version}, "
            f"{operation} by {who}: {'; '.join(self.reasons)}"
        )

    def to_json(self) -> dict[str, Any]:
        """The alert as a JSON-ready dict.

        The shape::

            {"format": "deltatail.audit.alert/1", "rule": str, "severity": str,
             "table": {"path": str, "id": str | null}, "version": int, "timestamp_ms": int,
             "timestamp": str, "operation": str | null, "user": str | null,
             "reasons": [str], "message": str, "event": {... the audit event's dict form ...}}
        """
        e = self.event
        return {
            "format": ALERT_FORMAT,
            "rule": self.rule,
            "severity": self.severity,
            "table": {"path": e.table_path, "id": e.table_id},
            "version": e.version,
            "timestamp_ms": e.timestamp_ms,
            "timestamp": iso_utc(e.timestamp_ms),
            "operation": e.operation,
            "user": e.user,
            "reasons": list(self.reasons),
            "message": self.message,
            "event": e.to_json(),
        }


@dataclass(frozen=True, slots=True)
class Undecided:
    """A rule whose other conditions held but which needs a figure the event does not know."""

    rule: str
    version: int
    unknown: tuple[str, ...]

    @property
    def message(self) -> str:
        """One line for the log."""
        return (
            f"alert rule {self.rule!r} cannot be decided at version {self.version}: {', '.join(self.unknown)} unknown"
        )


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What the rules made of one event."""

    alerts: tuple[Alert, ...] = ()
    undecided: tuple[Undecided, ...] = ()


# -- evaluation ---------------------------------------------------------------------------------

#: A condition's verdict: (True, reason) holds, (False, "") does not, (None, what) unknown.
_Verdict = tuple[bool | None, str]


def evaluate(
    rules: tuple[AlertRule, ...] | list[AlertRule], event: AuditEvent, readable_seconds: float | None = None
) -> Evaluation:
    """Every rule against ``event``: the alerts raised and the rules left undecided.

    ``readable_seconds``: how long the event's commit stays readable at least as it is audited
    (:meth:`state.retention.Retention.readable_seconds`); ``None`` leaves ``readable_under_seconds``
    undecided.
    """
    alerts: list[Alert] = []
    undecided: list[Undecided] = []
    for rule in rules:
        reasons: list[str] = []
        unknown: list[str] = []
        holds = True
        for verdict in _verdicts(rule, event, readable_seconds):
            ok, text = verdict
            if ok is False:
                holds = False
                break
            if ok is None:
                unknown.append(text)
            else:
                reasons.append(text)
        if not holds:
            continue
        if unknown:
            undecided.append(Undecided(rule.name, event.version, tuple(unknown)))
        else:
            alerts.append(Alert(rule.name, rule.severity, event, tuple(reasons)))
    return Evaluation(tuple(alerts), tuple(undecided))


def _verdicts(rule: AlertRule, e: AuditEvent, readable_seconds: float | None) -> list[_Verdict]:
    out: list[_Verdict] = []
    op = (e.operation or "").upper()
    if rule.operation_in is not None:
        out.append((op in rule.operation_in, f"operation is {e.operation}"))
    if rule.operation_not_in is not None:
        out.append((op not in rule.operation_not_in, f"operation {e.operation} is not excluded"))
    identities = {x.casefold() for x in (e.actor.user_name, e.actor.user_id) if x is not None}
    if rule.user_in is not None:
        out.append((bool(identities & rule.user_in), f"user {e.user} is listed"))
    if rule.user_not_in is not None:
        if not identities:
            out.append((not rule.allow_unrecorded_user, "the commit records no user"))
        else:
            out.append((not identities & rule.user_not_in, f"user {e.user} is not on the allow-list"))
    c = e.counts
    for figure, limit, value in (
        ("rows inserted", rule.rows_inserted_over, c.rows_inserted),
        ("rows deleted", rule.rows_deleted_over, c.rows_deleted),
        ("rows updated", rule.rows_updated_over, c.rows_updated),
    ):
        if limit is not None:
            out.append((None, figure) if value is None else (value > limit, f"{value} {figure} > {limit}"))
    if rule.rows_deleted_pct_over is not None:
        pct = e.rows_deleted_pct
        if pct is None:
            out.append((None, "share of the table deleted"))
        else:
            limit_pct = rule.rows_deleted_pct_over
            out.append((pct > limit_pct, f"{pct:.2f}% of the table's rows deleted > {limit_pct:g}%"))
    counts_creation = rule.include_create or not e.table_created
    if rule.schema_change is not None:
        out.append(_schema_verdict(rule.schema_change, e.schema_change, counts_creation))
    if rule.protocol_change:
        p = e.protocol_change
        held = p is not None and counts_creation
        text = ""
        if p is not None:
            text = (
                f"protocol {p.old_min_reader_version}/{p.old_min_writer_version} -> "
                f"{p.new_min_reader_version}/{p.new_min_writer_version}"
            )
            added = sorted({*p.reader_features_added, *p.writer_features_added})
            removed = sorted({*p.reader_features_removed, *p.writer_features_removed})
            text += "".join(
                [f", features added: {', '.join(added)}" if added else "",
                 f", features removed: {', '.join(removed)}" if removed else ""]
            )  # fmt: skip
        out.append((held, text))
    if rule.property_change is not None:
        hits = [v for v in e.property_changes if _matches(v.key, rule.property_change)]
        out.append((bool(hits) and counts_creation, "; ".join(_describe("property", v) for v in hits)))
    if rule.property_set is not None:
        wanted = {k.casefold(): want.casefold() for k, want in rule.property_set.items()}
        hits = [v for v in e.property_changes if v.new is not None and wanted.get(v.key.casefold()) == v.new.casefold()]
        out.append((bool(hits) and counts_creation, "; ".join(_describe("property", v) for v in hits)))
    if rule.retention_shortened:
        shortened = _shortened_retention(e.property_changes)
        out.append((shortened is not None and counts_creation, shortened or ""))
    if rule.domain_change is not None:
        hits = [v for v in e.domain_changes if _matches(v.key, rule.domain_change)]
        out.append((bool(hits) and counts_creation, "; ".join(_describe("domain", v) for v in hits)))
    if rule.readable_under_seconds is not None:
        out.append(_readable_verdict(rule.readable_under_seconds, readable_seconds))
    return out


def _readable_verdict(limit: float, readable_seconds: float | None) -> _Verdict:
    if readable_seconds is None:
        return None, "how long the commit stays readable"
    return (
        readable_seconds < limit,
        f"the commit stays readable {readable_seconds:.0f}s more under the table's retention, under {limit:g}s",
    )


def _schema_verdict(kinds: frozenset[str], diff: SchemaDiff | None, counts_creation: bool) -> _Verdict:
    if diff is None or not counts_creation:
        return (False, "")
    present = [k for k in diff.kinds if k in kinds]
    if not present:
        return (False, "")
    parts = []
    if "added" in present:
        parts.append("added " + ", ".join(diff.added))
    if "dropped" in present:
        parts.append("dropped " + ", ".join(diff.dropped))
    if "renamed" in present:
        parts.append("renamed " + ", ".join(f"{r.old_path} -> {r.new_path}" for r in diff.renamed))
    if "type_changed" in present:
        parts.append("type of " + ", ".join(f"{t.path} {t.old_type} -> {t.new_type}" for t in diff.type_changed))
    if "nullability_changed" in present:
        parts.append(
            "nullability of "
            + ", ".join(f"{n.path} {'nullable' if n.new_nullable else 'not null'}" for n in diff.nullability_changed)
        )
    if "metadata_changed" in present:
        parts.append("field metadata of " + ", ".join(diff.metadata_changed))
    return (True, "schema: " + "; ".join(parts))


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    folded = key.casefold()
    return any(fnmatch.fnmatchcase(folded, p.casefold()) for p in patterns)


def _describe(what: str, v: ValueChange) -> str:
    if v.old is None:
        return f"{what} {v.key} set to {v.new!r}"
    if v.new is None:
        return f"{what} {v.key} removed (was {v.old!r})"
    return f"{what} {v.key} {v.old!r} -> {v.new!r}"


def _retention_ms(value: str | None, default: str) -> int | None:
    try:
        return parse_interval_ms(default if value is None else value)
    except InvalidLogError:
        return None


def _shortened_retention(changes: tuple[ValueChange, ...]) -> str | None:
    for v in changes:
        default = next((d for k, d in RETENTION_DEFAULTS.items() if k.casefold() == v.key.casefold()), None)
        if default is None:
            continue
        old, new = _retention_ms(v.old, default), _retention_ms(v.new, default)
        if old is not None and new is not None and new < old:
            return f"{v.key} shortened from {v.old or default!r} to {v.new or default!r}"
    return None


# -- parsing ------------------------------------------------------------------------------------


def _where(index: int, name: str | None) -> str:
    return f"alert rule {name!r}" if name else f"alert rule #{index + 1}"


def _str_list(value: Any, *, upper: bool = False, fold: bool = False) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError("expected a non-empty list of strings")
    return [v.upper() if upper else v.casefold() if fold else v for v in value]


def _bool_or_list(value: Any) -> tuple[str, ...] | None:
    if value is True:
        return _ALL
    if value is False:
        return None
    return tuple(_str_list(value))


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("expected a whole number of rows, 0 or more")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ValueError("expected a number of seconds, at least 0")
    return float(value)


def _percent(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
        raise ValueError("expected a percentage between 0 and 100")
    return float(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _severity(value: Any) -> str:
    if value not in SEVERITIES:
        raise ValueError(f"expected one of {', '.join(SEVERITIES)}")
    return str(value)


def _schema_kinds(value: Any) -> frozenset[str] | None:
    if value is True:
        return frozenset(SchemaDiff.KINDS)
    if value is False:
        return None
    kinds = _str_list(value)
    unknown = sorted(set(kinds) - set(SchemaDiff.KINDS))
    if unknown:
        raise ValueError(f"unknown schema change kind {unknown[0]!r}; kinds are {', '.join(SchemaDiff.KINDS)}")
    return frozenset(kinds)


def _property_values(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not value or not all(isinstance(v, str) for v in value.values()):
        raise ValueError('expected a table of property = "value"')
    return {str(k): v for k, v in value.items()}


#: Each rule key and how to read its value (raising ValueError with what was expected).
_KEYS: dict[str, Callable[[Any], Any]] = {
    "severity": _severity,
    "operation_in": lambda v: frozenset(_str_list(v, upper=True)),
    "operation_not_in": lambda v: frozenset(_str_list(v, upper=True)),
    "user_in": lambda v: frozenset(_str_list(v, fold=True)),
    "user_not_in": lambda v: frozenset(_str_list(v, fold=True)),
    "allow_unrecorded_user": _flag,
    "rows_inserted_over": _count,
    "rows_deleted_over": _count,
    "readable_under_seconds": _seconds,
    "rows_updated_over": _count,
    "rows_deleted_pct_over": _percent,
    "schema_change": _schema_kinds,
    "protocol_change": _flag,
    "property_change": _bool_or_list,
    "property_set": _property_values,
    "retention_shortened": _flag,
    "domain_change": _bool_or_list,
    "include_create": _flag,
}

#: Keys that modify conditions rather than being one.
_MODIFIERS = frozenset({"severity", "allow_unrecorded_user", "include_create"})


def parse_alert_rules(raw: Any, *, source: str | None = None) -> tuple[AlertRule, ...]:
    """Parse the ``audit.alerts`` array of tables (as ``tomllib`` reads it).

    Args:
        raw: the value of ``audit.alerts``: a list of dicts (``None`` means no rules).
        source: the settings file, named in errors.

    Raises:
        ConfigError: naming the rule (by name, or by position when it has none) and the key,
            if ``raw`` is not a list of tables, a rule lacks ``name`` or repeats one, a key is
            unknown, a value has the wrong type, or a rule has no condition.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("audit.alerts must be an array of tables ([[audit.alerts]])", file=source)
    rules: list[AlertRule] = []
    seen: set[str] = set()
    for index, table in enumerate(raw):
        if not isinstance(table, dict):
            raise ConfigError(f"{_where(index, None)}: expected a table of keys", file=source)
        name = table.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{_where(index, None)}: key 'name' is required (a non-empty string)", file=source)
        if name in seen:
            raise ConfigError(f"{_where(index, name)}: key 'name': another rule has the same name", file=source)
        seen.add(name)
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key == "name":
                continue
            reader = _KEYS.get(key)
            if reader is None:
                raise ConfigError(
                    f"{_where(index, name)}: unknown key {key!r}; known keys: name, {', '.join(sorted(_KEYS))}",
                    file=source,
                )
            try:
                values[key] = reader(value)
            except ValueError as e:
                raise ConfigError(f"{_where(index, name)}: key {key!r}: {e} (got {value!r})", file=source) from None
        conditions = [k for k, v in values.items() if k not in _MODIFIERS and v is not None and v is not False]
        if not conditions:
            raise ConfigError(
                f"{_where(index, name)}: the rule has no condition (e.g. operation_in, rows_deleted_over, "
                "schema_change, property_change)",
                file=source,
            )
        rules.append(AlertRule(name=name, **values))
    return tuple(rules)
