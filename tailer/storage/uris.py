"""Object-store URIs: which cloud, bucket (or container), account and key a URI names.

``s3://bucket/key`` and ``s3a://bucket/key``; ``gs://bucket/key``;
``az://container/key``, ``azure://container/key`` (the account comes from the
options or ``AZURE_STORAGE_ACCOUNT_NAME``) and
``abfs[s]://container@account.dfs.core.windows.net/key`` (ADLS Gen2 accounts are
served through the Blob endpoint, as delta-rs does). The key is taken verbatim:
Delta's relative paths are already percent-decoded, and keys may hold ``%``,
spaces, ``=``, ``?`` or ``#``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from deltatail.state.errors import ConfigError

Cloud = Literal["s3", "azure", "gcs"]

SCHEMES: dict[str, Cloud] = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "az": "azure",
    "azure": "azure",
    "abfs": "azure",
    "abfss": "azure",
}
"""The URI schemes served, and their cloud."""


@dataclass(frozen=True, slots=True)
class ObjectUri:
    """A parsed object-store URI.

    Attributes:
        cloud: which cloud's client serves it.
        scheme: the scheme as written (``s3a``, ``abfss``, ...).
        bucket: the bucket (S3, GCS) or container (Azure).
        account: the Azure storage account named in an ``abfs[s]://`` URI, else ``None``.
        key: the object key below the bucket, without a leading ``/`` (``""`` for the bucket itself).
    """

    cloud: Cloud
    scheme: str
    bucket: str
    account: str | None
    key: str


def is_object_uri(path: str) -> bool:
    """Whether ``path`` is a URI this module serves (by its scheme; the rest is not checked)."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


def parse_uri(uri: str) -> ObjectUri:
    """Split an object-store URI into cloud, bucket, account and key; the key is kept verbatim.

    Raises:
        ConfigError: if the scheme is not one of :data:`SCHEMES`, or the bucket (or an ``abfs[s]``
            URI's ``container@account`` authority) is missing.
    """
    scheme, sep, rest = uri.partition("://")
    cloud = SCHEMES.get(scheme.lower()) if sep else None
    if cloud is None:
        raise ConfigError(
            f"not an object-store URI (schemes: {', '.join(sorted(SCHEMES))}): {uri}",
            file=uri,
        )
    authority, _, key = rest.partition("/")
    account: str | None = None
    bucket = authority
    if scheme.lower() in ("abfs", "abfss"):
        container, at, host = authority.partition("@")
        if not at or not container or not host:
            raise ConfigError(
                f"an {scheme}:// URI names its container and account as container@account.dfs.core.windows.net: {uri}",
                file=uri,
            )
        bucket, account = container, host.split(".", 1)[0]
    if not bucket:
        raise ConfigError(f"the URI names no bucket or container: {uri}", file=uri)
    return ObjectUri(cloud, scheme.lower(), bucket, account, key.strip("/"))


def root_of(u: ObjectUri) -> str:
    """The URI of ``u``'s bucket (with the account, for ``abfs[s]``), for messages."""
    return f"{u.scheme}://{u.bucket}" if u.account is None else f"{u.scheme}://{u.bucket}@{u.account}"
