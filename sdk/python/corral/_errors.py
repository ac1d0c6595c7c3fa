"""Exceptions for the errors the daemon answers with.

The daemon answers a failed request with an HTTP status and a body
``{"error": {"code": "not_found", "message": "..."}}``; each code has an
exception class of its own here, all subclasses of :class:`CorralError`, so
callers catch kinds rather than compare strings.
"""

from __future__ import annotations

import json
from typing import Dict, Mapping, Optional, Type


class CorralError(Exception):
    """An error answered by the daemon, or a failure to reach it.

    Attributes:
        code: the API's machine-readable code, such as ``"not_found"``.
        message: the daemon's explanation.
        status: the HTTP status (200 for an error reported inside a
            stream, 0 when the daemon could not be reached).
        retry_after: seconds after which the same request may succeed, set
            on admission refusals (:class:`Busy`, :class:`ResourceExhausted`),
            else ``None``.
    """

    code = "internal"

    def __init__(self, message: str, *, status: int = 0, retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class InvalidArgument(CorralError):
    """The request is malformed or names an impossible value (400)."""

    code = "invalid_argument"


class NotFound(CorralError):
    """The sandbox, process, file or other object does not exist (404)."""

    code = "not_found"


class AlreadyExists(CorralError):
    """An object of that name already exists (409)."""

    code = "already_exists"


class FailedPrecondition(CorralError):
    """The object is in the wrong state for the request, such as exec on a
    paused sandbox (409)."""

    code = "failed_precondition"


class ResourceExhausted(CorralError):
    """A limit of the API key or the sandbox is reached (429);
    ``retry_after`` says when to try again when the limit is a rate."""

    code = "resource_exhausted"


class Busy(CorralError):
    """The daemon is at capacity (503); ``retry_after`` says when to try
    again."""

    code = "busy"


class Unavailable(CorralError):
    """The daemon, or the sandbox's agent, cannot be reached right now."""

    code = "unavailable"


class Unauthenticated(CorralError):
    """The API key is missing or wrong (401)."""

    code = "unauthenticated"


class PermissionDenied(CorralError):
    """The API key may not do this (403)."""

    code = "permission_denied"


class Unimplemented(CorralError):
    """The daemon or the sandbox's runtime lacks the ability asked for (API
    code ``not_implemented``, 501)."""

    code = "not_implemented"


class Internal(CorralError):
    """The daemon failed in a way it did not expect (500)."""

    code = "internal"


_BY_CODE: Dict[str, Type[CorralError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        ResourceExhausted,
        Busy,
        Unavailable,
        Unauthenticated,
        PermissionDenied,
        Unimplemented,
        Internal,
    )
}

# Codes of answers without an error body (a proxy's, say), by HTTP status.
_BY_STATUS = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "failed_precondition",
    429: "resource_exhausted",
    501: "not_implemented",
    502: "unavailable",
    503: "unavailable",
    504: "unavailable",
}


def error_for(code: str, message: str, *, status: int = 200, retry_after: Optional[float] = None) -> CorralError:
    """Returns the exception for an API error code; an unknown code keeps
    its name on a plain :class:`CorralError`."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = CorralError(message, status=status, retry_after=retry_after)
        err.code = code or "internal"
        return err
    return cls(message, status=status, retry_after=retry_after)


def error_from_detail(detail: Optional[Mapping[str, object]], fallback: str) -> CorralError:
    """Returns the exception an ``error`` object inside a stream describes."""
    if not isinstance(detail, Mapping):
        return Internal(fallback, status=200)
    return error_for(str(detail.get("code") or "internal"), str(detail.get("message") or fallback))


def error_from_response(status: int, body: bytes, retry_after_header: Optional[str]) -> CorralError:
    """Returns the exception for a non-2xx answer."""
    retry_after: Optional[float] = None
    if retry_after_header is not None:
        try:
            seconds = int(retry_after_header)
        except ValueError:
            seconds = -1
        if seconds >= 0:
            retry_after = float(seconds)
    try:
        doc = json.loads(body)
        detail = doc["error"]
        code, message = str(detail["code"]), str(detail.get("message", ""))
    except (ValueError, TypeError, KeyError):
        code = _BY_STATUS.get(status, "internal")
        message = body.decode("utf-8", "replace").strip() or f"HTTP {status}"
    if not code:
        code = _BY_STATUS.get(status, "internal")
    return error_for(code, message, status=status, retry_after=retry_after)
