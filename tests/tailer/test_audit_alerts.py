"""Alert rules: each kind fires on the commit that should fire it and on no other; bad rules are named.

The commits are those of the deltalake-written ops table (``audit_tables.py``), whose versions the
expectations name from what the test did there: version 2 deleted 2 of 8 rows, 7 switched the change
data feed on and cut the deleted-file retention from the default week to a day, 8 added a column as
mallory, 9 restored (dropping it), 12 overwrote all 8 rows...
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from audit_tables import AuditTables
from cdf_helpers import corpus_table

from deltatail.state.alerts import ALERT_FORMAT, AlertRule, evaluate, parse_alert_rules
from deltatail.state.audit import AuditEvent
from deltatail.state.errors import ConfigError
from deltatail.tailer.audit.alerts import AlertNotifier, audit_settings, load_audit_settings
from deltatail.tailer.audit.feed import AuditFeed


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> AuditTables:
    return AuditTables(tmp_path_factory.mktemp("alerts"))


def fired(rule: dict[str, Any], events: list[AuditEvent]) -> list[int]:
    rules = parse_alert_rules([{"name": "r", **rule}])
    return [a.version for e in events for a in evaluate(rules, e).alerts]


#: Each kind of condition, and the versions of the ops table it must fire on (and no other).
CASES: list[tuple[dict[str, Any], list[int]]] = [
    ({"operation_in": ["DELETE", "MERGE"], "rows_deleted_over": 1}, [2]),
    ({"rows_deleted_pct_over": 50}, [12]),
    ({"rows_deleted_pct_over": 20}, [2, 12]),  # 2 of 8 rows is 25 %
    ({"rows_inserted_over": 2}, [0, 1]),
    ({"rows_updated_over": 0}, [3, 4]),
    ({"schema_change": True}, [8, 9]),
    ({"schema_change": ["dropped"]}, [9]),
    ({"schema_change": ["added"], "include_create": True}, [0, 8]),
    ({"protocol_change": True}, [7]),
    ({"protocol_change": True, "include_create": True}, [0, 7]),
    ({"property_change": ["delta.enableChangeDataFeed"]}, [7]),
    ({"property_change": ["DELTA.*retentionDuration"]}, [7]),
    ({"property_change": True}, [7]),
    ({"property_set": {"delta.enableChangeDataFeed": "TRUE"}}, [7]),
    ({"property_set": {"delta.enableChangeDataFeed": "false"}}, []),
    ({"retention_shortened": True}, [7]),
    ({"domain_change": True}, []),
    ({"operation_in": ["restore"]}, [9]),
    ({"operation_in": ["VACUUM START", "VACUUM END"]}, [10, 11]),
    ({"operation_not_in": ["WRITE", "VACUUM START", "VACUUM END"]}, [2, 3, 4, 6, 7, 9]),
    ({"user_not_in": ["alice@corp", "bob@corp", "ADMIN@corp", "svc-optimizer"]}, [8, 12]),
    ({"user_not_in": ["id-alice@corp", "id-bob@corp", "id-admin@corp", "id-svc-optimizer"]}, [8, 12]),
    ({"user_in": ["mallory@corp"], "operation_in": ["WRITE"]}, [8, 12]),
    ({"user_in": ["mallory@corp"], "schema_change": True}, [8]),
]


@pytest.mark.parametrize(("rule", "versions"), CASES, ids=[json.dumps(c[0]) for c in CASES])
def test_each_kind_fires_on_its_commits_only(tables: AuditTables, rule: dict[str, Any], versions: list[int]) -> None:
    assert fired(rule, tables.followed) == versions
    for e in tables.followed:
        assert evaluate(parse_alert_rules([{"name": "r", **rule}]), e).undecided == ()


def test_alert_reasons_and_dict_form(tables: AuditTables) -> None:
    rules = parse_alert_rules(
        [
            {"name": "mass delete", "severity": "critical", "rows_deleted_pct_over": 50, "user_not_in": ["alice@corp"]},
            {"name": "cdf", "property_change": ["delta.enableChangeDataFeed"], "retention_shortened": True},
        ]
    )
    overwrite = evaluate(rules, tables.followed[12]).alerts
    assert [(a.rule, a.severity) for a in overwrite] == [("mass delete", "critical")]
    assert overwrite[0].reasons == (  # in the order of the rule language's table of keys
        "user mallory@corp is not on the allow-list",
        "100.00% of the table's rows deleted > 50%",
    )
    doc = json.loads(json.dumps(overwrite[0].to_json()))
    assert doc["format"] == ALERT_FORMAT and doc["version"] == 12 and doc["user"] == "mallory@corp"
    assert doc["event"]["version"] == 12 and doc["table"]["path"] == str(tables.vacuumed)
    assert "alert 'mass delete' (critical)" in doc["message"] and "WRITE by mallory@corp" in doc["message"]
    cdf = evaluate(rules, tables.followed[7]).alerts
    assert cdf[0].reasons == (
        "property delta.enableChangeDataFeed set to 'true'",
        "delta.deletedFileRetentionDuration shortened from 'interval 1 week' to 'interval 1 days'",
    )


def test_unknown_figures_leave_a_rule_undecided_never_silently_passed(tables: AuditTables) -> None:
    # Caught up after VACUUM deleted the file RESTORE removed: its rows, and the table size after it, are unknown.
    caught_up = list(AuditFeed(str(tables.vacuumed)).events(track_table_rows=True))
    rules = parse_alert_rules([{"name": "pct", "rows_deleted_pct_over": 50}, {"name": "any", "rows_deleted_over": 0}])
    results = {e.version: evaluate(rules, e) for e in caught_up}
    assert {v: [a.rule for a in r.alerts] for v, r in results.items() if r.alerts} == {
        2: ["any"], 4: ["any"], 12: ["any"]}  # fmt: skip
    undecided = {v: [(u.rule, u.unknown) for u in r.undecided] for v, r in results.items() if r.undecided}
    share = ("share of the table deleted",)
    assert undecided == {
        9: [("pct", share), ("any", ("rows deleted",))],
        10: [("pct", share)],
        11: [("pct", share)],
        12: [("pct", share)],
    }
    assert results[9].undecided[0].message == (
        "alert rule 'pct' cannot be decided at version 9: share of the table deleted unknown"
    )


def test_unrecorded_users(tables: AuditTables) -> None:
    events = list(AuditFeed(str(tables.cdf)).events())  # deltalake records no user unless asked
    assert fired({"user_not_in": ["alice@corp"]}, events) == [0, 1, 2, 3]
    assert fired({"user_not_in": ["alice@corp"], "allow_unrecorded_user": True}, events) == []
    assert fired({"user_in": ["alice@corp"]}, events) == []


def test_domain_changes_at_creation_only_with_include_create() -> None:
    events = list(AuditFeed(str(corpus_table("delta-rs/table_with_liquid_clustering"))).events())
    assert fired({"domain_change": True}, events) == []
    assert fired({"domain_change": ["delta.liquid"], "include_create": True}, events) == [0]
    assert fired({"domain_change": ["other.*"], "include_create": True}, events) == []


# -- the rule language's errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "x"}, "alert rule 'x': the rule has no condition"),
        ({"name": "x", "severity": "info", "protocol_change": False}, "alert rule 'x': the rule has no condition"),
        ({"name": "x", "rows_removed_over": 5}, "alert rule 'x': unknown key 'rows_removed_over'; known keys: name,"),
        (
            {"name": "x", "severity": "urgent", "protocol_change": True},
            "alert rule 'x': key 'severity': expected one of",
        ),
        ({"name": "x", "rows_deleted_over": -1}, "alert rule 'x': key 'rows_deleted_over': expected a whole number"),
        ({"name": "x", "rows_deleted_over": "10"}, "key 'rows_deleted_over': expected a whole number"),
        ({"name": "x", "rows_deleted_over": True}, "key 'rows_deleted_over': expected a whole number"),
        ({"name": "x", "rows_deleted_pct_over": 150}, "key 'rows_deleted_pct_over': expected a percentage"),
        ({"name": "x", "operation_in": []}, "key 'operation_in': expected a non-empty list of strings"),
        ({"name": "x", "user_not_in": [1]}, "key 'user_not_in': expected a non-empty list of strings"),
        ({"name": "x", "schema_change": ["moved"]}, "key 'schema_change': unknown schema change kind 'moved'"),
        ({"name": "x", "property_set": {"k": 1}}, "key 'property_set': expected a table of property"),
        ({"name": "x", "protocol_change": "yes"}, "key 'protocol_change': expected true or false"),
        ({"name": "x", "property_change": 3}, "key 'property_change': expected a non-empty list"),
        ({"severity": "info", "protocol_change": True}, "alert rule #1: key 'name' is required"),
        ({"name": " ", "protocol_change": True}, "alert rule #1: key 'name' is required"),
    ],
)
def test_bad_rules_name_the_rule_and_the_key(raw: dict[str, Any], message: str) -> None:
    pattern = ("^" if message.startswith("alert rule") else "") + re.escape(message)
    with pytest.raises(ConfigError, match=pattern) as e:
        parse_alert_rules([raw], source="/etc/deltatail.toml")
    assert e.value.file == "/etc/deltatail.toml"


def test_bad_rule_lists() -> None:
    with pytest.raises(ConfigError, match=r"audit.alerts must be an array of tables"):
        parse_alert_rules({"name": "x"})
    with pytest.raises(ConfigError, match=r"alert rule #2: expected a table of keys"):
        parse_alert_rules([{"name": "a", "protocol_change": True}, "b"])
    with pytest.raises(ConfigError, match=r"alert rule 'a': key 'name': another rule has the same name"):
        parse_alert_rules([{"name": "a", "protocol_change": True}, {"name": "a", "schema_change": True}])
    assert parse_alert_rules(None) == ()
    rule = parse_alert_rules([{"name": "a", "operation_in": "delete", "user_in": "Alice"}])[0]
    assert rule == AlertRule(name="a", operation_in=frozenset({"DELETE"}), user_in=frozenset({"alice"}))


def test_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "deltatail.toml"
    path.write_text(
        """
[run]
poll_interval = 2

[[audit.alerts]]
name = "large delete"
severity = "critical"
operation_in = ["DELETE", "MERGE"]
rows_deleted_pct_over = 10

[[audit.alerts]]
name = "cdf or retention"
property_change = ["delta.enableChangeDataFeed", "delta.deletedFileRetentionDuration"]

[audit.webhook]
url_env = "HOOK"
headers = { Authorization = "env:HOOK_TOKEN" }
timeout = 2
retries = 1
"""
    )
    settings = load_audit_settings(str(path), env={"HOOK": "https://hooks.example/T/secret", "HOOK_TOKEN": "Bearer t"})
    assert [r.name for r in settings.rules] == ["large delete", "cdf or retention"]
    assert settings.rules[0].rows_deleted_pct_over == 10.0 and settings.rules[0].severity == "critical"
    (hook,) = settings.webhooks
    assert hook.url == "https://hooks.example/T/secret" and hook.headers == {"Authorization": "Bearer t"}
    assert (hook.timeout_s, hook.retries) == (2.0, 1)
    assert "secret" not in repr(hook) and "Bearer" not in repr(hook)
    with pytest.raises(ConfigError, match="environment variable HOOK is not set") as e:
        load_audit_settings(str(path), env={})
    assert e.value.file == str(path)
    path.write_text("[audit\n")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_audit_settings(str(path))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_audit_settings(str(tmp_path / "absent.toml"))


def test_audit_table_errors() -> None:
    with pytest.raises(ConfigError, match=r"'audit' must be a table"):
        audit_settings({"audit": 3})
    with pytest.raises(ConfigError, match=r"audit: unknown key 'alert'; known keys: alerts, webhook"):
        audit_settings({"audit": {"alert": []}})
    with pytest.raises(ConfigError, match=r"audit.webhook must be a table or an array of tables"):
        audit_settings({"audit": {"webhook": "https://x"}})
    assert audit_settings({}).rules == () and audit_settings({}).webhooks == ()
    two = audit_settings({"audit": {"webhook": [{"url": "http://127.0.0.1:1/a"}, {"url": "http://127.0.0.1:2/b"}]}})
    assert [w.url for w in two.webhooks] == ["http://127.0.0.1:1/a", "http://127.0.0.1:2/b"]


def test_notifier_logs_alerts_and_undecided_rules(tables: AuditTables, caplog: pytest.LogCaptureFixture) -> None:
    rules = parse_alert_rules(
        [
            {"name": "restore", "severity": "critical", "operation_in": ["RESTORE"]},
            {"name": "vacuum", "severity": "info", "operation_in": ["VACUUM START"]},
            {"name": "deletes", "rows_deleted_over": 0},
        ]
    )
    notifier = AlertNotifier(rules)
    caught_up = {e.version: e for e in AuditFeed(str(tables.vacuumed)).events()}
    with caplog.at_level(logging.INFO, logger="deltatail.audit"):
        for v in (9, 10):
            notifier.notify(caught_up[v])
    notifier.close()
    records = [(r.levelname, getattr(r, "event", None), r.getMessage()) for r in caplog.records]
    assert records == [
        ("ERROR", "alert", f"alert 'restore' (critical): {tables.vacuumed} version 9, RESTORE by admin@corp: "
                           "operation is RESTORE"),
        ("WARNING", "alert_undecided", "alert rule 'deletes' cannot be decided at version 9: rows deleted unknown"),
        ("INFO", "alert", f"alert 'vacuum' (info): {tables.vacuumed} version 10, VACUUM START by admin@corp: "
                          "operation is VACUUM START"),
    ]  # fmt: skip
    fields = caplog.records[0].fields  # type: ignore[attr-defined]
    assert fields["rule"] == "restore" and fields["version"] == 9 and fields["user"] == "admin@corp"
