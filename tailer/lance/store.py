"""Storage options for pylance: deltatail's (delta-rs's spelling) translated in one place.

deltatail reads a Lance dataset's manifests, transactions and deletion files through its own
storage (obstore, :mod:`tailer.storage`), and its rows through pylance, which builds its own
object-store client (Rust ``object_store``, as delta-rs and obstore). The two take almost the same
keys; :func:`pylance_options` makes the few differences explicit:

- the keys of other clouds, delta-rs's writer-only keys and ``backoff_config.*`` are left out
  (pylance has no backoff settings; it ignores unknown keys silently, so nothing is passed on
  that it would not understand);
- ``max_retries`` becomes pylance's ``client_max_retries`` and ``retry_timeout`` (a duration)
  its ``client_retry_timeout`` (whole seconds, rounded up); deltatail's retry defaults
  (:data:`~tailer.storage.options.DEFAULT_RETRY`: 10 retries, 30 s) apply when neither is given;
- the Azure account of an ``abfs[s]://container@account...`` URI is passed as
  ``azure_storage_account_name``, as deltatail's own client gets it;
- ``aws_profile`` is refused: pylance reads profiles only from the ``AWS_PROFILE`` environment variable.

Everything else (``aws_endpoint``/``aws_endpoint_url``, ``aws_region``, credentials,
``allow_http``, ``timeout``, ``connect_timeout``, ``proxy_url``...) has the same name in both.
pylance, like obstore, also reads the cloud's standard environment variables.

pylance's error messages can carry request details: :func:`scrub` removes every secret-looking
option value (and URL signatures) from a message before deltatail shows it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from deltatail.state.errors import ConfigError
from deltatail.tailer.storage.options import redacted, retry_config, store_config
from deltatail.tailer.storage.uris import is_object_uri, parse_uri

_SIGNATURE = re.compile(r"(?i)(x-amz-signature|x-amz-credential|x-amz-security-token|sig|signature)=[^&\s\"'<>]+")


def pylance_options(root: str, options: Mapping[str, str] | None) -> dict[str, str]:
    """The storage options pylance gets for the dataset at ``root``, from deltatail's ``options``.

    A local ``root`` gets none (and takes none: :func:`~tailer.storage.factory.storage_for` refuses them).

    Raises:
        ConfigError: for ``aws_profile``, or a malformed retry option.
    """
    given = {k.strip().lower(): str(v) for k, v in (options or {}).items()}
    if not is_object_uri(root):
        return {}
    if "aws_profile" in given:
        raise ConfigError(
            "storage option aws_profile cannot be passed to pylance, which reads the rows of Lance datasets; "
            "set the AWS_PROFILE environment variable (or explicit credentials) instead",
            table=root,
        )
    uri = parse_uri(root)
    out = store_config(uri.cloud, given)
    named = any(k in out for k in ("azure_storage_account_name", "account_name", "azure_account_name"))
    if uri.cloud == "azure" and uri.account is not None and not named:
        out["azure_storage_account_name"] = uri.account
    retry = retry_config(given)
    out.pop("max_retries", None)
    out["client_max_retries"] = str(retry["max_retries"])
    out["client_retry_timeout"] = str(max(1, math.ceil(retry["retry_timeout"].total_seconds())))
    return out


def scrub(message: str, options: Mapping[str, str] | None) -> str:
    """``message`` without the values of secret-looking ``options`` and without URL signatures."""
    hidden = redacted(dict(options or {}))
    for key, value in (options or {}).items():
        if hidden.get(key) == "***" and len(value) >= 4:
            message = message.replace(value, "***")
    return _SIGNATURE.sub(lambda m: f"{m.group(1)}=***", message)
