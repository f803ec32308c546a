"""What an object store's failure means: the one place obstore's errors become deltatail's.

A failure is translated once (:func:`translate`) into a :class:`~state.errors.StorageError`
(transient or not, with the request's detail for ``-v``) or a
:class:`~state.errors.MissingFileError`, naming the file; credentials never appear in either.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import obstore.exceptions as oe

from deltatail.state.errors import DeltaTailError, MissingFileError, StorageError

_STATUS = re.compile(r"status code: (\d{3})")


def describe_failure(e: BaseException) -> tuple[str, bool]:
    """A phrase for an obstore failure, and whether it may pass: never obstore's own text.

    obstore's messages hold request URLs (an Azure SAS token travels in the query string) and
    response bodies; only the HTTP status and the kind of connection failure are taken from them.
    """
    text = str(e)
    m = _STATUS.search(text)
    if isinstance(e, oe.PermissionDeniedError | oe.UnauthenticatedError):
        status = f" (HTTP {m.group(1)})" if m else ""
        return f"access denied{status}: check the credentials and their permissions", False
    if m is not None:
        code = int(m.group(1))
        if code in (429, 503):
            return f"the store is throttling requests (HTTP {code}), still after retries", True
        if code >= 500:
            return f"the store failed (HTTP {code}), still after retries", True
        if code in (401, 403):
            return f"access denied (HTTP {code}): check the credentials and their permissions", False
        if code == 404:
            return "not found (HTTP 404): no such bucket or container?", False
        return f"the store refused the request (HTTP {code})", False
    low = text.lower()
    if "connection refused" in low or "connect error" in low or "tcp connect" in low:
        return "cannot connect to the store (connection refused), still after retries", True
    if "timed out" in low or "timeout" in low:
        return "the store did not answer in time, still after retries", True
    if "dns error" in low or "failed to lookup address" in low:
        return "cannot resolve the store's host name", True
    if "error sending request" in low or "connection" in low or "http error" in low:
        return "the connection to the store failed, still after retries", True
    return f"the store's client failed ({type(e).__name__})", False


#: Where each cloud's client looks for credentials when the options name none, in its order.
CREDENTIAL_SOURCES: dict[str, str] = {
    "s3": (
        "storage options (--storage-option, [storage] in the config file: aws_access_key_id and "
        "aws_secret_access_key, or aws_profile), the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
        "AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI), "
        "then the instance metadata service"
    ),
    "azure": (
        "storage options (--storage-option, [storage] in the config file: azure_storage_account_key, "
        "azure_storage_sas_key, or azure_client_id with azure_client_secret), the environment "
        "(AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY, AZURE_CLIENT_ID with AZURE_CLIENT_SECRET or "
        "AZURE_FEDERATED_TOKEN_FILE), then the managed-identity endpoint of the instance metadata service"
    ),
    "gcs": (
        "storage options (--storage-option, [storage] in the config file: google_service_account or "
        "google_service_account_key), the environment (GOOGLE_SERVICE_ACCOUNT, GOOGLE_SERVICE_ACCOUNT_KEY, "
        "GOOGLE_APPLICATION_CREDENTIALS), gcloud's application default credentials file, then the metadata server"
    ),
}

#: The metadata services a client asks for credentials when it was given none: their addresses, and the
#: paths of their credential requests (a metadata endpoint may be configured elsewhere).
_METADATA = re.compile(
    r"169\.254\.169\.254|fd00:ec2::254|metadata\.google\.internal"
    r"|/latest/api/token|/latest/meta-data/|/metadata/identity/oauth2/token|/computeMetadata/v1/",
    re.IGNORECASE,
)


def _no_credentials(e: BaseException, uri: str) -> str | None:
    """The "no credentials" phrase when ``e`` is the client's failed last resort: asking a metadata service."""
    if not _METADATA.search(str(e)):
        return None
    cloud = uri.split("://", 1)[0]
    cloud = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}.get(cloud, "azure")
    return f"no credentials found; looked in {CREDENTIAL_SOURCES[cloud]}, which gave none"


_REQUEST = re.compile(r"Error performing ([A-Z]+) (\S+?)(?: in ([0-9.]+\S*))? - ")
_STATUS_LINE = re.compile(r"status code: (\d{3}[A-Za-z ]*?)(?::|$)", re.MULTILINE)
_XML_FIELD = re.compile(r"<(Code|Message)>([^<]{0,300})</\1>")
_OS_MESSAGE = re.compile(r'message: \\?"([^"\\]{1,100})')
_CONNECT = re.compile(r'"(tcp connect error|dns error|[a-z ]*timed out[a-z ]*)"', re.IGNORECASE)
_RETRIES = re.compile(r"retries: (\d+),\s*max_retries: (\d+)")


def failure_detail(e: BaseException) -> str:
    """What ``-v`` shows of an obstore failure, never the query string, headers or the rest of the body.

    The request (method, URL without query or user info), the HTTP status, the store's error code
    and message, the connection failure and the retries (an Azure SAS token travels in the query).
    """
    text = str(e)
    parts: list[str] = [type(e).__name__]
    m = _REQUEST.search(text)
    if m is not None:
        try:
            u = urlsplit(m.group(2))
            host = u.hostname or ""
            port = f":{u.port}" if u.port else ""
            parts.append(f"{m.group(1)} {u.scheme}://{host}{port}{u.path}")
        except ValueError:
            parts.append(m.group(1))
    status = _STATUS_LINE.search(text)
    if status is not None:
        parts.append(f"HTTP {status.group(1).strip()}")
    fields = dict(_XML_FIELD.findall(text))
    if "Code" in fields:
        parts.append(f"{fields['Code']}: {fields.get('Message', '').strip()}".rstrip(": "))
    connect = _CONNECT.search(text)
    if connect is not None:
        os_message = _OS_MESSAGE.search(text)
        parts.append(connect.group(1) + (f": {os_message.group(1)}" if os_message else ""))
    retries = _RETRIES.search(text)
    if retries is not None:
        parts.append(f"{retries.group(1)} of {retries.group(2)} retries")
    if m is not None and m.group(3):
        parts.append(f"after {m.group(3)}")
    return ", ".join(parts)


def translate(e: Exception, op: str, uri: str) -> DeltaTailError:
    """The failure ``e`` of ``op`` (``read``, ``list``) on ``uri`` as deltatail's error, naming ``uri``.

    A missing object is a :class:`MissingFileError`; an invalid key a :class:`DeltaTailError`;
    anything else a :class:`StorageError`, transient where waiting may mend it, saying so when no
    credentials were found.
    """
    if isinstance(e, FileNotFoundError):  # obstore's NotFoundError is one
        return MissingFileError("file does not exist", file=uri)
    if isinstance(e, oe.InvalidPathError) or (isinstance(e, ValueError) and "parse path" in str(e)):
        return DeltaTailError(f"cannot {op}: not a valid object key (empty, '.' or '..' segments?)", file=uri)
    reason, transient = describe_failure(e)
    reason = _no_credentials(e, uri) or reason
    return StorageError(f"cannot {op}: {reason}", transient=transient, file=uri, detail=failure_detail(e))
