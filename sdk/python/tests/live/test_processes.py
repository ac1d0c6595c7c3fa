"""Background processes, attach from a second client, and terminals."""

from __future__ import annotations

import time

import pytest

import corral


def read_until(session, marker: bytes, limit: float = 20) -> bytes:
    out = b""
    deadline = time.monotonic() + limit
    for ev in session:
        out += ev.data
        if marker in out:
            return out
        assert time.monotonic() < deadline, f"no {marker!r} in {out!r}"
    raise AssertionError(f"session ended without {marker!r}: {out!r}")


def test_spawn_wait_iterate_and_offsets(sb):
    proc = sb.spawn("for i in 1 2 3; do echo line$i; sleep 0.2; done; echo bad >&2; exit 7", tag="counter")
    assert proc.pid > 0 and proc.info.tag == "counter"
    assert proc.pid in [p.pid for p in sb.processes()]
    chunks = list(proc)
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"line1\nline2\nline3\n"
    res = proc.wait()
    assert (res.exit_code, res.stdout, res.stderr) == (7, "line1\nline2\nline3\n", "bad\n")
    stream = proc.output(6)
    assert b"".join(e.data for e in stream) == b"line2\nline3\nbad\n"
    assert stream.next_offset == 22 and stream.exit.exit_code == 7
    info = proc.refresh()
    assert not info.running and info.exit_code == 7
    proc.remove()
    with pytest.raises(corral.NotFound):
        proc.refresh()


def test_stdin_and_signals(sb):
    proc = sb.spawn(["cat"], open_stdin=True)
    proc.write_stdin("abc\n")
    proc.write_stdin(b"def\n")
    proc.close_stdin()
    assert proc.wait().stdout == "abc\ndef\n"
    sleeper = sb.spawn(["sleep", "60"])
    sleeper.kill("SIGTERM")
    res = sleeper.wait()
    assert res.exit_code == 128 + 15
    assert sleeper.refresh().signal in ("SIGTERM", "terminated")


def test_reattach_from_a_second_client(client, sb):
    proc = sb.spawn(["cat"], open_stdin=True)
    proc.write_stdin("one\n")
    with corral.Client(client.host) as second:
        again = second.get(sb.id)
        assert again.process(proc.pid).info.running
        with again.attach(proc.pid) as session:
            assert read_until(session, b"one\n") == b"one\n"
            session.send("two\n")
            session.close_stdin()
            res = session.wait()
        assert res.exit_code == 0 and session.exit is not None
        tail = again.process(proc.pid).output(4)
        assert b"".join(e.data for e in tail) == b"two\n"
    assert proc.wait().stdout == "one\ntwo\n"


def test_pty(sb):
    with sb.pty(["/bin/sh"], cols=100, rows=30) as term:
        term.send("stty size\n")
        read_until(term, b"30 100")
        term.resize(120, 40)
        term.send("stty size; exit 3\n")
        read_until(term, b"40 120")
        res = term.wait()
    assert res.exit_code == 3


def test_leaving_a_session_keeps_the_process(sb):
    session = sb.pty(["/bin/sh"])
    pid = session.pid
    session.close()
    proc = sb.process(pid)
    assert proc.info.running and proc.info.pty
    proc.kill()
    assert proc.wait().exit_code == 128 + 9
