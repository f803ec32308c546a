"""Storage options: delta-rs's spelling, merged from the command line, a TOML ``[storage]`` table and the environment.

The same ``--storage-option KEY=VALUE`` works for deltatail and delta-rs:
``AWS_*`` keys go to S3 clients, ``AZURE_*`` to Azure clients, ``GOOGLE_*`` to
GCS clients, and keys without a cloud prefix (``allow_http``, ``timeout``,
``connect_timeout``, ``proxy_url``...) to all. The standard environment
variables (``AWS_ACCESS_KEY_ID``, ``AZURE_STORAGE_ACCOUNT_KEY``,
``GOOGLE_SERVICE_ACCOUNT``...) and instance credentials are read by obstore
itself and lose to explicit options. Retries take delta-rs's keys
(``max_retries``, ``retry_timeout``, ``backoff_config.init_backoff``,
``backoff_config.max_backoff``, ``backoff_config.base``). Writer-only keys of
delta-rs (locking, unsafe rename) are accepted and ignored: deltatail only
reads tables. Values never appear in messages; :func:`redacted` hides
secret-looking ones wherever options are shown.

A value may be a reference instead, so that secrets stay out of ``ps`` and of config files:
``env:NAME`` is the environment variable ``NAME``, ``@/path/to/file`` the file's content with
surrounding white space stripped (a mounted secret). :func:`resolve_references` resolves them where
options are read (``--storage-option``, a TOML ``[storage]`` table); a variable that is not set, a
file that cannot be read or an empty one is a :class:`~state.errors.ConfigError` naming the option
and the variable or file, never a value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import urlsplit

from deltatail.state.errors import ConfigError
from deltatail.tailer.storage.uris import Cloud, ObjectUri, root_of

if TYPE_CHECKING:
    from obstore.store import AzureStore, BackoffConfig, GCSStore, RetryConfig, S3Store

#: An obstore client (obstore itself is imported when the first one is built: a command on a local table,
#: which parses storage options too, does not load it).
Store: TypeAlias = "S3Store | AzureStore | GCSStore"

_CLOUD_PREFIX: dict[Cloud, str] = {"s3": "aws_", "azure": "azure_", "gcs": "google_"}

WRITER_ONLY_KEYS = frozenset(
    {
        "aws_s3_allow_unsafe_rename",
        "aws_s3_locking_provider",
        "delta_dynamo_table_name",
        "aws_force_credential_load",
        "dynamo_endpoint",
        "dynamo_region",
        "dynamo_access_key_id",
        "dynamo_secret_access_key",
        "dynamo_session_token",
        "aws_copy_if_not_exists",
        "aws_conditional_put",
    }
)
"""delta-rs options that only a writer uses: accepted and ignored."""

_RETRY_KEYS = frozenset(
    {
        "max_retries",
        "retry_timeout",
        "backoff_config.init_backoff",
        "backoff_config.max_backoff",
        "backoff_config.base",
    }
)

CONCURRENCY_KEY = "deltatail_concurrency"
READ_AHEAD_BYTES_KEY = "deltatail_read_ahead_bytes"
DEFAULT_CONCURRENCY = 16
"""Requests a store client keeps in flight while reading ahead."""
DEFAULT_READ_AHEAD_BYTES = 64 << 20
"""The most bytes of files fetched ahead and not yet read, per storage (commits, small data, cdc files)."""
_READING_KEYS = {CONCURRENCY_KEY: (1, 256), READ_AHEAD_BYTES_KEY: (0, 1 << 40)}

DEFAULT_RETRY = {
    "max_retries": 10,
    "retry_timeout": timedelta(seconds=30),
    "init_backoff": timedelta(milliseconds=100),
    "max_backoff": timedelta(seconds=5),
    "base": 2.0,
}
"""Retry defaults: object_store's, but giving up after 30 s instead of 180 s (a follower retries later itself)."""

_SECRET_KEY = re.compile(r"secret|key|token|sas|password|signature|credential", re.IGNORECASE)

#: Keys whose values are URLs of a server: a malformed one must not reach the client (object_store panics on it).
_URL_KEY = re.compile(r"(?:^|_)(?:endpoint|endpoint_url|endpoint_url_s3|base_url|proxy_url)$")


def merge_options(*layers: Mapping[str, str] | None) -> dict[str, str]:
    """Merge option layers, later ones winning (``merge_options(toml_table, cli_options)``); keys are case-folded.

    The environment is not a layer here: obstore reads ``AWS_*``, ``AZURE_*`` and ``GOOGLE_*``
    variables itself, and explicit options override them.
    """
    out: dict[str, str] = {}
    for layer in layers:
        for k, v in (layer or {}).items():
            out[k.strip().lower()] = str(v)
    return out


def parse_option_pairs(pairs: Iterable[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``--storage-option KEY=VALUE`` arguments as a dict, ``env:NAME`` and ``@FILE`` values resolved.

    Raises:
        ConfigError: if an argument has no ``=`` or an empty key, or a reference cannot be resolved
            (:func:`resolve_references`); the value is never echoed.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            shown = key.strip() if eq else "(no '=')"
            raise ConfigError(f"a storage option must be KEY=VALUE; got key {shown!r}")
        out[key.strip().lower()] = value
    return resolve_references(out, env)


ENV_PREFIX = "env:"
FILE_PREFIX = "@"
MAX_SECRET_FILE = 64 << 10
"""The largest file an ``@PATH`` option value may name (a key file or token; larger is a mistake)."""


def resolve_references(
    options: Mapping[str, str], env: Mapping[str, str] | None = None, *, where: str | None = None
) -> dict[str, str]:
    """``options`` with ``env:NAME`` and ``@PATH`` values resolved; other values as they are.

    ``env:NAME`` is the environment variable ``NAME``, ``@PATH`` the content of the file (at most
    :data:`MAX_SECRET_FILE` bytes), stripped of surrounding white space.

    Args:
        options: storage options.
        env: the environment (``os.environ`` if not given).
        where: the file the options come from, for errors.

    Raises:
        ConfigError: naming the option and the variable or file (never a value) if the variable is
            not set or empty, or the file cannot be read, is larger than :data:`MAX_SECRET_FILE`, is
            not UTF-8 text or is empty.
    """
    env = os.environ if env is None else env
    out: dict[str, str] = {}
    for key, value in options.items():
        if value.startswith(ENV_PREFIX):
            name = value[len(ENV_PREFIX) :].strip()
            resolved = env.get(name, "") if name else ""
            if not resolved:
                state = "is empty" if name in env else "is not set"
                raise ConfigError(
                    f"storage option {key} refers to environment variable {name or '(no name)'}, which {state}",
                    file=where,
                )
            out[key] = resolved
        elif value.startswith(FILE_PREFIX):
            path = value[len(FILE_PREFIX) :].strip()
            try:
                with open(path, "rb") as fh:
                    data = fh.read(MAX_SECRET_FILE + 1)
            except OSError as e:
                raise ConfigError(
                    f"storage option {key} refers to file {path}, which cannot be read ({e.strerror or 'error'})",
                    file=where,
                ) from None
            if len(data) > MAX_SECRET_FILE:
                raise ConfigError(
                    f"storage option {key} refers to file {path}, which is larger than {MAX_SECRET_FILE} bytes",
                    file=where,
                )
            try:
                text = data.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise ConfigError(
                    f"storage option {key} refers to file {path}, which is not UTF-8 text", file=where
                ) from None
            if not text:
                raise ConfigError(f"storage option {key} refers to file {path}, which is empty", file=where)
            out[key] = text
        else:
            out[key] = value
    return out


def redacted(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with the values of secret-looking keys replaced by ``***``, for logs and status lines."""
    return {k: ("***" if _SECRET_KEY.search(k) else v) for k, v in options.items()}


def _duration(key: str, value: str) -> timedelta:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", value)
    if m is None:
        raise ConfigError(f"storage option {key} must be a duration like 500ms, 30s or 2m; got {value!r}")
    n, unit = float(m.group(1)), m.group(2) or "s"
    return timedelta(seconds=n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit])


def reading_config(options: Mapping[str, str]) -> tuple[int, int]:
    """Requests in flight and read-ahead bytes (``deltatail_concurrency``, ``deltatail_read_ahead_bytes``).

    Defaults :data:`DEFAULT_CONCURRENCY` and :data:`DEFAULT_READ_AHEAD_BYTES`; deltatail's own keys,
    never passed to the store client.

    Raises:
        ConfigError: if one is not a whole number within its bounds (1..256 requests, 0..1 TiB).
    """
    values = {CONCURRENCY_KEY: DEFAULT_CONCURRENCY, READ_AHEAD_BYTES_KEY: DEFAULT_READ_AHEAD_BYTES}
    for key, (low, high) in _READING_KEYS.items():
        if key not in options:
            continue
        raw = options[key].strip()
        if not raw.isdigit() or not low <= int(raw) <= high:
            raise ConfigError(f"storage option {key} must be a whole number from {low} to {high}; got {raw!r}")
        values[key] = int(raw)
    return values[CONCURRENCY_KEY], values[READ_AHEAD_BYTES_KEY]


def retry_config(options: Mapping[str, str]) -> RetryConfig:
    """Obstore's retry configuration from delta-rs's retry keys, over :data:`DEFAULT_RETRY`.

    Raises:
        ConfigError: if a retry option is not a number or duration.
    """
    d = dict(DEFAULT_RETRY)
    try:
        if "max_retries" in options:
            d["max_retries"] = int(options["max_retries"])
        if "backoff_config.base" in options:
            d["base"] = float(options["backoff_config.base"])
    except ValueError:
        raise ConfigError("storage options max_retries and backoff_config.base must be numbers") from None
    for key, name in (
        ("retry_timeout", "retry_timeout"),
        ("backoff_config.init_backoff", "init_backoff"),
        ("backoff_config.max_backoff", "max_backoff"),
    ):
        if key in options:
            d[name] = _duration(key, options[key])
    backoff: BackoffConfig = {
        "init_backoff": d["init_backoff"],  # type: ignore[typeddict-item]
        "max_backoff": d["max_backoff"],  # type: ignore[typeddict-item]
        "base": d["base"],  # type: ignore[typeddict-item]
    }
    return {
        "max_retries": d["max_retries"],  # type: ignore[typeddict-item]
        "retry_timeout": d["retry_timeout"],  # type: ignore[typeddict-item]
        "backoff": backoff,
    }


def store_config(cloud: Cloud, options: Mapping[str, str]) -> dict[str, str]:
    """The options one cloud's client gets: its own prefixed keys and the unprefixed ones.

    Retry keys, deltatail's reading keys and delta-rs's writer-only keys are left out; ``aws_profile``
    is handled by :func:`build_store`.
    """
    other = tuple(p for c, p in _CLOUD_PREFIX.items() if c != cloud)
    left_out = _RETRY_KEYS | WRITER_ONLY_KEYS | _READING_KEYS.keys() | {"aws_profile"}
    return {k: v for k, v in options.items() if not k.startswith(other) and k not in left_out}


def build_store(u: ObjectUri, options: Mapping[str, str]) -> Store:
    """An obstore client for ``u``'s bucket, configured by ``options`` over the environment.

    Raises:
        ConfigError: for an option the cloud's client does not know (the key is named, the value never), an
            endpoint that is not an ``http(s)://`` URL with a host, a value the client cannot parse, or an
            ``aws_profile`` that is not configured (or without boto3 installed).
    """
    import obstore.exceptions as oe
    from obstore.store import AzureStore, GCSStore, S3Store

    config = store_config(u.cloud, options)
    _check_urls(config, u)
    retry = retry_config(options)
    try:
        if u.cloud == "s3":
            provider = None
            if "aws_profile" in options:
                provider = _profile_provider(options["aws_profile"])
            return S3Store(u.bucket, config=config, retry_config=retry, credential_provider=provider)  # type: ignore[arg-type]
        if u.cloud == "azure":
            if u.account is not None and not any(
                k in config for k in ("azure_storage_account_name", "account_name", "azure_account_name")
            ):
                config = {**config, "azure_storage_account_name": u.account}
            return AzureStore(u.bucket, config=config, retry_config=retry)  # type: ignore[arg-type]
        return GCSStore(u.bucket, config=config, retry_config=retry)  # type: ignore[arg-type]
    except oe.UnknownConfigurationKeyError as e:
        key = _quoted(str(e))
        raise ConfigError(
            f"storage option {key or '(unknown)'} is not known to the {u.cloud} client", file=root_of(u)
        ) from None
    except oe.BaseError as e:
        raise ConfigError(
            f"cannot configure the {u.cloud} client for {root_of(u)}: {_first_line(e)}", file=root_of(u)
        ) from None


def _check_urls(config: Mapping[str, str], u: ObjectUri) -> None:
    """Endpoint options must be URLs with a scheme and a host (the value is never shown: it may embed credentials)."""
    for key, value in config.items():
        if not _URL_KEY.search(key) or key.startswith("use_") or "_use_" in key:
            continue
        try:
            parts = urlsplit(value.strip())
            ok = bool(parts.hostname) and (parts.scheme in ("http", "https") or key.endswith("proxy_url"))
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"storage option {key} must be an http:// or https:// URL with a host", file=root_of(u))


def _profile_provider(profile: str) -> Any:
    try:
        import boto3
        import botocore.exceptions
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        raise ConfigError("storage option aws_profile needs boto3 installed (pip install boto3)") from None
    try:
        return Boto3CredentialProvider(boto3.Session(profile_name=profile))
    except botocore.exceptions.BotoCoreError:
        raise ConfigError(
            "storage option aws_profile names a profile that is not in the AWS config or credentials files"
        ) from None


def _quoted(message: str) -> str | None:
    m = re.search(r"'([^']+)'", message)
    return m.group(1) if m else None


def _first_line(e: BaseException) -> str:
    """Obstore's first message line, only where it carries no request detail, values quoted in it hidden."""
    line = str(e).split("\n", 1)[0]
    if "http" in line.lower():
        return "invalid configuration"
    return re.sub(r'"[^"]*"', "(value hidden)", line)
