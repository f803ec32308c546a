"""Audit settings from the TOML file, and alert delivery: to the log (stderr) and to webhooks.

The ``[audit]`` table of the settings file holds the alert rules
(``[[audit.alerts]]``, see :mod:`state.alerts`) and the webhook
(``[audit.webhook]``, or several as ``[[audit.webhook]]``; see
:mod:`tailer.audit.webhook`)::

    [[audit.alerts]]
    name = "large delete"
    operation_in = ["DELETE", "MERGE"]
    rows_deleted_over = 100000

    [audit.webhook]
    url_env = "DELTATAIL_ALERT_WEBHOOK"
    timeout = 5
    retries = 3

:class:`AlertNotifier` evaluates the rules on each event. Each alert is logged
(``info``/``warning``/``critical`` severity at the log's INFO/WARNING/ERROR
level; in JSON logs with ``event: "alert"`` and the alert's fields) and
queued to every webhook, which never blocks. A rule that cannot be decided on
a commit is logged as a warning (``event: "alert_undecided"``).
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deltatail.state.alerts import AlertRule, Evaluation, evaluate, parse_alert_rules
from deltatail.state.audit import AuditEvent
from deltatail.state.errors import ConfigError
from deltatail.tailer.audit.webhook import Webhook, WebhookConfig

log = logging.getLogger("deltatail.audit")

_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """The ``[audit]`` table: alert rules and webhooks."""

    rules: tuple[AlertRule, ...] = ()
    webhooks: tuple[WebhookConfig, ...] = ()

    @property
    def needs_table_rows(self) -> bool:
        """Whether a rule needs the table's row count (``rows_deleted_pct_over``)."""
        return any(rule.rows_deleted_pct_over is not None for rule in self.rules)


def audit_settings(
    data: Mapping[str, Any], *, env: Mapping[str, str] | None = None, source: str | None = None
) -> AuditSettings:
    """The audit settings in a parsed TOML document (its ``audit`` table; absent means none).

    Raises:
        ConfigError: if ``audit`` is not a table or holds an unknown key, or a rule or webhook is invalid.
    """
    audit = data.get("audit", {})
    if not isinstance(audit, dict):
        raise ConfigError("'audit' must be a table ([audit])", file=source)
    for key in audit:
        if key not in ("alerts", "webhook"):
            raise ConfigError(f"audit: unknown key {key!r}; known keys: alerts, webhook", file=source)
    rules = parse_alert_rules(audit.get("alerts"), source=source)
    hooks_raw = audit.get("webhook", [])
    if isinstance(hooks_raw, dict):
        hooks_raw = [hooks_raw]
    if not isinstance(hooks_raw, list) or not all(isinstance(h, dict) for h in hooks_raw):
        raise ConfigError("audit.webhook must be a table or an array of tables", file=source)
    hooks = tuple(WebhookConfig.from_settings(h, env=env, source=source) for h in hooks_raw)
    return AuditSettings(rules, hooks)


def load_audit_settings(path: str, *, env: Mapping[str, str] | None = None) -> AuditSettings:
    """The audit settings of the TOML file at ``path``.

    Raises:
        ConfigError: if the file cannot be read or is not TOML, or as :func:`audit_settings`.
    """
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file: {e}", file=path) from e
    return audit_settings(data, env=os.environ if env is None else env, source=path)


class AlertNotifier:
    """Evaluates the rules on each event and delivers the alerts. Close it to flush the webhooks.

    Args:
        rules: the alert rules.
        webhooks: where alerts are POSTed besides the log (owned: closed by :meth:`close`).
    """

    def __init__(self, rules: Sequence[AlertRule], webhooks: Sequence[Webhook] = ()) -> None:
        self.rules = tuple(rules)
        self.webhooks = tuple(webhooks)

    @staticmethod
    def from_settings(settings: AuditSettings) -> AlertNotifier:
        """A notifier with a started :class:`Webhook` per configured webhook."""
        return AlertNotifier(settings.rules, [Webhook(c) for c in settings.webhooks])

    def notify(self, event: AuditEvent, readable_seconds: float | None = None) -> Evaluation:
        """Evaluate the rules on ``event``, log and send what they raise; returns the evaluation.

        ``readable_seconds``: how long the event's commit stays readable as it is audited (see
        :func:`state.alerts.evaluate`).
        """
        result = evaluate(self.rules, event, readable_seconds)
        for alert in result.alerts:
            fields = {
                "rule": alert.rule,
                "severity": alert.severity,
                "version": alert.version,
                "operation": event.operation,
                "user": event.user,
                "reasons": list(alert.reasons),
            }
            log.log(_LEVELS[alert.severity], "%s", alert.message, extra={"event": "alert", "fields": fields})
            for hook in self.webhooks:
                hook.send(alert.to_json(), label=f"alert {alert.rule!r} at version {alert.version}")
        for undecided in result.undecided:
            log.warning(
                "%s",
                undecided.message,
                extra={
                    "event": "alert_undecided",
                    "fields": {
                        "rule": undecided.rule,
                        "version": undecided.version,
                        "unknown": list(undecided.unknown),
                    },
                },
            )
        return result

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what the webhooks still hold (at most ``timeout_s`` each) and stop them."""
        for hook in self.webhooks:
            hook.close(timeout_s)
