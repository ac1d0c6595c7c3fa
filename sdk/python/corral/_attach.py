"""Attach sessions: a process's output and stdin over a WebSocket.

The protocol (``GET /v1/sandboxes/{id}/processes/{pid}/attach``): the
server sends output as binary messages whose first byte names the stream
(1 stdout, 2 stderr) and events as JSON text messages (``start`` with the
bytes ``dropped`` before the requested offset, ``exit``, ``error``); the
client sends stdin as binary messages prefixed with byte 0 and control
messages as JSON text (``resize``, ``signal``, ``close_stdin``).

The asyncio session uses the ``websockets`` library. The blocking session
runs the same asyncio session on a private event loop thread that lives as
long as the session does, because the ``websockets`` releases that Debian
ships have no blocking client. The client used is the one websockets
offers as ``websockets.client`` up to release 13 (pyproject.toml bounds
the version).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Callable, Coroutine, Optional, TypeVar

import websockets
import websockets.client
import websockets.exceptions

from . import _errors
from ._host import CONNECT_TIMEOUT, Endpoint
from ._ops import ExecReader, process_path, to_bytes
from ._types import ExecResult, OutputEvent

T = TypeVar("T")

# Bounds one message from the server (an output chunk).
_MAX_MESSAGE = 16 << 20

_STDIN, _STDOUT, _STDERR = 0, 1, 2


async def _dial(ep: Endpoint, sandbox_id: str, pid: int, from_offset: int) -> Any:
    path = process_path(sandbox_id, pid, "/attach")
    if from_offset > 0:
        path += f"?from={int(from_offset)}"
    url, uds = ep.ws_url(path)
    headers = ep.headers()
    kwargs: Any = dict(
        extra_headers={k: v for k, v in headers.items() if k != "User-Agent"},
        user_agent_header=headers["User-Agent"],
        max_size=_MAX_MESSAGE,
        open_timeout=CONNECT_TIMEOUT,
        compression=None,
    )
    try:
        if uds is not None:
            return await websockets.client.unix_connect(uds, url, **kwargs)
        return await websockets.client.connect(url, **kwargs)
    except websockets.exceptions.InvalidStatusCode as e:
        # websockets keeps the status of a refused upgrade, not its body.
        status = e.status_code
        code = _errors._BY_STATUS.get(status, "internal")
        raise _errors.error_for(code, f"attaching to process {pid}: HTTP {status}", status=status) from e
    except (OSError, asyncio.TimeoutError, websockets.exceptions.WebSocketException) as e:
        raise _errors.Unavailable(f"corral daemon unreachable: {e}") from e


class AsyncAttachSession:
    """A live connection to a process: iterate it (``async for``) for
    :class:`OutputEvent` chunks until the process exits, send stdin with
    :meth:`send`, and read how it ended from :attr:`exit` or
    :meth:`wait`. Leaving (``close``) does not stop the process.

    Output replays what is still buffered from the offset asked for, then
    follows live output; :attr:`dropped` counts bytes before that offset
    that were no longer buffered.
    """

    def __init__(self, conn: Any, pid: int, from_offset: int) -> None:
        self._conn = conn
        self.pid = pid
        self.exit: Optional[ExecResult] = None
        self.dropped = 0
        self._offset = from_offset
        self._error: Optional[_errors.CorralError] = None

    @classmethod
    async def open(cls, ep: Endpoint, sandbox_id: str, pid: int, from_offset: int = 0) -> "AsyncAttachSession":
        return cls(await _dial(ep, sandbox_id, pid, from_offset), pid, from_offset)

    async def send(self, data: Any) -> None:
        """Writes data (str or bytes) to the process's stdin (for a
        terminal, as typed keys)."""
        await self._write(bytes([_STDIN]) + to_bytes(data))

    async def close_stdin(self) -> None:
        """Closes the process's stdin (on a terminal: sends ^D)."""
        await self._control({"type": "close_stdin"})

    async def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal size of a PTY process."""
        await self._control({"type": "resize", "cols": int(cols), "rows": int(rows)})

    async def signal(self, signal: str) -> None:
        """Sends a signal (``"SIGINT"``, ``"INT"`` or ``"2"``) to the
        process's group."""
        await self._control({"type": "signal", "signal": str(signal)})

    async def kill(self) -> None:
        """Sends SIGKILL to the process's group."""
        await self.signal("SIGKILL")

    async def _control(self, msg: Any) -> None:
        await self._write(json.dumps(msg))

    async def _write(self, msg: Any) -> None:
        try:
            await self._conn.send(msg)
        except websockets.exceptions.ConnectionClosed as e:
            raise _errors.Unavailable(f"attach connection closed: {e}") from e

    def __aiter__(self) -> "AsyncAttachSession":
        return self

    async def __anext__(self) -> OutputEvent:
        while True:
            try:
                msg = await self._conn.recv()
            except websockets.exceptions.ConnectionClosed as e:
                if self.exit is not None:
                    raise StopAsyncIteration
                if self._error is not None:
                    raise self._error
                raise _errors.Unavailable(f"attach connection lost: {e}") from e
            if isinstance(msg, bytes):
                if not msg:
                    continue
                ev = OutputEvent("stderr" if msg[0] == _STDERR else "stdout", msg[1:], self._offset)
                self._offset += len(ev.data)
                return ev
            self._event(json.loads(msg))

    def _event(self, ev: Any) -> None:
        typ = ev.get("type")
        if typ == "start":
            self.dropped = int(ev.get("dropped") or 0)
            self._offset += self.dropped
        elif typ == "exit":
            self.exit = ExecResult(
                exit_code=int(ev.get("exit_code") or 0),
                pid=self.pid,
                signal=ev.get("signal") or "",
                timed_out=bool(ev.get("timed_out")),
            )
        elif typ == "error":
            # The session survives a refused resize or signal; an error
            # followed by the server closing explains the close.
            self._error = _errors.error_from_detail(ev.get("error"), "attach failed without a reason")

    async def wait(
        self, on_stdout: Optional[Callable[[str], Any]] = None, on_stderr: Optional[Callable[[str], Any]] = None
    ) -> ExecResult:
        """Reads the output until the process exits and returns how it
        ended, with the output read here (not what earlier iteration
        consumed)."""
        reader = ExecReader(on_stdout, on_stderr)
        async for ev in self:
            cb = reader.out[ev.stream].add(ev.data)
            if cb is not None:
                r = cb.fn(cb.arg)
                if asyncio.iscoroutine(r):
                    await r
        assert self.exit is not None
        reader.exit, reader.pid = self.exit, self.pid
        return reader.result()

    async def close(self) -> None:
        """Leaves the session; the process keeps running."""
        await self._conn.close()

    async def __aenter__(self) -> "AsyncAttachSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class _LoopThread:
    """An event loop on a thread of its own, for one blocking session."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="corral-attach", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class AttachSession:
    """The blocking twin of :class:`AsyncAttachSession`: iterate it for
    :class:`OutputEvent` chunks; :meth:`send`, :meth:`resize`,
    :meth:`signal` may be called from another thread while one iterates.
    Close it (or use ``with``) to free its connection and thread."""

    def __init__(self, ep: Endpoint, sandbox_id: str, pid: int, from_offset: int = 0) -> None:
        self._lt = _LoopThread()
        try:
            self._s = self._lt.run(AsyncAttachSession.open(ep, sandbox_id, pid, from_offset))
        except BaseException:
            self._lt.stop()
            raise
        self._closed = False

    @property
    def pid(self) -> int:
        return self._s.pid

    @property
    def exit(self) -> Optional[ExecResult]:
        """How the process ended, once the session saw its exit."""
        return self._s.exit

    @property
    def dropped(self) -> int:
        return self._s.dropped

    def send(self, data: Any) -> None:
        """Writes data (str or bytes) to the process's stdin."""
        self._lt.run(self._s.send(data))

    def close_stdin(self) -> None:
        """Closes the process's stdin (on a terminal: sends ^D)."""
        self._lt.run(self._s.close_stdin())

    def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal size of a PTY process."""
        self._lt.run(self._s.resize(cols, rows))

    def signal(self, signal: str) -> None:
        """Sends a signal to the process's group."""
        self._lt.run(self._s.signal(signal))

    def kill(self) -> None:
        """Sends SIGKILL to the process's group."""
        self._lt.run(self._s.kill())

    def __iter__(self) -> "AttachSession":
        return self

    def __next__(self) -> OutputEvent:
        try:
            return self._lt.run(self._s.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def wait(
        self, on_stdout: Optional[Callable[[str], Any]] = None, on_stderr: Optional[Callable[[str], Any]] = None
    ) -> ExecResult:
        """Reads the output until the process exits (calling the callbacks
        on this thread) and returns how it ended, with that output."""
        reader = ExecReader(on_stdout, on_stderr)
        for ev in self:
            cb = reader.out[ev.stream].add(ev.data)
            if cb is not None:
                cb.fn(cb.arg)
        assert self.exit is not None
        reader.exit, reader.pid = self.exit, self.pid
        return reader.result()

    def close(self) -> None:
        """Leaves the session; the process keeps running."""
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._s.close())
        finally:
            self._lt.stop()

    def __enter__(self) -> "AttachSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
