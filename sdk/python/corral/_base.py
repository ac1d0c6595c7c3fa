"""What the blocking and asyncio handles share besides I/O: their fields."""

from __future__ import annotations

import datetime as _dt
from typing import Any, Dict, List, Mapping, Optional

from ._errors import FailedPrecondition
from ._ops import sandbox_path
from ._types import Mount, NetworkPolicy, ProcessInfo, from_json, parse_time


class SandboxFields:
    """A sandbox's description as the daemon last reported it.

    ``state`` is one of creating, running, paused, stopping, stopped,
    starting, error, deleting. Fields refresh on every call that returns
    the sandbox (``pause``, ``resume``, ``refresh``, ...).
    """

    id: str
    template: str
    runtime: str
    state: str
    cpus: float
    memory_mb: int
    pids: int
    disk_mb: int
    metadata: Dict[str, str]
    created_at: Optional[_dt.datetime]
    #: When the sandbox ends (None: no deadline).
    deadline: Optional[_dt.datetime]
    error: str
    network: Optional[NetworkPolicy]
    mounts: List[Mount]
    idle_timeout: int
    on_deadline: str
    on_idle: str
    #: The daemon's whole answer, fields this library does not know
    #: included.
    raw: Dict[str, Any]
    # The client the sandbox handle belongs to (blocking or asyncio).
    _client: Any

    def _set(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping) or not data.get("id"):
            raise TypeError(f"not a sandbox description: {str(data)[:200]}")
        self.raw = dict(data)
        self.id = str(data["id"])
        self.template = data.get("template") or ""
        self.runtime = data.get("runtime") or ""
        self.state = data.get("state") or ""
        self.cpus = float(data.get("cpus") or 0)
        self.memory_mb = int(data.get("memory_mb") or 0)
        self.pids = int(data.get("pids") or 0)
        self.disk_mb = int(data.get("disk_mb") or 0)
        self.metadata = dict(data.get("metadata") or {})
        self.created_at = parse_time(data.get("created_at"))
        self.deadline = parse_time(data.get("deadline"))
        self.error = data.get("error") or ""
        net = data.get("network")
        self.network = from_json(NetworkPolicy, net) if isinstance(net, Mapping) else None
        self.mounts = [from_json(Mount, m) for m in data.get("mounts") or []]
        self.idle_timeout = int(data.get("idle_timeout") or 0)
        self.on_deadline = data.get("on_deadline") or ""
        self.on_idle = data.get("on_idle") or ""

    def port_url(self, port: int, path: str = "/") -> str:
        """The daemon URL that forwards HTTP to ``port`` inside the
        sandbox (send the client's API key with requests to it). It needs
        a client connected over TCP (``http(s)://``): a unix socket has no
        URL that other HTTP clients could use, so there it raises
        :class:`FailedPrecondition`. Makes no request (not a coroutine in
        the asyncio client either)."""
        ep = self._client._ep
        if ep.uds is not None:
            raise FailedPrecondition(
                f"port_url needs a client connected to the daemon over TCP (http:// or https://), not the unix socket {ep.uds}; "
                f"reach the port through the daemon's TCP address, or use exec inside the sandbox"
            )
        return ep.base_url + sandbox_path(self.id, f"/ports/{int(port)}/{path.lstrip('/')}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.template} {self.runtime} {self.state}>"


class ProcessFields:
    """A process's PID and its description as last read (``info``)."""

    sandbox_id: str
    info: ProcessInfo

    def _set_info(self, sandbox_id: str, info: Any) -> None:
        self.sandbox_id = sandbox_id
        self.info = info if isinstance(info, ProcessInfo) else from_json(ProcessInfo, info)

    @property
    def pid(self) -> int:
        return self.info.pid

    def __repr__(self) -> str:
        state = "running" if self.info.running else f"exited {self.info.exit_code}"
        return f"<{type(self).__name__} {self.pid} {self.info.cmd} {state}>"
