"""A client of the Confluent Schema Registry REST API: the few calls the ``avro`` encoding needs.

Calls (Confluent's API reference, "Schema Registry API Reference"):

- ``POST /subjects/{subject}/versions`` ``{"schema": TEXT}`` registers a schema (or finds it registered)
  and answers ``{"id": ID}``; ``409`` when the subject's compatibility rule refuses it, ``422`` when
  the schema is invalid;
- ``GET /subjects/{subject}/versions/latest`` and ``GET /config/{subject}?defaultToGlobal=true``
  (``{"compatibilityLevel": ...}``) explain a refusal.

Schema ids are cached by subject and schema text: one request per new schema, never one per message.
A registry that cannot be reached, times out or answers 5xx is *unavailable*
(:class:`~state.errors.SinkUnavailableError`: the run is retried from the cursor); a refusal, an
invalid schema or refused credentials (401, 403) is a :class:`~state.errors.SinkError`. Basic-auth
credentials are sent in the ``Authorization`` header only: errors name the registry by its URL
without credentials, and never carry a secret.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from deltatail.state.errors import SinkError, SinkUnavailableError

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
#: The largest registry answer read (a schema of a wide table is far smaller).
MAX_ANSWER = 16 << 20


class Refused(SinkError):
    """The registry refused a schema under the subject's compatibility rule (HTTP 409)."""

    def __init__(self, message: str, *, subject: str, rule: str, previous: Any) -> None:
        self.subject = subject
        self.rule = rule
        self.previous = previous
        super().__init__(message)


class RegistryClient:
    """Registers schemas with one Schema Registry and caches their ids.

    Args:
        url: the registry's base URL (``http://host:8081``); credentials in it are not allowed.
        user: basic-auth user, or ``None``.
        password: basic-auth password, or ``None``.
        timeout: seconds per request.

    Raises:
        SinkError: if the URL is not ``http``/``https`` or carries credentials.
    """

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SinkError("registry must be an http:// or https:// URL of the Schema Registry")
        if parts.username or parts.password:
            raise SinkError("registry URL must not carry credentials; use registry_user and registry_password")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._auth = None
        if user is not None or password is not None:
            token = base64.b64encode(f"{user or ''}:{password or ''}".encode()).decode()
            self._auth = f"Basic {token}"
        self._ids: dict[tuple[str, str], int] = {}
        self.requests = 0

    def register(self, subject: str, schema: str) -> int:
        """The id of ``schema`` under ``subject``, registering it on first use.

        Raises:
            Refused: if the subject's compatibility rule refuses it (409).
            SinkUnavailableError: if the registry cannot be reached, times out or fails (5xx).
            SinkError: on any other refusal (invalid schema, refused credentials).
        """
        found = self._ids.get((subject, schema))
        if found is not None:
            return found
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        status, answer = self._call("POST", path, {"schema": schema})
        if status == 409:
            raise self._refused(subject, answer)
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("id"), int):
            raise SinkError(f"Schema Registry {self.url} refused the schema of subject {subject}: {_said(answer)}")
        if len(self._ids) > 1024:
            self._ids.clear()
        self._ids[(subject, schema)] = answer["id"]
        return int(answer["id"])

    def _refused(self, subject: str, answer: Any) -> Refused:
        quoted = urllib.parse.quote(subject, safe="")
        _, config = self._call("GET", f"/config/{quoted}?defaultToGlobal=true")
        rule = config.get("compatibilityLevel", "unknown") if isinstance(config, dict) else "unknown"
        status, latest = self._call("GET", f"/subjects/{quoted}/versions/latest")
        previous = None
        if status == 200 and isinstance(latest, dict) and isinstance(latest.get("schema"), str):
            previous = json.loads(latest["schema"])
        message = f"Schema Registry {self.url} refused the new schema of subject {subject}: {_said(answer)}"
        return Refused(message, subject=subject, rule=str(rule), previous=previous)

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Accept", _CONTENT_TYPE)
        if data is not None:
            request.add_header("Content-Type", _CONTENT_TYPE)
        if self._auth is not None:
            request.add_header("Authorization", self._auth)
        self.requests += 1
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, _parsed(response.read(MAX_ANSWER))
        except urllib.error.HTTPError as e:
            status, answer = e.code, _parsed(e.read(MAX_ANSWER))
            e.close()
        except (OSError, ValueError) as e:  # refused, reset, timed out, DNS; URLError is an OSError
            reason = getattr(e, "reason", e)
            raise SinkUnavailableError(f"cannot reach the Schema Registry at {self.url}: {reason}") from None
        if status >= 500:
            raise SinkUnavailableError(f"the Schema Registry at {self.url} failed ({status}): {_said(answer)}")
        if status in (401, 403):
            raise SinkError(f"the Schema Registry at {self.url} refused the credentials ({status})")
        return status, answer


def _parsed(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data[:200].decode("utf-8", "replace")


def _said(answer: Any) -> str:
    if isinstance(answer, dict) and "message" in answer:
        return str(answer["message"])
    return str(answer)[:300]
