"""The API's requests and stream readers, without any I/O.

The blocking :class:`corral.Client` and the asyncio :class:`corral.AsyncClient`
build the same :class:`Request` values here and feed the same stream
readers, so the two differ only in how bytes move.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import json
import math
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from . import _errors
from ._types import (
    CodeContext,
    Template,
    Event,
    ExecResult,
    Execution,
    ExecutionError,
    FileInfo,
    Mount,
    NetworkPolicy,
    OutputEvent,
    Result,
    WatchEvent,
    from_json,
)

#: Passed as ``timeout`` to create a sandbox without a deadline (where the
#: daemon allows it); ``None`` takes the daemon's default.
NO_TIMEOUT = 0

Command = Union[str, Sequence[str]]
Params = List[Tuple[str, str]]


class Request:
    """One HTTP request of the API.

    ``body`` is JSON to send (``None``: no JSON body) and ``content`` raw
    bytes (or chunks) with ``content_type``. ``parse`` turns the decoded
    JSON answer (or, with ``raw=True``, the answer's bytes) into the value
    the caller returns.
    """

    __slots__ = ("method", "path", "params", "body", "content", "content_type", "parse", "raw")

    def __init__(
        self,
        method: str,
        path: str,
        *,
        params: Optional[Params] = None,
        body: Any = None,
        content: Any = None,
        content_type: str = "",
        parse: Optional[Callable[[Any], Any]] = None,
        raw: bool = False,
    ) -> None:
        self.method = method
        self.path = path
        self.params = params or []
        self.body = body
        self.content = content
        self.content_type = content_type
        self.parse = parse
        self.raw = raw



def answer(req: Request, content: bytes) -> Any:
    """The value of a request's answer body."""
    if req.parse is None:
        return None
    if req.raw:
        return req.parse(content)
    try:
        payload = json.loads(content)
    except ValueError as e:
        raise _errors.Internal(f"decoding the answer to {req.method} {req.path}: {e}") from e
    return req.parse(payload)


def run_request(
    template: Optional[str],
    runtime: Optional[str],
    cpus: Optional[float],
    memory_mb: Optional[int],
    disk_mb: Optional[int],
    network: Any,
    metadata: Optional[Mapping[str, str]],
    env: Optional[Mapping[str, str]],
    cmd: Command,
    cwd: Optional[str],
    user: Optional[str],
    stdin: Union[None, str, bytes],
    timeout: Optional[float],
) -> Request:
    """POST /v1/run: a sandbox, one command, and its removal after."""
    body = {
        "sandbox": create_body(template, runtime, cpus, memory_mb, None, disk_mb, None, env, metadata, network),
        "exec": exec_body(cmd, None, cwd, user, stdin, timeout),
        "remove": True,
    }
    return Request("POST", "/v1/run", body=body)


def seg(value: Union[str, int]) -> str:
    """Escapes one path segment."""
    text = str(value)
    if not text:
        raise ValueError("an empty name or ID cannot name an API object")
    return quote(text, safe="")


def sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    return "/v1/sandboxes/" + seg(sandbox_id) + suffix


def process_path(sandbox_id: str, pid: int, suffix: str = "") -> str:
    return sandbox_path(sandbox_id, "/processes/" + seg(int(pid)) + suffix)


def whole_seconds(seconds: float) -> int:
    """Rounds away from zero, so that a small negative timeout stays
    negative (and is refused) instead of becoming 0, which means none."""
    if seconds > 0:
        return int(math.ceil(seconds))
    return -int(math.ceil(-seconds))


def millis(seconds: Optional[float]) -> int:
    if seconds is None:
        return 0
    if seconds < 0:
        raise ValueError(f"timeout {seconds!r} is negative")
    return int(seconds * 1000)


def _str_map(name: str, value: Optional[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping of strings to strings, not {type(value).__name__}")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{name} must map strings to strings; {k!r}: {v!r} is not")
        out[k] = v
    return out


def _prune(d: Dict[str, Any]) -> Dict[str, Any]:
    """Leaves out unset fields, as the Go SDK's omitempty does."""
    return {k: v for k, v in d.items() if v not in (None, "", 0, [], {})}


def network_json(network: Union[None, str, NetworkPolicy, Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """A network policy from a mode name, a NetworkPolicy or a dict."""
    if network is None:
        return None
    if isinstance(network, str):
        return {"mode": network}
    if isinstance(network, NetworkPolicy):
        return network.to_json()
    if isinstance(network, Mapping):
        return dict(network)
    raise TypeError(f"network must be a mode name, a NetworkPolicy or a dict, not {type(network).__name__}")


def mounts_json(
    volumes: Optional[Mapping[str, Any]], mounts: Optional[Sequence[Union[Mount, Mapping[str, str]]]]
) -> Optional[List[Dict[str, str]]]:
    out: List[Dict[str, str]] = []
    for m in mounts or []:
        out.append(m.to_json() if isinstance(m, Mount) else dict(m))
    if volumes is not None:
        if not isinstance(volumes, Mapping):
            raise TypeError("volumes must map a target path in the sandbox to a volume (its name or a Volume)")
        for target, vol in volumes.items():
            name = vol if isinstance(vol, str) else getattr(vol, "name", None)
            if not isinstance(name, str) or not name:
                raise TypeError(f"volume for {target!r} must be a volume's name or a Volume, not {vol!r}")
            out.append({"target": target, "volume": name})
    return out or None


def create_body(
    template: Optional[str] = None,
    runtime: Optional[str] = None,
    cpus: Optional[float] = None,
    memory_mb: Optional[int] = None,
    pids: Optional[int] = None,
    disk_mb: Optional[int] = None,
    timeout: Optional[float] = None,
    env: Optional[Mapping[str, str]] = None,
    metadata: Optional[Mapping[str, str]] = None,
    network: Any = None,
    volumes: Optional[Mapping[str, Any]] = None,
    mounts: Any = None,
    pool: Optional[str] = None,
    idle_timeout: Optional[float] = None,
    on_deadline: Optional[str] = None,
    on_idle: Optional[str] = None,
    from_snapshot: Optional[str] = None,
) -> Dict[str, Any]:
    body = _prune(
        {
            "template": template,
            "runtime": runtime,
            "cpus": cpus,
            "memory_mb": memory_mb,
            "pids": pids,
            "disk_mb": disk_mb,
            "env": _str_map("env", env),
            "metadata": _str_map("metadata", metadata),
            "network": network_json(network),
            "mounts": mounts_json(volumes, mounts),
            "pool": pool,
            "idle_timeout": whole_seconds(idle_timeout) if idle_timeout else None,
            "on_deadline": on_deadline,
            "on_idle": on_idle,
            "from_snapshot": from_snapshot,
        }
    )
    if timeout is not None:
        body["timeout"] = whole_seconds(timeout)
    return body


def command_fields(cmd: Command) -> Dict[str, Any]:
    """``{"cmd": [...]}`` for a list, ``{"shell": "..."}`` for a string."""
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ValueError("the command is empty")
        return {"shell": cmd}
    if isinstance(cmd, (bytes, bytearray)):
        raise TypeError("the command must be a string (run by the shell) or a list of strings, not bytes")
    args = list(cmd)
    if not args:
        raise ValueError("the command is empty")
    for a in args:
        if not isinstance(a, str):
            raise TypeError(f"command arguments must be strings; {a!r} is not")
    return {"cmd": args}


def to_bytes(data: Union[bytes, bytearray, memoryview, str]) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"expected str or bytes, not {type(data).__name__}")


def exec_body(
    cmd: Command,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    stdin: Union[None, str, bytes] = None,
    timeout: Optional[float] = None,
    max_output_bytes: Optional[int] = None,
) -> Dict[str, Any]:
    body = command_fields(cmd)
    body.update(
        _prune(
            {
                "env": _str_map("env", env),
                "cwd": cwd,
                "user": user,
                "stdin": base64.b64encode(to_bytes(stdin)).decode("ascii") if stdin else None,
                "timeout_ms": millis(timeout),
                "max_output_bytes": max_output_bytes,
            }
        )
    )
    return body


# ---- stream readers ----------------------------------------------------
#
# A reader takes the stream's events (decoded JSON lines) one by one with
# feed(), which returns either nothing, a Callback for the driver to call,
# or an item for the driver to yield; `finished` tells the driver to stop
# reading, and result() gives the call's answer once the stream ended.


class Callback:
    """A user callback to invoke with one argument (awaited when the
    callback is a coroutine function and the client is async), followed
    by ``then`` when one event calls several."""

    __slots__ = ("fn", "arg", "then")

    def __init__(self, fn: Callable[[Any], Any], arg: Any, then: Optional["Callback"] = None) -> None:
        self.fn = fn
        self.arg = arg
        self.then = then


def chain(first: Optional[Callback], second: Optional[Callback]) -> Optional[Callback]:
    """first, then second (either may be None)."""
    if first is None:
        return second
    last = first
    while last.then is not None:
        last = last.then
    last.then = second
    return first


def invoke(cb: Optional[Callback]) -> None:
    """Calls cb and the callbacks chained to it (the blocking drivers)."""
    while cb is not None:
        cb.fn(cb.arg)
        cb = cb.then


async def ainvoke(cb: Optional[Callback]) -> None:
    """Calls cb and the callbacks chained to it, awaiting those that are
    coroutine functions (the asyncio drivers)."""
    while cb is not None:
        r = cb.fn(cb.arg)
        if asyncio.iscoroutine(r):
            await r
        cb = cb.then


def event_bytes(ev: Mapping[str, Any]) -> bytes:
    """The output an output event carries: ``text`` when it was valid
    UTF-8, else base64 ``data``."""
    text = ev.get("text")
    if text:
        return str(text).encode("utf-8")
    data = ev.get("data")
    return base64.b64decode(data) if data else b""


def exit_result(ev: Mapping[str, Any], pid: int) -> ExecResult:
    return ExecResult(
        exit_code=int(ev.get("exit_code") or 0),
        pid=pid,
        signal=ev.get("signal") or "",
        oom_killed=bool(ev.get("oom_killed")),
        timed_out=bool(ev.get("timed_out")),
        output_truncated=bool(ev.get("output_truncated")),
        output_discarded=int(ev.get("output_discarded") or 0),
    )


class _Output:
    """Collects one stream's bytes and decodes them for callbacks without
    splitting characters."""

    def __init__(self, callback: Optional[Callable[[str], Any]]) -> None:
        self.callback = callback
        self.chunks: List[bytes] = []
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, data: bytes) -> Optional[Callback]:
        self.chunks.append(data)
        if self.callback is None:
            return None
        text = self.decoder.decode(data)
        return Callback(self.callback, text) if text else None

    def flush(self) -> Optional[Callback]:
        """The callback with an incomplete character left at the end of
        the stream (decoded as U+FFFD), so that the callback text joined
        equals the decoded output."""
        if self.callback is None:
            return None
        text = self.decoder.decode(b"", final=True)
        return Callback(self.callback, text) if text else None

    def value(self) -> bytes:
        return b"".join(self.chunks)


class ExecReader:
    """Reads an exec stream (start, stdout, stderr, exit or error)."""

    def __init__(self, on_stdout: Optional[Callable[[str], Any]], on_stderr: Optional[Callable[[str], Any]]) -> None:
        self.out = {"stdout": _Output(on_stdout), "stderr": _Output(on_stderr)}
        self.pid = 0
        self.exit: Optional[ExecResult] = None
        self.finished = False

    def feed(self, ev: Mapping[str, Any]) -> Optional[Callback]:
        typ = ev.get("type")
        if typ == "start":
            self.pid = int(ev.get("pid") or 0)
        elif typ in ("stdout", "stderr"):
            return self.out[typ].add(event_bytes(ev))
        elif typ == "exit":
            self.exit = exit_result(ev, self.pid)
            self.finished = True
            return self.flush()
        elif typ == "error":
            raise _errors.error_from_detail(ev.get("error"), "stream failed without a reason")
        return None

    def flush(self) -> Optional[Callback]:
        """The callbacks with what the decoders hold at the end."""
        return chain(self.out["stdout"].flush(), self.out["stderr"].flush())

    def result(self) -> ExecResult:
        if self.exit is None:
            raise _errors.Unavailable("exec stream ended without an exit status")
        res = self.exit
        res.stdout_bytes, res.stderr_bytes = self.out["stdout"].value(), self.out["stderr"].value()
        res.stdout = res.stdout_bytes.decode("utf-8", "replace")
        res.stderr = res.stderr_bytes.decode("utf-8", "replace")
        return res


class RunReader:
    """Reads the stream of POST /v1/run: the sandbox, the command's exec
    events, then (with remove) the end of the sandbox, reported only when
    deleting it failed."""

    def __init__(self, on_stdout: Optional[Callable[[str], Any]], on_stderr: Optional[Callable[[str], Any]]) -> None:
        self.exec = ExecReader(on_stdout, on_stderr)
        self.sandbox: Optional[Dict[str, Any]] = None
        self.errors: List[_errors.CorralError] = []
        self.finished = False

    def feed(self, ev: Mapping[str, Any]) -> Optional[Callback]:
        if self.sandbox is None:
            if ev.get("type") != "sandbox" or not isinstance(ev.get("sandbox"), Mapping):
                raise _errors.Internal(f"run stream: the first event is not the sandbox: {str(ev)[:200]}")
            self.sandbox = dict(ev["sandbox"])
            return None
        if self.exec.finished:
            if ev.get("type") == "error":
                self.errors.append(_errors.error_from_detail(ev.get("error"), "deleting the sandbox failed"))
            return None
        return self.exec.feed(ev)

    def result(self) -> ExecResult:
        if self.sandbox is None:
            raise _errors.Unavailable("run stream ended before the sandbox event")
        res = self.exec.result()
        if self.errors:
            raise self.errors[0]
        return res


class OutputReader:
    """Reads a process's output stream; yields OutputEvents and keeps
    where to continue (``next_offset``), what was lost (``dropped``) and
    the exit (``exit``, ``None`` while the process runs)."""

    def __init__(self, pid: int, start: int, follow: bool) -> None:
        self.pid = pid
        self.start = start
        self.follow = follow
        self.next_offset = start
        self.dropped = 0
        self.exit: Optional[ExecResult] = None
        self.finished = False

    def feed(self, ev: Mapping[str, Any]) -> Optional[OutputEvent]:
        typ = ev.get("type")
        if typ == "start":
            self.dropped = int(ev.get("dropped") or 0)
            self.next_offset = max(self.next_offset, self.start + self.dropped)
        elif typ in ("stdout", "stderr"):
            data = event_bytes(ev)
            offset = int(ev.get("offset") or 0)
            self.dropped += int(ev.get("dropped") or 0)
            self.next_offset = offset + len(data)
            return OutputEvent(stream=str(typ), data=data, offset=offset)
        elif typ == "exit":
            self.exit = exit_result(ev, self.pid)
            self.finished = True
        elif typ == "error":
            raise _errors.error_from_detail(ev.get("error"), "output stream failed without a reason")
        return None

    def end(self) -> None:
        if self.follow and self.exit is None:
            raise _errors.Unavailable("output stream ended before the process exited")


class WaitReader:
    """Follows a process's output to its exit and collects it, as
    :class:`ExecReader` collects an exec's."""

    def __init__(self, pid: int, on_stdout: Optional[Callable[[str], Any]], on_stderr: Optional[Callable[[str], Any]]) -> None:
        self.output = OutputReader(pid, 0, True)
        self.exec = ExecReader(on_stdout, on_stderr)
        self.finished = False

    def feed(self, ev: Mapping[str, Any]) -> Optional[Callback]:
        item = self.output.feed(ev)
        self.finished = self.output.finished
        if item is not None:
            return self.exec.out[item.stream].add(item.data)
        if self.finished:
            return self.exec.flush()
        return None

    def result(self) -> ExecResult:
        self.output.end()
        self.exec.exit = self.output.exit
        return self.exec.result()


class CodeReader:
    """Reads a code interpreter stream into an Execution."""

    def __init__(
        self,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        on_result: Optional[Callable[[Result], Any]] = None,
        on_error: Optional[Callable[[ExecutionError], Any]] = None,
    ) -> None:
        self.x = Execution()
        self.cb = {"stdout": on_stdout, "stderr": on_stderr, "result": on_result, "exception": on_error}
        self.finished = False

    def feed(self, ev: Mapping[str, Any]) -> Optional[Callback]:
        typ = ev.get("type")
        arg: Any = None
        if typ in ("stdout", "stderr"):
            arg = str(ev.get("text") or "")
            (self.x.stdout if typ == "stdout" else self.x.stderr).append(arg)
        elif typ == "result":
            arg = Result.from_json(ev.get("result") or {}, bool(ev.get("main")))
            self.x.results.append(arg)
        elif typ == "exception":
            if isinstance(ev.get("exception"), Mapping):
                arg = from_json(ExecutionError, ev["exception"])
                self.x.error = arg
        elif typ == "end":
            self.x.execution_count = int(ev.get("execution_count") or 0)
            self.x.timed_out = bool(ev.get("timed_out"))
            self.x.output_discarded = int(ev.get("output_discarded") or 0)
            self.finished = True
        elif typ == "error":
            raise _errors.error_from_detail(ev.get("error"), "code stream failed")
        fn = self.cb.get(str(typ))
        if fn is not None and arg is not None:
            return Callback(fn, arg)
        return None

    def result(self) -> Execution:
        if not self.finished:
            raise _errors.Unavailable("code stream ended before the execution did")
        return self.x


class BuildReader:
    """Reads a template build or pull stream: log lines, progress, then
    the template."""

    def __init__(self, on_log: Optional[Callable[[str], Any]], on_progress: Optional[Callable[[Dict[str, Any]], Any]]) -> None:
        self.cb = {"log": on_log, "progress": on_progress}
        self.template: Optional[Template] = None
        self.finished = False

    def feed(self, ev: Mapping[str, Any]) -> Optional[Callback]:
        typ = ev.get("type")
        if typ == "done" and isinstance(ev.get("template"), Mapping):
            self.template = from_json(Template, ev["template"])
            self.finished = True
        elif typ == "error":
            raise _errors.error_from_detail(ev.get("error"), "build failed")
        fn = self.cb.get(str(typ))
        arg = ev.get("text") if typ == "log" else ev.get("progress")
        if fn is not None and arg is not None:
            return Callback(fn, arg)
        return None

    def result(self) -> Template:
        if self.template is None:
            raise _errors.Unavailable("build stream ended without a result")
        return self.template


class WatchReader:
    """Reads a watch stream; yields WatchEvents."""

    finished = False

    def end(self) -> None:
        pass

    def feed(self, ev: Mapping[str, Any]) -> Optional[WatchEvent]:
        if ev.get("type") == "error":
            raise _errors.error_from_detail(ev.get("error"), "watch failed without a reason")
        return from_json(WatchEvent, ev)


class EventReader:
    """Reads the lifecycle event stream; yields Events. An error event
    without a sandbox ends the stream (the client fell too far behind)."""

    finished = False

    def end(self) -> None:
        pass

    def feed(self, ev: Mapping[str, Any]) -> Optional[Event]:
        if ev.get("type") == "error" and not ev.get("sandbox_id"):
            raise _errors.error_from_detail(ev.get("error"), "event stream ended without a reason")
        return from_json(Event, ev)


# ---- requests shared by both clients ------------------------------------


class FileOps:
    """The file requests of a sandbox (``/v1/sandboxes/ID/files``) or a
    volume (``/v1/volumes/NAME/files``): both share their shapes."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def read(self, path: str) -> Request:
        return Request("GET", self.prefix, params=[("path", path)], raw=True, parse=lambda b: b)

    def write(self, path: str, content: Any, mode: Optional[int]) -> Request:
        params = [("path", path)]
        if mode is not None:
            if not isinstance(mode, int) or mode < 0 or mode > 0o7777:
                raise ValueError(f"mode {mode!r} is not a permission mode such as 0o644")
            params.append(("mode", format(mode, "o")))
        return Request(
            "PUT", self.prefix, params=params, content=content, content_type="application/octet-stream", parse=_file_info
        )

    def stat(self, path: str) -> Request:
        return Request("GET", self.prefix + "/stat", params=[("path", path)], parse=_file_info)

    def list(self, path: str) -> Request:
        return Request("GET", self.prefix + "/list", params=[("path", path)], parse=_file_infos)

    def mkdir(self, path: str, parents: bool) -> Request:
        return Request("POST", self.prefix + "/mkdir", body={"path": path, "parents": parents}, parse=_file_info)

    def remove(self, path: str, recursive: bool) -> Request:
        params = [("path", path)]
        if recursive:
            params.append(("recursive", "true"))
        return Request("DELETE", self.prefix, params=params)

    def rename(self, src: str, dst: str) -> Request:
        return Request("POST", self.prefix + "/rename", body={"from": src, "to": dst}, parse=_file_info)

    def put_archive(self, remote_dir: str, content: Any) -> Request:
        return Request(
            "PUT", self.prefix + "/archive", params=[("path", remote_dir)], content=content, content_type="application/x-tar"
        )

    def get_archive(self, remote_path: str) -> Request:
        return Request("GET", self.prefix + "/archive", params=[("path", remote_path)])

    def watch(self, path: str, recursive: bool) -> Request:
        params = [("path", path)]
        if recursive:
            params.append(("recursive", "true"))
        return Request("GET", self.prefix + "/watch", params=params)


def _file_info(d: Any) -> FileInfo:
    return from_json(FileInfo, d)


def _file_infos(d: Any) -> List[FileInfo]:
    return [from_json(FileInfo, x) for x in d or []]


def list_of(cls: Any) -> Callable[[Any], List[Any]]:
    return lambda d: [from_json(cls, x) for x in d or []]


def one(cls: Any) -> Callable[[Any], Any]:
    return lambda d: from_json(cls, d)


def code_body(
    code: str,
    language: Optional[str],
    context: Union[None, str, CodeContext],
    env: Optional[Mapping[str, str]],
    timeout: Optional[float],
    max_output_bytes: Optional[int],
) -> Dict[str, Any]:
    if not isinstance(code, str):
        raise TypeError(f"code must be a string, not {type(code).__name__}")
    ctx_id = context.id if isinstance(context, CodeContext) else context
    body: Dict[str, Any] = {"code": code}
    if ctx_id:
        body["context_id"] = ctx_id
    elif language:
        body["language"] = language
    body.update(_prune({"env": _str_map("env", env), "timeout_ms": millis(timeout), "max_output_bytes": max_output_bytes}))
    return body


def chunks(data: Any, size: int = 256 << 10) -> Iterable[bytes]:
    """Bytes or a binary file object as chunks to send."""
    if isinstance(data, (str, bytes, bytearray, memoryview)):
        yield to_bytes(data)
        return
    read = getattr(data, "read", None)
    if read is None:
        if hasattr(data, "__iter__"):  # chunks already
            for chunk in data:
                yield to_bytes(chunk)
            return
        raise TypeError(f"data must be str, bytes or a binary file object, not {type(data).__name__}")
    while True:
        chunk = read(size)
        if not chunk:
            return
        if isinstance(chunk, str):
            raise TypeError("the file object must be opened in binary mode")
        yield chunk
