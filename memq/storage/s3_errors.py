"""What went wrong in an S3 request made with obstore, in memq's retry vocabulary.

obstore raises few exception types (NotFound, PermissionDenied, Generic, ...) and keeps the
HTTP status, the S3 error code and the transport failure kind in its message. memq's retries
depend on them (503 SlowDown is retried and slows a prefix down, 403 is not retried), so they
are read back from the message here, in one place; the fault-proxy tests pin every case
against the real client (the version is pinned in pyproject for that reason).
"""

from __future__ import annotations

import re

import obstore.exceptions as ose

# Error codes S3 (and S3-compatible stores) use to ask a client to slow down.
THROTTLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                            "TooManyRequestsException", "RequestThrottled", "ServiceUnavailable"})
_TRANSIENT_CODES = frozenset({"RequestTimeout", "InternalError", "OperationAborted"})
RETRIABLE = frozenset({"throttle", "server_error", "timeout", "connection"})

_STATUS = re.compile(r"non-2xx status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_HTTP_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")


def classify(exc: BaseException) -> tuple[str, str] | None:
    """(reason, code) of an obstore failure, or None if it is not one (a bug: let it raise).

    reason is one of throttle, server_error, timeout, connection (all retried), not_found,
    client_error (never retried); code is S3's error code, else the HTTP status or failure kind.
    """
    if not isinstance(exc, (ose.BaseError, FileNotFoundError)):
        return None
    text = str(exc)
    status_m, code_m = _STATUS.search(text), _CODE.search(text)
    status = int(status_m[1]) if status_m else 0
    code = code_m[1] if code_m else (str(status) if status else "")
    if isinstance(exc, FileNotFoundError):   # obstore's NotFoundError: a 404, of a key or of the bucket
        return ("client_error", code) if code == "NoSuchBucket" else ("not_found", code or "NoSuchKey")
    if status:
        if code in THROTTLE_CODES or status in (429, 503):
            return "throttle", code
        if status >= 500 or code in _TRANSIENT_CODES:
            return "server_error", code
        return "client_error", code
    kind_m = _HTTP_KIND.search(text)
    if kind_m:
        kind = kind_m[1]
        return ("timeout" if kind == "Timeout" else "connection"), kind
    return "client_error", type(exc).__name__
