"""Sandboxes, exec and run against a live daemon."""

from __future__ import annotations

import os
import time

import pytest

import corral

from .conftest import needs


def test_create_get_list_and_delete_on_exit(client, template, runtime, meta):
    with client.create(template, runtime=runtime, metadata={**meta, "case": "lifecycle"}, timeout=300) as sb:
        assert sb.state == "running" and sb.template == template
        if runtime:
            assert sb.runtime == runtime
        assert sb.deadline is not None and sb.metadata["case"] == "lifecycle"
        got = client.get(sb.id)
        assert got.id == sb.id and got.created_at == sb.created_at
        assert [s.id for s in client.list(metadata={**meta, "case": "lifecycle"})] == [sb.id]
        assert client.list(metadata={**meta, "case": "other"}) == []
    with pytest.raises(corral.NotFound):
        client.get(sb.id)


def test_exec_list_shell_env_cwd_user_stdin(sb):
    res = sb.exec(["echo", "a b"])
    assert (res.exit_code, res.stdout, res.stderr) == (0, "a b\n", "")
    res = sb.exec("echo out; echo err >&2; exit 3")
    assert (res.exit_code, res.stdout, res.stderr, res.ok) == (3, "out\n", "err\n", False)
    res = sb.exec("echo $GREETING; pwd; id -u", env={"GREETING": "hello"}, cwd="/tmp", user="1234")
    assert res.stdout == "hello\n/tmp\n1234\n"
    assert sb.exec(["cat"], stdin="from stdin").stdout == "from stdin"
    assert sb.exec(["cat"], stdin=b"\xff\x00").stdout_bytes == b"\xff\x00"


def test_exec_timeout_kills(sb):
    start = time.monotonic()
    res = sb.exec(["sleep", "30"], timeout=0.5)
    assert res.timed_out and res.exit_code != 0
    assert time.monotonic() - start < 10


def test_exec_streams_output_as_it_comes(sb):
    seen = []
    res = sb.exec(
        "echo first; sleep 1; echo second >&2",
        on_stdout=lambda t: seen.append(("out", t, time.monotonic())),
        on_stderr=lambda t: seen.append(("err", t, time.monotonic())),
    )
    done = time.monotonic()
    assert [(s, t) for s, t, _ in seen] == [("out", "first\n"), ("err", "second\n")]
    assert done - seen[0][2] >= 0.7, "stdout arrived only at the end"
    assert res.stdout == "first\n" and res.stderr == "second\n"


def test_exec_of_a_missing_program_is_not_found(sb):
    with pytest.raises(corral.NotFound):
        sb.exec(["/no/such/program"])


def test_run_creates_runs_and_deletes(client, template, runtime, meta):
    seen = []
    res = client.run("echo ran; echo oops >&2; exit 4", template=template, runtime=runtime, metadata=meta,
                     on_stdout=seen.append)
    assert (res.exit_code, res.stdout, res.stderr) == (4, "ran\n", "oops\n")
    assert seen == ["ran\n"]
    assert client.list(metadata=meta) == []


def test_errors_map_to_exceptions(client, sb):
    with pytest.raises(corral.NotFound):
        client.get("no-such-sandbox")
    with pytest.raises(corral.InvalidArgument):
        client.create(sb.template, cpus=-1)
    with pytest.raises(corral.NotFound):
        sb.process(999999)
    sb.stop()
    with pytest.raises(corral.FailedPrecondition):
        sb.exec(["true"])
    sb.start()
    assert sb.exec(["true"]).ok


def test_busy_has_a_retry_hint(new_sandbox, client):
    ratio = float(needs("CORRAL_TEST_MEMORY_COMMIT_RATIO"))
    with open("/proc/meminfo") as f:
        total_kb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    cap_mb = int(total_kb * 1024 * ratio) // (1 << 20)
    # The daemon counts every sandbox's memory limit: one that takes
    # nearly all leaves no room for another.
    committed = sum(s.memory_mb for s in client.list())
    new_sandbox(memory_mb=cap_mb - committed - 64)
    with pytest.raises(corral.Busy) as info:
        new_sandbox(memory_mb=128)
    assert info.value.retry_after is not None and info.value.retry_after > 0
    assert info.value.status == 503


def test_tcp_with_api_key(template, runtime, meta):
    host = needs("CORRAL_TEST_TCP_HOST")
    with corral.Client(host, api_key="wrong") as wrong, pytest.raises(corral.Unauthenticated):
        wrong.list()
    with corral.Client(host, api_key=needs("CORRAL_TEST_TCP_KEY")) as c:
        with c.create(template, runtime=runtime, metadata=meta) as sb:
            assert sb.exec(["echo", "tcp"]).stdout == "tcp\n"
            with sb.pty(["/bin/sh"]) as term:
                term.send("exit 5\n")
                assert term.wait().exit_code == 5


def test_lifecycle(sb):
    assert sb.pause().state == "paused"
    assert sb.refresh().state == "paused"
    assert sb.resume().state == "running"
    before = sb.deadline
    assert sb.set_timeout(3600).deadline > before
    sb.files.write("/keep.txt", "kept")
    assert sb.stop().state == "stopped"
    assert sb.start().state == "running"
    assert sb.files.read_text("/keep.txt") == "kept"
    st = sb.stats()
    assert st.memory_bytes > 0 and st.pids >= 1
    assert sb.update(memory_mb=384).memory_mb == 384


def test_network_policy(new_sandbox):
    sb = new_sandbox(network=corral.NetworkPolicy(allow_domains=["example.com"]))
    assert sb.network.mode == "allowlist" and sb.network.allow_domains == ["example.com"]
    sb.update_network(corral.NetworkPolicy(allow_domains=["example.org:443"]))
    assert sb.network.allow_domains == ["example.org:443"]
    plain = new_sandbox(network="none")
    with pytest.raises(corral.FailedPrecondition):
        plain.update_network("open")


def test_snapshot_fork_and_create_from_snapshot(client, sb, new_sandbox, run_id, meta):
    sb.files.write("/state.txt", "before")
    name = "py-" + run_id
    snap = sb.snapshot(name, metadata={"k": "v"})
    try:
        assert snap.name == name and snap.sandbox_id == sb.id and snap.metadata == {"k": "v"}
        assert name in [s.name for s in client.snapshots.list()]
        assert client.snapshots.get(name).kind == snap.kind
        copy = new_sandbox(from_snapshot=name, template=None, runtime=None)
        assert copy.files.read_text("/state.txt") == "before"
    finally:
        client.snapshots.delete(name)
    with pytest.raises(corral.NotFound):
        client.snapshots.get(name)
    forks = sb.fork(2)
    try:
        assert len(forks) == 2 and len({f.id for f in forks} | {sb.id}) == 3
        for f in forks:
            assert f.files.read_text("/state.txt") == "before"
    finally:
        for f in forks:
            f.kill()


def test_templates_pools_and_volumes(client, template, runtime, run_id, new_sandbox, tmp_path):
    assert template in [t.name for t in client.templates.list()]
    assert client.templates.get(template).name == template
    with pytest.raises(corral.NotFound):
        client.templates.get("no-such-template-" + run_id)
    logs = []
    built = client.templates.build("pybb-" + run_id, "busybox", on_log=logs.append)
    try:
        assert built.name == "pybb-" + run_id
        assert client.templates.set_service(built.name, {"cmd": ["/bin/sleep", "1000"]}).service["cmd"] == ["/bin/sleep", "1000"]
        assert client.templates.set_service(built.name, None).service is None
    finally:
        client.templates.delete(built.name)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("from the context\n")
    df = client.templates.build_dockerfile("pydf-" + run_id, "FROM scratch\nCOPY hello.txt /hello.txt\nENV GREETING=hi\n",
                                           context_dir=str(ctx), on_log=logs.append)
    try:
        assert df.defaults["env"] == ["GREETING=hi"] and logs
    finally:
        client.templates.delete(df.name)

    vol = client.volumes.create("pyvol-" + run_id, labels={"run": run_id})
    try:
        assert vol.name in [v.name for v in client.volumes.list()]
        sb = new_sandbox(volumes={"/data": vol})
        sb.exec("echo from-sandbox > /data/f.txt")
        vfiles = client.volumes.files(vol.name)
        assert vfiles.read_text("/f.txt") == "from-sandbox\n"
        assert client.volumes.get(vol.name).in_use_by == [sb.id]
        with pytest.raises(corral.AlreadyExists):
            client.volumes.create(vol.name)
        sb.kill()
    finally:
        client.volumes.delete(vol.name)

    pool = "pypool-" + run_id
    client.pools.set(pool, template=template, runtime=runtime, size=1)
    try:
        deadline = time.monotonic() + 60
        while client.pools.get(pool).ready < 1:
            assert time.monotonic() < deadline, "the pool never filled"
            time.sleep(0.2)
        assert pool in [p.name for p in client.pools.list()]
        claimed = new_sandbox(pool=pool)
        assert claimed.exec(["true"]).ok
    finally:
        client.pools.delete(pool)


def test_create_env_and_oom(new_sandbox, runtime):
    sb = new_sandbox(env={"FROM_CREATE": "yes"}, memory_mb=64)
    assert sb.memory_mb == 64
    assert sb.exec("echo $FROM_CREATE").stdout == "yes\n"
    if runtime == "gvisor":
        # Under gVisor a host OOM ends the whole sandbox rather than one
        # process, so the exec's oom_killed flag is checked on runc.
        return
    # dd allocates its whole 1 GiB block before it reads.
    res = sb.exec("dd if=/dev/zero of=/dev/null bs=1G count=1")
    assert res.oom_killed and res.exit_code != 0
    assert sb.exec(["echo", "alive"]).stdout == "alive\n"
