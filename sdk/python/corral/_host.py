"""Where the daemon is, and the settings every connection shares."""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple
from urllib.parse import urlsplit

#: Where the daemon listens unless told otherwise.
DEFAULT_HOST = "unix:///run/corral/corral.sock"

# A stream (exec, output, watch) may be quiet for as long as its process
# is, so reads wait without limit; only connecting is bounded.
CONNECT_TIMEOUT = 10.0


class Endpoint:
    """A parsed daemon address: ``unix:///path.sock`` or
    ``http(s)://host:port[/prefix]``."""

    def __init__(self, host: Optional[str], api_key: Optional[str]) -> None:
        host = host if host is not None else os.environ.get("CORRAL_HOST") or DEFAULT_HOST
        if api_key is None:
            api_key = os.environ.get("CORRAL_API_KEY") or None
        self.host = host
        self.api_key = api_key
        self.uds: Optional[str] = None
        if host.startswith("unix://"):
            path = host[len("unix://") :]
            if not path:
                raise ValueError(f"corral host {host!r} has no socket path")
            self.uds = path
            self.base_url = "http://corral"
        elif host.startswith(("http://", "https://")):
            parts = urlsplit(host)
            if not parts.hostname:
                raise ValueError(f"corral host {host!r} has no host name")
            self.base_url = f"{parts.scheme}://{parts.netloc}{parts.path}".rstrip("/")
        else:
            raise ValueError(f"corral host {host!r} must start with unix://, http:// or https://")

    def headers(self) -> Dict[str, str]:
        h = {"User-Agent": "corral-python"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        return h

    def ws_url(self, path: str) -> Tuple[str, Optional[str]]:
        """The WebSocket URL of an API path, and the unix socket to dial
        (``None`` over TCP)."""
        if self.base_url.startswith("https://"):
            return "wss://" + self.base_url[len("https://") :] + path, self.uds
        return "ws://" + self.base_url[len("http://") :] + path, self.uds
