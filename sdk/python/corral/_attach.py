"""Attach sessions: a process's output and stdin over a WebSocket.

The protocol (``GET /v1/sandboxes/{id}/processes/{pid}/attach``): the
server sends output as binary messages whose first byte names the stream
(1 stdout, 2 stderr) and events as JSON text messages (``start`` with the
bytes ``dropped`` before the requested offset, ``exit``, ``error``); the
client sends stdin as binary messages prefixed with byte 0 and control
messages as JSON text (``resize``, ``signal``, ``close_stdin``). The
server reads messages of up to 1 MiB, so stdin goes in chunks of
_STDIN_CHUNK. A control message succeeds silently; its failure comes back
as an ``error`` event at some later point of the output, so the sessions
here resize and signal through the process's HTTP endpoints instead,
which answer each call. Closing stdin stays a control message, because
only that keeps it behind the stdin sent before it.

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
import weakref
from typing import Any, Awaitable, Callable, Coroutine, Optional, TypeVar

import websockets
import websockets.client
import websockets.exceptions

from . import _errors
from . import _requests as R
from ._host import CONNECT_TIMEOUT, Endpoint
from ._ops import ExecReader, Request, ainvoke, invoke, process_path, to_bytes
from ._types import ExecResult, OutputEvent

T = TypeVar("T")

# Bounds one message from the server (an output chunk).
_MAX_MESSAGE = 16 << 20

# Bounds one stdin message, well below the server's 1 MiB read limit.
_STDIN_CHUNK = 256 << 10

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
        # A caller may read output slowly; a keepalive ping whose pong sits
        # behind unread messages must not end the session.
        ping_interval=None,
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

    :meth:`resize`, :meth:`signal` and :meth:`kill` raise what the daemon
    answers. Writing stdin (:meth:`send`, :meth:`close_stdin`) is
    asynchronous: a refusal the daemon reports during the session is
    raised by the next :meth:`send` or :meth:`close_stdin`.
    """

    def __init__(
        self, conn: Any, pid: int, from_offset: int, sandbox_id: str = "", call: Optional[Callable[[Request], Awaitable[Any]]] = None
    ) -> None:
        self._conn = conn
        self.pid = pid
        self.exit: Optional[ExecResult] = None
        self.dropped = 0
        self._offset = from_offset
        self._sandbox_id = sandbox_id
        self._call = call
        # The last error event: it explains a close by the server.
        self._error: Optional[_errors.CorralError] = None
        # An error event not yet raised by a stdin call.
        self._pending: Optional[_errors.CorralError] = None

    @classmethod
    async def open(
        cls, ep: Endpoint, sandbox_id: str, pid: int, from_offset: int = 0, call: Optional[Callable[[Request], Awaitable[Any]]] = None
    ) -> "AsyncAttachSession":
        """Dials the session; ``call`` sends an HTTP request with the
        client's connection (for resize and signal)."""
        return cls(await _dial(ep, sandbox_id, pid, from_offset), pid, from_offset, sandbox_id, call)

    async def send(self, data: Any) -> None:
        """Writes data (str or bytes) to the process's stdin (for a
        terminal, as typed keys)."""
        self._raise_pending()
        b = to_bytes(data)
        for i in range(0, len(b), _STDIN_CHUNK):
            await self._write(bytes([_STDIN]) + b[i : i + _STDIN_CHUNK])

    async def close_stdin(self) -> None:
        """Closes the process's stdin after what was sent (on a terminal:
        sends ^D)."""
        self._raise_pending()
        await self._write(json.dumps({"type": "close_stdin"}))

    async def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal size of a PTY process."""
        await self._http(R.resize(self._sandbox_id, self.pid, cols, rows))

    async def signal(self, signal: str) -> None:
        """Sends a signal (``"SIGINT"``, ``"INT"`` or ``"2"``) to the
        process's group."""
        await self._http(R.signal(self._sandbox_id, self.pid, signal))

    async def kill(self) -> None:
        """Sends SIGKILL to the process's group."""
        await self.signal("SIGKILL")

    async def _http(self, req: Request) -> None:
        if self._call is None:
            raise _errors.FailedPrecondition("this attach session was opened without a client to send requests with")
        await self._call(req)

    def _raise_pending(self) -> None:
        err, self._pending = self._pending, None
        if err is not None:
            raise err

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
            try:
                ev = json.loads(msg)
            except ValueError as e:
                raise _errors.Internal(f"attach: the daemon sent an event that is not JSON: {msg[:200]!r}") from e
            self._event(ev)

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
            # The session survives a refused stdin write; an error
            # followed by the server closing explains the close.
            self._error = self._pending = _errors.error_from_detail(ev.get("error"), "attach failed without a reason")

    async def wait(
        self, on_stdout: Optional[Callable[[str], Any]] = None, on_stderr: Optional[Callable[[str], Any]] = None
    ) -> ExecResult:
        """Reads the output until the process exits and returns how it
        ended, with the output read here (not what earlier iteration
        consumed)."""
        reader = ExecReader(on_stdout, on_stderr)
        async for ev in self:
            await ainvoke(reader.out[ev.stream].add(ev.data))
        await ainvoke(reader.flush())
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


def _shut(lt: _LoopThread, s: AsyncAttachSession) -> None:
    """Closes a blocking session's connection and ends its thread."""
    try:
        lt.run(s.close())
    finally:
        lt.stop()


class AttachSession:
    """The blocking twin of :class:`AsyncAttachSession`: iterate it for
    :class:`OutputEvent` chunks; :meth:`send`, :meth:`resize`,
    :meth:`signal` may be called from another thread while one iterates.

    The session holds a connection and a thread. They are freed when
    iteration ends (the process exited, or the connection failed), on
    :meth:`close` (or leaving ``with``), and at the latest when the
    session is garbage collected."""

    def __init__(self, ep: Endpoint, sandbox_id: str, pid: int, from_offset: int = 0, call: Optional[Callable[[Request], Any]] = None) -> None:
        self._call = call
        self._sandbox_id = sandbox_id
        self._lt = _LoopThread()
        try:
            self._s = self._lt.run(AsyncAttachSession.open(ep, sandbox_id, pid, from_offset))
        except BaseException:
            self._lt.stop()
            raise
        self._shut = weakref.finalize(self, _shut, self._lt, self._s)

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

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._shut.alive:
            coro.close()
            raise _errors.FailedPrecondition("the attach session is closed")
        return self._lt.run(coro)

    def send(self, data: Any) -> None:
        """Writes data (str or bytes) to the process's stdin (see
        :meth:`AsyncAttachSession.send`)."""
        self._run(self._s.send(data))

    def close_stdin(self) -> None:
        """Closes the process's stdin after what was sent (on a terminal:
        sends ^D)."""
        self._run(self._s.close_stdin())

    def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal size of a PTY process."""
        self._http(R.resize(self._sandbox_id, self.pid, cols, rows))

    def signal(self, signal: str) -> None:
        """Sends a signal to the process's group."""
        self._http(R.signal(self._sandbox_id, self.pid, signal))

    def kill(self) -> None:
        """Sends SIGKILL to the process's group."""
        self.signal("SIGKILL")

    def _http(self, req: Request) -> None:
        if self._call is None:
            raise _errors.FailedPrecondition("this attach session was opened without a client to send requests with")
        self._call(req)

    def __iter__(self) -> "AttachSession":
        return self

    def __next__(self) -> OutputEvent:
        try:
            return self._run(self._s.__anext__())
        except StopAsyncIteration:
            self.close()
            raise StopIteration from None
        except _errors.FailedPrecondition:
            if not self._shut.alive:
                raise StopIteration from None
            self.close()
            raise
        except BaseException:
            self.close()
            raise

    def wait(
        self, on_stdout: Optional[Callable[[str], Any]] = None, on_stderr: Optional[Callable[[str], Any]] = None
    ) -> ExecResult:
        """Reads the output until the process exits (calling the callbacks
        on this thread) and returns how it ended, with that output."""
        reader = ExecReader(on_stdout, on_stderr)
        for ev in self:
            invoke(reader.out[ev.stream].add(ev.data))
        invoke(reader.flush())
        if self.exit is None:
            raise _errors.FailedPrecondition("the attach session was closed before the process exited")
        reader.exit, reader.pid = self.exit, self.pid
        return reader.result()

    def close(self) -> None:
        """Leaves the session; the process keeps running."""
        self._shut()

    def __enter__(self) -> "AttachSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
