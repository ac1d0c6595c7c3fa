"""The values the API returns and takes, as dataclasses.

Unknown JSON fields are ignored, so a newer daemon's answers still decode;
fields the daemon leaves out take their defaults.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Type, TypeVar

T = TypeVar("T")


def parse_time(value: Any) -> Optional[_dt.datetime]:
    """Parses an RFC 3339 time as the daemon writes it (nanoseconds and a
    ``Z`` included), or returns ``None``."""
    if not isinstance(value, str) or not value:
        return None
    text = value.replace("Z", "+00:00")
    # fromisoformat before Python 3.11 takes at most 6 fractional digits.
    if "." in text:
        head, _, rest = text.partition(".")
        digits = 0
        while digits < len(rest) and rest[digits].isdigit():
            digits += 1
        text = head + "." + rest[:digits][:6].ljust(6, "0") + rest[digits:]
    try:
        return _dt.datetime.fromisoformat(text)
    except ValueError:
        return None


_TIME_FIELDS = {"created_at", "deadline", "started_at", "exited_at", "mod_time", "time", "ready_at", "retry_at"}


def from_json(cls: Type[T], data: Mapping[str, Any]) -> T:
    """Builds dataclass cls from a JSON object, converting time fields."""
    if not isinstance(data, Mapping):
        raise TypeError(f"expected a JSON object for {cls.__name__}, got {type(data).__name__}")
    kwargs: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name == "raw":
            kwargs["raw"] = dict(data)
            continue
        if f.name in data:
            value = data[f.name]
            if f.name in _TIME_FIELDS:
                value = parse_time(value)
            elif value is None and f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                value = f.default_factory()  # type: ignore[misc]
            kwargs[f.name] = value
    return cls(**kwargs)


@dataclass
class ExecResult:
    """How a command ended, with its output.

    ``exit_code`` is the exit status, or 128 + the signal's number when a
    signal ended the process (as a shell reports it).
    """

    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    pid: int = 0
    signal: str = ""
    oom_killed: bool = False
    timed_out: bool = False
    output_truncated: bool = False
    output_discarded: int = 0
    #: The raw bytes of the output, for output that is not text.
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.exit_code == 0


@dataclass
class OutputEvent:
    """One chunk of a process's output: ``stream`` is ``"stdout"`` or
    ``"stderr"``, ``offset`` the position of its first byte in all the
    process wrote (both streams together)."""

    stream: str
    data: bytes
    offset: int = 0

    @property
    def text(self) -> str:
        """The chunk decoded as UTF-8 (a character split across chunks
        shows as U+FFFD; join ``data`` to decode exactly)."""
        return self.data.decode("utf-8", "replace")


@dataclass
class ProcessInfo:
    """A process of a sandbox as the daemon describes it."""

    pid: int = 0
    cmd: List[str] = field(default_factory=list)
    cwd: str = ""
    user: str = ""
    tag: str = ""
    pty: bool = False
    background: bool = False
    running: bool = False
    started_at: Optional[_dt.datetime] = None
    exited_at: Optional[_dt.datetime] = None
    exit_code: Optional[int] = None
    signal: str = ""
    timed_out: bool = False
    output_bytes: int = 0


@dataclass
class FileInfo:
    """A file inside a sandbox or volume; ``type`` is ``"file"``, ``"dir"``,
    ``"symlink"`` or ``"other"``."""

    name: str = ""
    path: str = ""
    type: str = ""
    size: int = 0
    mode: int = 0
    mod_time: Optional[_dt.datetime] = None
    uid: int = 0
    gid: int = 0
    target: str = ""

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"


@dataclass
class WatchEvent:
    """A change under a watched directory: ``type`` is ``"create"``,
    ``"write"``, ``"remove"``, ``"rename"`` or ``"chmod"``; ``"overflow"``
    means events were lost and the caller should look again."""

    type: str = ""
    path: str = ""
    old_path: str = ""
    time: Optional[_dt.datetime] = None
    is_dir: bool = False


@dataclass
class Stats:
    """A sandbox's resource readings."""

    memory_bytes: int = 0
    cpu_usage_ns: int = 0
    pids: int = 0
    oom_kills: int = 0


@dataclass
class NetworkPolicy:
    """What a sandbox may reach; the daemon enforces it on the host.

    ``mode`` is ``"none"``, ``"allowlist"`` or ``"open"``. ``allow_domains``
    holds ``"NAME"`` or ``"NAME:PORT[,PORT...]"`` (NAME may start with
    ``"*."``); ``allow_cidrs`` holds ``"ADDRESS[/BITS][:PORT,...]"``.
    ``headers`` are dicts ``{"domain", "name", "value"}`` the proxy sets on
    plaintext HTTP requests; the daemon never returns their values.
    """

    mode: str = ""
    allow_domains: List[str] = field(default_factory=list)
    allow_cidrs: List[str] = field(default_factory=list)
    headers: List[Dict[str, str]] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if self.mode:
            out["mode"] = self.mode
        if self.allow_domains:
            out["allow_domains"] = list(self.allow_domains)
        if self.allow_cidrs:
            out["allow_cidrs"] = list(self.allow_cidrs)
        if self.headers:
            out["headers"] = [dict(h) for h in self.headers]
        return out


@dataclass
class Mount:
    """A host directory (``source``) or a volume (``volume``) a sandbox
    sees at ``target``; ``mode`` is ``"ro"``, ``"rw"`` (the default) or
    ``"cow"``."""

    target: str
    source: str = ""
    volume: str = ""
    mode: str = ""

    def to_json(self) -> Dict[str, str]:
        out = {"target": self.target}
        for key in ("source", "volume", "mode"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out


@dataclass
class Snapshot:
    """A saved sandbox; ``kind`` is ``"filesystem"`` or ``"memory"``."""

    name: str = ""
    kind: str = ""
    sandbox_id: str = ""
    template: str = ""
    runtime: str = ""
    cpus: float = 0
    memory_mb: int = 0
    pids: int = 0
    disk_mb: int = 0
    metadata: Dict[str, str] = field(default_factory=dict)
    created_at: Optional[_dt.datetime] = None
    size_bytes: int = 0


@dataclass
class Template:
    """A root file system sandboxes start from."""

    name: str = ""
    source: str = ""
    created_at: Optional[_dt.datetime] = None
    image: str = ""
    digest: str = ""
    #: An image's configuration (env, working_dir, user, entrypoint, cmd).
    defaults: Optional[Dict[str, Any]] = None
    #: The process every new sandbox of the template starts.
    service: Optional[Dict[str, Any]] = None
    #: Runtime -> snapshot that new sandboxes start from, service ready.
    ready_snapshots: Dict[str, str] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Pool:
    """A warm pool: ``size`` sandboxes of one shape kept ready to claim."""

    name: str = ""
    template: str = ""
    runtime: str = ""
    cpus: float = 0
    memory_mb: int = 0
    pids: int = 0
    disk_mb: int = 0
    network: str = ""
    size: int = 0
    ready: int = 0
    filling: int = 0
    error: str = ""
    retry_at: Optional[_dt.datetime] = None


@dataclass
class Volume:
    """A named directory with its own quota that sandboxes mount."""

    name: str = ""
    size_bytes: int = 0
    used_bytes: int = 0
    created_at: Optional[_dt.datetime] = None
    labels: Dict[str, str] = field(default_factory=dict)
    in_use_by: List[str] = field(default_factory=list)


@dataclass
class Event:
    """A lifecycle change of a sandbox (created, running, paused, resumed,
    deleted, error, timeout, stopped, started, oom_killed)."""

    type: str = ""
    time: Optional[_dt.datetime] = None
    sandbox_id: str = ""
    state: str = ""
    runtime: str = ""
    template: str = ""
    error: Optional[Dict[str, str]] = None


@dataclass
class CodeContext:
    """A code interpreter context: one kernel with its variables."""

    id: str = ""
    language: str = ""
    cwd: str = ""


@dataclass
class ExecutionError:
    """An error the executed code raised (not an exception of this
    library); ``name`` is ``"DeadKernelError"`` when the context's kernel
    died."""

    name: str = ""
    value: str = ""
    traceback: str = ""


_BINARY_FORMATS = ("png", "jpeg", "pdf")


@dataclass
class Result:
    """One rich result of a code execution: the value of the last
    expression (``is_main``) or a display such as a chart. Each field is
    one representation; ``png``, ``jpeg`` and ``pdf`` are decoded bytes."""

    is_main: bool = False
    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[bytes] = None
    jpeg: Optional[bytes] = None
    pdf: Optional[bytes] = None
    latex: Optional[str] = None
    json: Any = None
    javascript: Optional[str] = None
    #: A data frame as its columns (name -> values).
    data: Optional[Dict[str, Any]] = None
    #: A matplotlib figure's structure: type, title, elements, axes.
    chart: Optional[Dict[str, Any]] = None
    #: Other MIME types, by name.
    extra: Optional[Dict[str, Any]] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any], is_main: bool) -> "Result":
        r = from_json(cls, data)
        r.is_main = is_main
        for name in _BINARY_FORMATS:
            value = getattr(r, name)
            if isinstance(value, str):
                setattr(r, name, base64.b64decode(value))
        return r

    def formats(self) -> List[str]:
        """The names of the representations this result has."""
        return [f.name for f in dataclasses.fields(self) if f.name != "is_main" and getattr(self, f.name) is not None]


@dataclass
class Execution:
    """What one ``run_code`` call collected."""

    results: List[Result] = field(default_factory=list)
    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)
    #: Set when the code raised.
    error: Optional[ExecutionError] = None
    execution_count: int = 0
    timed_out: bool = False
    output_discarded: int = 0

    @property
    def text(self) -> str:
        """The text of the main result, ``""`` without one."""
        for r in self.results:
            if r.is_main:
                return r.text or ""
        return ""
