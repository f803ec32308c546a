"""The Kafka sink URI's options of the ``avro`` encoding: ``encoding``, ``registry`` and its credentials.

``registry_user`` may be given as it is or as a reference; ``registry_password`` only as a reference,
so that the URI (which errors and status lines show) never holds the secret: ``env:NAME`` is the
environment variable ``NAME``, ``@PATH`` the content of the file (at most
:data:`~tailer.storage.options.MAX_SECRET_FILE` bytes), stripped of surrounding white space, as
the storage options' references (``docs/kafka.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from deltatail.sinks.kafka.registry import RegistryClient
from deltatail.state.errors import ConfigError
from deltatail.tailer.storage.options import ENV_PREFIX, FILE_PREFIX, MAX_SECRET_FILE

#: The URI options of this module.
AVRO_OPTIONS = ("encoding", "registry", "registry_user", "registry_password", "registry_timeout_ms")
ENCODINGS = ("json", "avro")


@dataclass(frozen=True, slots=True)
class AvroOptions:
    """Where the Schema Registry is and how to sign in (``encoding=avro``).

    Args:
        registry: the registry's base URL.
        user: the basic-auth user (resolved), if any.
        password: the basic-auth password (resolved; never shown by ``repr``), if any.
        timeout_ms: the timeout of one registry request.
    """

    registry: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_ms: int = 30_000

    def client(self) -> RegistryClient:
        """A registry client with these settings.

        Raises:
            SinkError: if the URL is not an http(s) URL or carries credentials.
        """
        return RegistryClient(self.registry, user=self.user, password=self.password, timeout=self.timeout_ms / 1000)


def avro_options(raw: Mapping[str, str], uri: str, env: Mapping[str, str]) -> AvroOptions | None:
    """The Avro options of a URI's ``raw`` options; ``None`` for ``encoding=json`` (the default).

    Raises:
        ConfigError: on an unknown encoding, ``encoding=avro`` without ``registry`` (or registry
            options without it), a password given literally, a reference to a variable that is not
            set or a file that cannot be read, or a bad timeout. The error never holds a secret.
    """
    encoding = raw.get("encoding", "json")
    if encoding not in ENCODINGS:
        raise ConfigError(f"kafka URI {uri!r}: encoding={encoding!r}; expected json or avro")
    given = [k for k in AVRO_OPTIONS[1:] if k in raw]
    if encoding == "json":
        if given:
            raise ConfigError(f"kafka URI {uri!r}: {', '.join(given)} apply to encoding=avro only")
        return None
    if not raw.get("registry"):
        raise ConfigError(f"kafka URI {uri!r}: encoding=avro needs registry=http://HOST:PORT (the Schema Registry)")
    registry = urlsplit(raw["registry"])
    if registry.scheme not in ("http", "https") or not registry.hostname or registry.username or registry.password:
        raise ConfigError(
            "kafka URI: registry must be the http:// or https:// URL of the Schema Registry, without credentials "
            "(give them as registry_user and registry_password)"
        )
    password = raw.get("registry_password")
    if password is not None and not password.startswith((ENV_PREFIX, FILE_PREFIX)):
        raise ConfigError(
            "kafka URI: registry_password must be a reference, env:NAME or @FILE, never the password itself"
        )
    timeout = raw.get("registry_timeout_ms", "30000")
    if not timeout.isdigit() or int(timeout) < 1:
        raise ConfigError(f"kafka URI {uri!r}: registry_timeout_ms={timeout!r} is not an integer >= 1")
    user = raw.get("registry_user")
    return AvroOptions(
        registry=raw["registry"],
        user=None if user is None else _resolved("registry_user", user, env),
        password=None if password is None else _resolved("registry_password", password, env),
        timeout_ms=int(timeout),
    )


def _resolved(option: str, value: str, env: Mapping[str, str]) -> str:
    """``value``, or what its ``env:NAME`` or ``@PATH`` reference names."""
    if value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX) :].strip()
        resolved = env.get(name, "") if name else ""
        if not resolved:
            state = "is empty" if name in env else "is not set"
            raise ConfigError(
                f"kafka option {option} refers to environment variable {name or '(no name)'}, which {state}"
            )
        return resolved
    if not value.startswith(FILE_PREFIX):
        return value
    path = value[len(FILE_PREFIX) :].strip()
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SECRET_FILE + 1)
    except OSError as e:
        raise ConfigError(f"kafka option {option} refers to file {path}, which cannot be read ({e.strerror})") from None
    text = data.decode("utf-8", "replace").strip() if len(data) <= MAX_SECRET_FILE else ""
    if not text:
        raise ConfigError(f"kafka option {option} refers to file {path}, which is empty or too large")
    return text
