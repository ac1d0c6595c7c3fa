"""What both clients put on the wire and take off it, below the API:
requests for httpx's transports, and the lines of NDJSON streams.

The clients call httpx's transports directly rather than through
``httpx.Client``: they need none of its redirects, cookies or auth flows,
and each of those layers costs CPU on every exec round trip, which
docs/BENCHMARKS.md compares with the Go SDK's.
"""

from __future__ import annotations

import json
from typing import Any, List, Optional
from urllib.parse import urlencode

import httpx

from . import _errors
from ._host import CONNECT_TIMEOUT, Endpoint
from ._ops import Request

# A stream (exec, output, watch) may be quiet for as long as its process
# is, so only connecting is bounded.
_TIMEOUTS = {"connect": CONNECT_TIMEOUT, "read": None, "write": None, "pool": None}


def http_request(ep: Endpoint, headers: dict, req: Request, content: Any) -> httpx.Request:
    """The httpx request for req; content is req.content made ready for
    the transport (bytes, or an iterator of chunks of the right kind)."""
    url = ep.base_url + req.path
    if req.params:
        url += "?" + urlencode(req.params)
    h = dict(headers)
    if req.body is not None:
        content = json.dumps(req.body).encode("utf-8")
        h["Content-Type"] = "application/json"
    elif req.content_type:
        h["Content-Type"] = req.content_type
    if isinstance(content, str):
        content = content.encode("utf-8")
    return httpx.Request(req.method, url, headers=h, content=content, extensions={"timeout": _TIMEOUTS})


def event(line: bytes) -> Any:
    """The value of one line of an NDJSON stream; a line that is not JSON
    raises Internal."""
    try:
        return json.loads(line)
    except ValueError as e:
        raise _errors.Internal(f"the daemon's stream sent a line that is not JSON ({e}): {line[:200]!r}") from e


class LineBuffer:
    """Splits a byte stream into its non-empty lines without copying a
    long line once per chunk."""

    def __init__(self) -> None:
        self._parts: List[bytes] = []

    def feed(self, chunk: bytes) -> List[bytes]:
        lines = []
        start = 0
        while True:
            i = chunk.find(b"\n", start)
            if i < 0:
                break
            self._parts.append(chunk[start:i])
            line = b"".join(self._parts)
            self._parts = []
            if line.strip():
                lines.append(line)
            start = i + 1
        if start < len(chunk):
            self._parts.append(chunk[start:])
        return lines

    def rest(self) -> Optional[bytes]:
        """What followed the last newline, if anything."""
        line = b"".join(self._parts)
        self._parts = []
        return line if line.strip() else None
