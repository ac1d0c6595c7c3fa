import base64
import datetime as dt

import pytest

import corral
from corral import _ops
from corral._host import Endpoint
from corral._types import parse_time


def test_command_fields():
    assert _ops.command_fields("echo hi | wc") == {"shell": "echo hi | wc"}
    assert _ops.command_fields(["echo", "hi"]) == {"cmd": ["echo", "hi"]}
    assert _ops.command_fields(("ls",)) == {"cmd": ["ls"]}
    for bad, exc in [("", ValueError), ("  ", ValueError), ([], ValueError), (b"ls", TypeError), (["ls", 1], TypeError)]:
        with pytest.raises(exc):
            _ops.command_fields(bad)


def test_exec_body():
    body = _ops.exec_body(["cat"], env={"A": "1"}, cwd="/tmp", user="nobody", stdin="héllo", timeout=1.5)
    assert body == {"cmd": ["cat"], "env": {"A": "1"}, "cwd": "/tmp", "user": "nobody",
                    "stdin": base64.b64encode("héllo".encode()).decode(), "timeout_ms": 1500}
    assert _ops.exec_body("true") == {"shell": "true"}
    with pytest.raises(ValueError):
        _ops.exec_body("true", timeout=-1)
    with pytest.raises(TypeError):
        _ops.exec_body("true", env={"A": 1})


def test_whole_seconds_rounds_away_from_zero():
    assert _ops.whole_seconds(0.1) == 1
    assert _ops.whole_seconds(60) == 60
    assert _ops.whole_seconds(-0.1) == -1
    assert _ops.whole_seconds(0) == 0


def test_create_body():
    assert _ops.create_body() == {}
    assert _ops.create_body("t", timeout=corral.NO_TIMEOUT) == {"template": "t", "timeout": 0}
    body = _ops.create_body(
        "t", runtime="gvisor", cpus=0.5, memory_mb=256, timeout=90.2, network="open", metadata={"k": "v"},
        volumes={"/data": "vol1"}, mounts=[corral.Mount(target="/src", source="/host/src", mode="ro")],
    )
    assert body == {"template": "t", "runtime": "gvisor", "cpus": 0.5, "memory_mb": 256, "timeout": 91,
                    "network": {"mode": "open"}, "metadata": {"k": "v"},
                    "mounts": [{"target": "/src", "source": "/host/src", "mode": "ro"}, {"target": "/data", "volume": "vol1"}]}
    policy = corral.NetworkPolicy(allow_domains=["example.com"])
    assert _ops.create_body(network=policy) == {"network": {"allow_domains": ["example.com"]}}
    with pytest.raises(TypeError):
        _ops.create_body(network=3)
    with pytest.raises(TypeError):
        _ops.create_body(volumes={"/data": 3})


def test_code_body():
    assert _ops.code_body("1+1", "python", None, None, None, None) == {"code": "1+1", "language": "python"}
    ctx = corral.CodeContext(id="c1")
    assert _ops.code_body("x", "python", ctx, {"A": "b"}, 2, None) == {"code": "x", "context_id": "c1", "env": {"A": "b"}, "timeout_ms": 2000}
    with pytest.raises(TypeError):
        _ops.code_body(b"x", "python", None, None, None, None)


def test_path_segments_are_escaped():
    assert _ops.sandbox_path("a/b c") == "/v1/sandboxes/a%2Fb%20c"
    with pytest.raises(ValueError):
        _ops.sandbox_path("")


def test_endpoint(monkeypatch):
    monkeypatch.delenv("CORRAL_HOST", raising=False)
    monkeypatch.delenv("CORRAL_API_KEY", raising=False)
    ep = Endpoint(None, None)
    assert ep.uds == "/run/corral/corral.sock" and ep.base_url == "http://corral" and "Authorization" not in ep.headers()
    monkeypatch.setenv("CORRAL_HOST", "https://h.example:8443/api/")
    monkeypatch.setenv("CORRAL_API_KEY", "k1")
    ep = Endpoint(None, None)
    assert ep.uds is None and ep.base_url == "https://h.example:8443/api"
    assert ep.headers()["Authorization"] == "Bearer k1"
    assert ep.ws_url("/v1/x") == ("wss://h.example:8443/api/v1/x", None)
    assert Endpoint("unix:///tmp/s.sock", "k2").ws_url("/p") == ("ws://corral/p", "/tmp/s.sock")
    for bad in ["unix://", "tcp://h:1", "h:1", "http://"]:
        with pytest.raises(ValueError):
            Endpoint(bad, None)


def test_parse_time():
    t = parse_time("2026-01-02T03:04:05.123456789Z")
    assert t == dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc)
    assert parse_time("2026-01-02T03:04:05+02:00").utcoffset() == dt.timedelta(hours=2)
    assert parse_time("2026-01-02T03:04:05.5Z").microsecond == 500000
    assert parse_time(None) is None and parse_time("garbage") is None


def test_exec_reader_joins_split_characters_and_reports_exit():
    seen = []
    r = _ops.ExecReader(seen.append, None)
    euro = "€".encode()
    events = [
        {"type": "start", "pid": 7},
        {"type": "stdout", "data": base64.b64encode(b"a" + euro[:1]).decode()},
        {"type": "stdout", "data": base64.b64encode(euro[1:]).decode()},
        {"type": "stderr", "text": "warn\n"},
        {"type": "stdout", "data": base64.b64encode(b"\xff").decode()},
        {"type": "exit", "exit_code": 137, "signal": "SIGKILL", "oom_killed": True},
    ]
    for ev in events:
        cb = r.feed(ev)
        if cb is not None:
            cb.fn(cb.arg)
    assert r.finished
    res = r.result()
    assert "".join(seen) == "a€\ufffd"
    assert res.stdout_bytes == b"a" + euro + b"\xff" and res.stderr == "warn\n"
    assert (res.pid, res.exit_code, res.signal, res.oom_killed, res.ok) == (7, 137, "SIGKILL", True, False)


def test_exec_reader_errors():
    r = _ops.ExecReader(None, None)
    with pytest.raises(corral.NotFound):
        r.feed({"type": "error", "error": {"code": "not_found", "message": "no such file"}})
    with pytest.raises(corral.Unavailable):
        _ops.ExecReader(None, None).result()


def test_output_reader_offsets():
    r = _ops.OutputReader(3, 10, True)
    assert r.feed({"type": "start", "dropped": 5}) is None
    assert r.next_offset == 15 and r.dropped == 5
    ev = r.feed({"type": "stdout", "text": "abc", "offset": 15})
    assert (ev.stream, ev.data, ev.offset, r.next_offset) == ("stdout", b"abc", 15, 18)
    ev = r.feed({"type": "stderr", "text": "x", "offset": 30, "dropped": 12})
    assert r.dropped == 17 and r.next_offset == 31
    with pytest.raises(corral.Unavailable):
        r.end()
    r.feed({"type": "exit", "exit_code": 2})
    assert r.finished and r.exit.exit_code == 2 and r.exit.pid == 3
    r.end()


def test_run_reader_wants_the_sandbox_first():
    with pytest.raises(corral.Internal):
        _ops.RunReader(None, None).feed({"type": "stdout", "text": "x"})
    r = _ops.RunReader(None, None)
    r.feed({"type": "sandbox", "sandbox": {"id": "s"}})
    r.feed({"type": "stdout", "text": "out"})
    r.feed({"type": "exit", "exit_code": 0})
    r.feed({"type": "error", "error": {"code": "internal", "message": "delete failed"}})
    with pytest.raises(corral.Internal, match="delete failed"):
        r.result()


def test_code_reader():
    png = base64.b64encode(b"\x89PNG....").decode()
    seen = []
    r = _ops.CodeReader(on_result=seen.append)
    for ev in [
        {"type": "stdout", "text": "hi\n"},
        {"type": "result", "main": False, "result": {"png": png, "text": "<Figure>"}},
        {"type": "result", "main": True, "result": {"text": "2"}},
        {"type": "exception", "exception": {"name": "ValueError", "value": "bad", "traceback": "tb"}},
        {"type": "end", "execution_count": 4},
    ]:
        cb = r.feed(ev)
        if cb is not None:
            cb.fn(cb.arg)
    x = r.result()
    assert x.stdout == ["hi\n"] and x.text == "2" and x.execution_count == 4
    assert x.results[0].png == b"\x89PNG...." and x.results[0].formats() == ["text", "png"]
    assert x.error == corral.ExecutionError("ValueError", "bad", "tb")
    assert len(seen) == 2
    with pytest.raises(corral.Unavailable):
        _ops.CodeReader().result()


def test_dockerfile_build_request():
    from corral import _requests as R

    params = R.dockerfile_params({"B": "2", "A": "1"}, "linux/amd64", False, True, "allowlist", ["pypi.org"],
                                 "python3 -m http.server", None, 8000, None, 2.5, "always", False)
    assert params == [("build_arg", "A=1"), ("build_arg", "B=2"), ("platform", "linux/amd64"), ("network", "allowlist"),
                      ("start", "python3 -m http.server"), ("restart", "always"), ("allow_domain", "pypi.org"),
                      ("no_cache", "true"), ("ready_port", "8000"), ("ready_timeout", "2.5")]
    req = R.dockerfile_build("t", "FROM scratch\n", b"TAR", [])
    body = b"".join(req.content)
    boundary = req.content_type.split("boundary=")[1]
    assert body.startswith(b"--" + boundary.encode()) and body.endswith(b"--" + boundary.encode() + b"--\r\n")
    assert b'name="dockerfile"' in body and b"FROM scratch\n" in body and b'name="context"' in body and b"TAR" in body
    assert R.dockerfile_build("t", "FROM scratch\n", None, []).content_type != req.content_type


def test_build_reader():
    logs = []
    r = _ops.BuildReader(logs.append, None)
    for ev in [{"type": "log", "text": "step 1"}, {"type": "progress", "progress": {"current": 1}},
               {"type": "done", "template": {"name": "t", "defaults": {"env": ["A=1"]}}}]:
        cb = r.feed(ev)
        if cb is not None:
            cb.fn(cb.arg)
    assert logs == ["step 1"] and r.result().defaults == {"env": ["A=1"]}
    with pytest.raises(corral.InvalidArgument):
        _ops.BuildReader(None, None).feed({"type": "error", "error": {"code": "invalid_argument", "message": "bad"}})
    with pytest.raises(corral.Unavailable):
        _ops.BuildReader(None, None).result()


def test_line_buffer():
    from corral._wire import LineBuffer

    buf = LineBuffer()
    assert buf.feed(b'{"a"') == []
    assert buf.feed(b':1}\n\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert buf.feed(b"") == []
    assert buf.rest() == b'{"c"' and buf.rest() is None
    assert LineBuffer().feed(b"x" * 100 + b"\n") == [b"x" * 100]


@pytest.mark.parametrize("make", [lambda out, err: _ops.ExecReader(out, err), lambda out, err: _ops.WaitReader(7, out, err)])
def test_readers_flush_an_incomplete_character_at_the_exit(make):
    out, err = [], []
    r = make(out.append, err.append)
    for ev in [
        {"type": "start", "pid": 7},
        {"type": "stdout", "data": base64.b64encode(b"a\xe2\x82").decode(), "offset": 0},
        {"type": "stderr", "data": base64.b64encode(b"\xf0").decode(), "offset": 3},
        {"type": "exit", "exit_code": 0},
    ]:
        _ops.invoke(r.feed(ev))
    res = r.result()
    assert "".join(out) == res.stdout == "a\ufffd" and "".join(err) == res.stderr == "\ufffd"
