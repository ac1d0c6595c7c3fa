"""The asyncio client against a live daemon."""

from __future__ import annotations

import asyncio

import pytest

import corral


@pytest.fixture
async def aclient(client):
    async with corral.AsyncClient(client.host) as c:
        yield c


async def test_async_sandbox(aclient, template, runtime, meta):
    seen = []

    async def on_stdout(text):
        seen.append(text)

    async with await aclient.create(template, runtime=runtime, metadata=meta) as sb:
        assert (await aclient.get(sb.id)).id == sb.id
        res = await sb.exec("echo async; sleep 0.2; echo done", on_stdout=on_stdout)
        assert res.stdout == "async\ndone\n" and "".join(seen) == res.stdout
        await sb.files.write("/a.txt", "A")
        assert await sb.files.read_text("/a.txt") == "A"
        assert [f.name for f in await sb.files.list("/") if f.name == "a.txt"] == ["a.txt"]

        proc = await sb.spawn(["cat"], open_stdin=True)
        await proc.write_stdin("x\n")
        session = await sb.attach(proc.pid)
        async with session:
            await session.send("y\n")
            await session.close_stdin()
            res = await session.wait()
        assert res.stdout == "x\ny\n"
        assert b"".join([ev.data async for ev in proc]) == b"x\ny\n"

        term = await sb.pty(["/bin/sh"])
        async with term:
            await term.send("exit 4\n")
            assert (await term.wait()).exit_code == 4

        assert (await sb.pause()).state == "paused"
        assert (await sb.resume()).state == "running"
        with pytest.raises(corral.NotFound):
            await sb.files.read("/none")
    with pytest.raises(corral.NotFound):
        await aclient.get(sb.id)


async def test_async_concurrent_execs(aclient, template, runtime, meta):
    async with await aclient.create(template, runtime=runtime, metadata=meta) as sb:
        results = await asyncio.gather(*(sb.exec(["echo", str(i)]) for i in range(8)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]


async def test_async_run(aclient, template, runtime, meta, client):
    res = await aclient.run(["echo", "one-shot"], template=template, runtime=runtime, metadata=meta)
    assert res.stdout == "one-shot\n"
    assert client.list(metadata=meta) == []
