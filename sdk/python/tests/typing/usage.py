"""Typical uses of the blocking and the asyncio client, for the type
checker only (test/pysdk runs mypy on it and the package): the names and
types users' code relies on must check without errors. Never executed.
"""

from __future__ import annotations

from typing import List, Optional

import corral


def blocking() -> None:
    c = corral.Client()
    with c.create("t", memory_mb=1) as sb:
        r: corral.ExecResult = sb.exec("x", on_stdout=print)
        p = sb.spawn(["a"])
        for ev in p:
            b: bytes = ev.data
        with sb.attach(p.pid) as s:
            s.send("x")
        x: corral.Execution = sb.run_code("1")
        png: Optional[bytes] = x.results[0].png
        infos: List[corral.FileInfo] = sb.files.list("/")
        n: str = infos[0].name
    pools = c.pools.list()
    sz: int = pools[0].size


async def asynchronous() -> None:
    async with corral.AsyncClient() as c:
        async with await c.create("t") as sb:
            r: corral.ExecResult = await sb.exec("x")
            p = await sb.spawn("y")
            async for ev in p:
                b: bytes = ev.data
            s = await sb.attach(p.pid)
            async with s:
                await s.send("x")
            vols = await c.volumes.list()
            name: str = vols[0].name
