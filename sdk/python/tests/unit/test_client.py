import json
import threading

import httpx
import pytest

import corral

from .helpers import async_client, client, ndjson, sandbox_json


def test_create_sends_the_spec_and_deletes_on_exit():
    def handler(req):
        if req.method == "POST":
            return httpx.Response(200, json=sandbox_json())
        return httpx.Response(204)

    c, rec = client(handler, api_key="k")
    with c.create("busybox", memory_mb=256, timeout=60, metadata={"a": "b"}) as sb:
        assert sb.id == "sb1" and sb.state == "running" and sb.created_at.year == 2026
    assert [(r.method, r.url.path) for r in rec.requests] == [("POST", "/v1/sandboxes"), ("DELETE", "/v1/sandboxes/sb1")]
    assert rec.body(0) == {"template": "busybox", "memory_mb": 256, "timeout": 60, "metadata": {"a": "b"}}
    assert rec.requests[0].headers["Authorization"] == "Bearer k"


def test_list_filters_by_metadata():
    c, rec = client(lambda r: httpx.Response(200, json=[sandbox_json("a"), sandbox_json("b")]))
    got = c.list(state="running", metadata={"team": "x", "run": "7"})
    assert [s.id for s in got] == ["a", "b"]
    assert rec.requests[0].url.params.get_list("metadata") == ["team=x", "run=7"]
    assert rec.requests[0].url.params["state"] == "running"


def test_errors_become_exceptions():
    def handler(req):
        if req.url.path.endswith("/missing"):
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "sandbox missing not found"}})
        return httpx.Response(503, headers={"Retry-After": "3"}, json={"error": {"code": "busy", "message": "full"}})

    c, _ = client(handler)
    with pytest.raises(corral.NotFound, match="sandbox missing not found"):
        c.get("missing")
    with pytest.raises(corral.Busy) as info:
        c.create()
    assert info.value.retry_after == 3.0 and info.value.status == 503


def test_unreachable_daemon_is_unavailable(tmp_path):
    c = corral.Client("unix://" + str(tmp_path / "no.sock"))
    with pytest.raises(corral.Unavailable, match="unreachable"):
        c.list()


def test_exec_streams_to_callbacks_before_the_exit():
    order = []

    def handler(req):
        assert req.url.path == "/v1/sandboxes/sb1/exec"
        assert json.loads(req.content) == {"shell": "echo hi", "timeout_ms": 2000}
        return httpx.Response(200, content=ndjson(
            {"type": "start", "pid": 9}, {"type": "stdout", "text": "hi\n"}, {"type": "stderr", "text": "e"},
            {"type": "exit", "exit_code": 1}))

    c, _ = client(handler)
    sb = corral.Sandbox(c, sandbox_json())
    res = sb.exec("echo hi", timeout=2, on_stdout=lambda t: order.append(("out", t)), on_stderr=lambda t: order.append(("err", t)))
    assert order == [("out", "hi\n"), ("err", "e")]
    assert (res.exit_code, res.stdout, res.stderr, res.pid) == (1, "hi\n", "e", 9)


def test_exec_stream_without_exit_fails():
    c, _ = client(lambda r: httpx.Response(200, content=ndjson({"type": "start", "pid": 9})))
    with pytest.raises(corral.Unavailable):
        corral.Sandbox(c, sandbox_json()).exec(["true"])


def test_files_requests():
    def handler(req):
        if req.url.path.endswith("/stat"):
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})
        if req.method == "GET":
            return httpx.Response(200, content=b"\x00bytes")
        return httpx.Response(200, json={"name": "f", "path": "/d/f", "type": "file", "size": 3, "mode": 0o640})

    c, rec = client(handler)
    files = corral.Sandbox(c, sandbox_json()).files
    info = files.write("/d/f", "abc", mode=0o640)
    assert info.size == 3 and rec.requests[-1].url.params["mode"] == "640" and rec.requests[-1].content == b"abc"
    assert files.read("/d/f") == b"\x00bytes"
    assert files.exists("/nope") is False
    with pytest.raises(ValueError):
        files.write("/d/f", "x", mode=0o17777)
    with pytest.raises(TypeError):
        files.write("/d/f", 12)


def test_process_output_iterates_from_an_offset():
    def handler(req):
        assert req.url.params["from"] == "4" and "follow" not in req.url.params
        return httpx.Response(200, content=ndjson({"type": "start"}, {"type": "stdout", "text": "ef", "offset": 4}))

    c, _ = client(handler)
    proc = corral.Process(corral.Sandbox(c, sandbox_json()), {"pid": 5, "running": True})
    stream = proc.output(4)
    assert [e.data for e in stream] == [b"ef"]
    assert stream.next_offset == 6 and stream.exit is None


async def test_async_client():
    calls = []

    def handler(req):
        calls.append((req.method, req.url.path))
        if req.url.path == "/v1/sandboxes":
            return httpx.Response(200, json=sandbox_json())
        if req.url.path.endswith("/exec"):
            return httpx.Response(200, content=ndjson({"type": "stdout", "text": "42\n"}, {"type": "exit", "exit_code": 0}))
        if req.url.path.endswith("/pause"):
            return httpx.Response(200, json=sandbox_json(state="paused"))
        return httpx.Response(204)

    c, _ = async_client(handler)
    got = []

    async def on_out(text):
        got.append(text)

    async with c:
        async with await c.create("busybox") as sb:
            res = await sb.exec(["echo", "42"], on_stdout=on_out)
            assert res.stdout == "42\n" and got == ["42\n"]
            assert (await sb.pause()).state == "paused" and sb.state == "paused"
    assert calls[-1] == ("DELETE", "/v1/sandboxes/sb1")


async def test_async_errors():
    c, _ = async_client(lambda r: httpx.Response(409, json={"error": {"code": "failed_precondition", "message": "paused"}}))
    with pytest.raises(corral.FailedPrecondition):
        await c.get("x")


def test_event_and_watch_streams():
    def handler(req):
        if req.url.path == "/v1/events":
            assert req.url.params["type"] == "created,deleted"
            return httpx.Response(200, content=ndjson(
                {"type": "created", "sandbox_id": "a", "time": "2026-01-01T00:00:00Z"},
                {"type": "error", "error": {"code": "resource_exhausted", "message": "too slow"}}))
        return httpx.Response(200, content=ndjson({"type": "create", "path": "/w/f"}, {"type": "remove", "path": "/w/f"}))

    c, _ = client(handler)
    events = c.events(types=["created", "deleted"])
    first = next(events)
    assert first.type == "created" and first.sandbox_id == "a" and first.time.year == 2026
    with pytest.raises(corral.ResourceExhausted):
        next(events)
    with corral.Sandbox(c, sandbox_json()).files.watch("/w") as watch:
        assert [(e.type, e.path) for e in watch] == [("create", "/w/f"), ("remove", "/w/f")]


def test_run_reports_the_sandbox_removal_failure():
    def handler(req):
        assert json.loads(req.content)["remove"] is True
        return httpx.Response(200, content=ndjson(
            {"type": "sandbox", "sandbox": sandbox_json()}, {"type": "stdout", "text": "hi\n"},
            {"type": "exit", "exit_code": 0}, {"type": "error", "error": {"code": "internal", "message": "delete failed"}}))

    c, _ = client(handler)
    with pytest.raises(corral.Internal, match="delete failed"):
        c.run("echo hi")


async def test_async_dockerfile_build(tmp_path):
    (tmp_path / "f.txt").write_text("F")
    seen = {}

    def handler(req):
        seen["body"] = req.content
        seen["params"] = dict(req.url.params)
        return httpx.Response(200, content=ndjson({"type": "log", "text": "COPY"}, {"type": "done", "template": {"name": "t"}}))

    c, _ = async_client(handler)
    logs = []
    t = await c.templates.build_dockerfile("t", "FROM scratch\nCOPY f.txt /\n", context_dir=str(tmp_path), no_cache=True,
                                           on_log=logs.append)
    assert t.name == "t" and logs == ["COPY"] and seen["params"] == {"no_cache": "true"}
    assert b"FROM scratch" in seen["body"] and b"f.txt" in seen["body"]


@pytest.mark.parametrize(
    "blocking,asynchronous",
    [
        ("Client", "AsyncClient"),
        ("Sandbox", "AsyncSandbox"),
        ("Process", "AsyncProcess"),
        ("Files", "AsyncFiles"),
        ("VolumeFiles", "AsyncVolumeFiles"),
        ("_client.Templates", "_async.AsyncTemplates"),
        ("_client.Pools", "_async.AsyncPools"),
        ("_client.Snapshots", "_async.AsyncSnapshots"),
        ("_client.Volumes", "_async.AsyncVolumes"),
    ],
)
def test_the_async_twin_has_the_same_names(blocking, asynchronous):
    import inspect
    from functools import reduce

    def public(path):
        cls = reduce(getattr, path.split("."), corral)
        return {n: getattr(cls, n) for n in dir(cls) if not n.startswith("_")}

    sync, aio = public(blocking), public(asynchronous)
    assert set(sync) == set(aio)
    for name, fn in sync.items():
        if inspect.isfunction(fn):
            assert list(inspect.signature(fn).parameters) == list(inspect.signature(aio[name]).parameters), name


async def test_async_file_bodies_are_read_off_the_event_loop(tmp_path):
    loop_thread = threading.get_ident()
    readers = []

    class File:
        def __init__(self, data):
            self.data = data

        def read(self, n):
            readers.append(threading.get_ident())
            chunk, self.data = self.data[:n], self.data[n:]
            return chunk

    def handler(req):
        assert req.read() == b"x" * (300 << 10)
        return httpx.Response(200, json={"name": "f", "path": "/f", "size": 1, "mode": 420})

    c, _ = async_client(handler)
    sb = corral.AsyncSandbox(c, sandbox_json())
    await sb.files.write("/f", File(b"x" * (300 << 10)))
    assert readers and loop_thread not in readers


class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that records whether the client closed it."""

    def __init__(self, data):
        self.data = data
        self.closed = False

    def __iter__(self):
        yield self.data

    async def __aiter__(self):
        yield self.data

    def close(self):
        self.closed = True

    async def aclose(self):
        self.closed = True


STREAM_ENDS = [
    (ndjson({"type": "error", "error": {"code": "not_found", "message": "gone"}}), corral.NotFound),
    (b"{not json\n", corral.Internal),
]


@pytest.mark.parametrize("data, error", STREAM_ENDS)
def test_a_stream_that_fails_is_closed(data, error):
    body = Body(data)
    c, _ = client(lambda r: httpx.Response(200, stream=body))
    stream = corral.Sandbox(c, sandbox_json()).files.watch("/w")
    with pytest.raises(error):
        next(stream)
    assert body.closed


@pytest.mark.parametrize("data, error", STREAM_ENDS)
async def test_an_async_stream_that_fails_is_closed(data, error):
    body = Body(data)
    c, _ = async_client(lambda r: httpx.Response(200, stream=body))
    stream = await corral.AsyncSandbox(c, sandbox_json()).files.watch("/w")
    with pytest.raises(error):
        await stream.__anext__()
    assert body.closed


def test_exec_with_a_line_that_is_not_json_raises_internal():
    c, _ = client(lambda r: httpx.Response(200, content=b'{"type": "start", "pid": 1}\nnot json\n'))
    with pytest.raises(corral.Internal, match="not JSON"):
        corral.Sandbox(c, sandbox_json()).exec("true")


def test_volume_files_offer_what_the_daemon_serves_for_volumes():
    c, rec = client(lambda r: httpx.Response(200, content=b"data"))
    files = c.volumes.files("v")
    assert isinstance(files, corral.VolumeFiles) and not isinstance(files, corral.Files)
    assert not any(hasattr(files, n) for n in ("rename", "upload", "download", "watch"))
    assert files.read("/f") == b"data" and rec.requests[0].url.path == "/v1/volumes/v/files"


@pytest.mark.parametrize("make", [corral.Client, corral.AsyncClient])
def test_port_url_needs_a_tcp_host(make):
    sb = make("http://corral.test:1/api")._sandbox(sandbox_json())
    assert sb.port_url(8080, "/x?y=1") == "http://corral.test:1/api/v1/sandboxes/sb1/ports/8080/x?y=1"
    with pytest.raises(corral.FailedPrecondition, match="TCP"):
        make("unix:///run/corral/corral.sock")._sandbox(sandbox_json()).port_url(8080)
