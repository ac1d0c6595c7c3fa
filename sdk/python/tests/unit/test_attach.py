"""Attach sessions against a fake daemon: a WebSocket server on a unix
socket for the session, a mock transport for the HTTP calls."""

import asyncio
import gc
import json
import threading

import httpx
import pytest
import websockets.server

import corral
from corral import _attach

from .helpers import Recorder, sandbox_json


class FakeDaemon:
    """Serves attach sessions on a unix socket from a thread of its own.
    Each session sends start, records what the client sends, answers
    stdin according to ``on_stdin`` and ends the process on close_stdin
    after sending ``last``."""

    def __init__(self, path, last=b"bye", on_stdin=None):
        self.path = str(path)
        self.last = last
        self.on_stdin = on_stdin
        self.got = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def start():
            self.server = await websockets.server.unix_serve(self.session, self.path, max_size=1 << 20)
            ready.set()

        self.thread = threading.Thread(target=lambda: (self.loop.run_until_complete(start()), self.loop.run_forever()), daemon=True)
        self.thread.start()
        ready.wait(10)

    async def session(self, ws, path=None):
        await ws.send(json.dumps({"type": "start", "pid": 5}))
        async for msg in ws:
            self.got.append(msg)
            if isinstance(msg, bytes):
                if self.on_stdin is not None:
                    for reply in self.on_stdin(msg):
                        await ws.send(reply)
            elif json.loads(msg)["type"] == "close_stdin":
                await ws.send(b"\x01" + self.last)
                await ws.send(json.dumps({"type": "exit", "exit_code": 3}))
                await ws.close()

    def stop(self):
        async def end():
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(end(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def daemon(tmp_path):
    made = []

    def make(**kw):
        d = FakeDaemon(tmp_path / "corral.sock", **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


def http(sock, handler):
    rec = Recorder(handler)
    c = corral.Client(f"unix://{sock}")
    c._transport = httpx.MockTransport(rec)
    return c, rec


def async_http(sock, handler):
    rec = Recorder(handler)
    c = corral.AsyncClient(f"unix://{sock}")
    c._transport = httpx.MockTransport(rec)
    return c, rec


def test_stdin_goes_in_chunks_the_daemon_accepts_and_the_session_ends_with_the_process(daemon):
    d = daemon(last="é".encode()[:1])
    c, _ = http(d.path, lambda r: httpx.Response(204))
    sb = corral.Sandbox(c, sandbox_json())
    s = sb.attach(5)
    data = bytes(range(256)) * ((600 << 10) // 256)
    s.send(data)
    s.close_stdin()
    seen = []
    res = s.wait(on_stdout=seen.append)
    stdin = [m for m in d.got if isinstance(m, bytes)]
    assert len(stdin) == 3 and all(m[0] == 0 and len(m) <= 1 + (256 << 10) for m in stdin)
    assert b"".join(m[1:] for m in stdin) == data
    assert res.exit_code == 3 and res.stdout == "\ufffd" and "".join(seen) == res.stdout
    # The session freed its connection and thread with the process's end.
    assert not s._shut.alive and not s._lt.thread.is_alive()
    with pytest.raises(corral.FailedPrecondition):
        s.send("late")
    assert list(s) == []


def test_resize_and_signal_raise_what_the_daemon_answers(daemon):
    d = daemon()

    def handler(req):
        if req.url.path.endswith("/resize"):
            return httpx.Response(400, json={"error": {"code": "invalid_argument", "message": "not a terminal"}})
        return httpx.Response(204)

    c, rec = http(d.path, handler)
    with corral.Sandbox(c, sandbox_json()).attach(5) as s:
        with pytest.raises(corral.InvalidArgument, match="not a terminal"):
            s.resize(100, 40)
        s.signal("INT")
        s.kill()
    got = [(r.method, r.url.path, json.loads(r.content)) for r in rec.requests if r.method == "POST"]
    assert got == [
        ("POST", "/v1/sandboxes/sb1/processes/5/resize", {"cols": 100, "rows": 40}),
        ("POST", "/v1/sandboxes/sb1/processes/5/signal", {"signal": "INT"}),
        ("POST", "/v1/sandboxes/sb1/processes/5/signal", {"signal": "SIGKILL"}),
    ]
    assert not s._shut.alive
    assert [m for m in d.got if isinstance(m, str)] == []


async def test_async_session_raises_a_refused_stdin_write_on_the_next_call(daemon):
    refusal = json.dumps({"type": "error", "error": {"code": "failed_precondition", "message": "stdin is closed"}})
    d = daemon(on_stdin=lambda msg: [refusal, b"\x01ok"])

    def handler(req):
        if req.url.path.endswith("/signal"):
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "process 5 not found"}})
        return httpx.Response(204)

    c, _ = async_http(d.path, handler)
    sb = corral.AsyncSandbox(c, sandbox_json())
    s = await sb.attach(5)
    try:
        await s.send("a")
        ev = await s.__anext__()
        assert ev.data == b"ok"
        with pytest.raises(corral.FailedPrecondition, match="stdin is closed"):
            await s.send("b")
        with pytest.raises(corral.NotFound):
            await s.signal("TERM")
        await s.close_stdin()
        seen = []
        res = await s.wait(on_stdout=seen.append)
        assert res.stdout == "bye" and seen == ["bye"]
    finally:
        await s.close()


def pty_started(req):
    if req.url.path.endswith("/processes"):
        return httpx.Response(200, json={"pid": 9, "running": True})
    return httpx.Response(204)


def test_pty_kills_the_process_when_attaching_fails(tmp_path):
    c, rec = http(tmp_path / "no-daemon.sock", pty_started)
    with pytest.raises(corral.Unavailable):
        corral.Sandbox(c, sandbox_json()).pty()
    last = rec.requests[-1]
    assert (last.method, last.url.path, json.loads(last.content)) == ("POST", "/v1/sandboxes/sb1/processes/9/signal", {"signal": "SIGKILL"})


async def test_async_pty_kills_the_process_when_attaching_fails(tmp_path):
    c, rec = async_http(tmp_path / "no-daemon.sock", pty_started)
    with pytest.raises(corral.Unavailable):
        await corral.AsyncSandbox(c, sandbox_json()).pty()
    assert rec.requests[-1].url.path == "/v1/sandboxes/sb1/processes/9/signal"


async def test_an_event_that_is_not_json_is_an_internal_error():
    class Conn:
        async def recv(self):
            return "{not json"

    s = _attach.AsyncAttachSession(Conn(), 5, 0)
    with pytest.raises(corral.Internal, match="not JSON"):
        await s.__anext__()


def test_a_forgotten_session_frees_its_connection_and_thread(daemon):
    d = daemon()
    c, _ = http(d.path, lambda r: httpx.Response(204))
    s = corral.Sandbox(c, sandbox_json()).attach(5)
    thread = s._lt.thread
    del s
    gc.collect()
    assert not thread.is_alive()
