"""A fake daemon for unit tests: an httpx transport answering from a
handler, plugged into a client in place of its connection."""

from __future__ import annotations

import json
from typing import Any, Callable, List

import httpx

import corral


def ndjson(*events: Any) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def sandbox_json(sid: str = "sb1", state: str = "running") -> dict:
    return {"id": sid, "template": "busybox", "runtime": "runc", "state": state, "cpus": 1, "memory_mb": 512,
            "created_at": "2026-01-02T03:04:05.123456789Z"}


class Recorder:
    """Records the requests a client sends and answers with handler."""

    def __init__(self, handler: Callable[[httpx.Request], httpx.Response]) -> None:
        self.handler = handler
        self.requests: List[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.handler(request)

    def body(self, i: int = -1) -> Any:
        return json.loads(self.requests[i].content)


def client(handler: Callable[[httpx.Request], httpx.Response], api_key: str = "") -> "tuple[corral.Client, Recorder]":
    rec = Recorder(handler)
    c = corral.Client("http://corral.test:1", api_key=api_key or None)
    c._transport = httpx.MockTransport(rec)
    return c, rec


def async_client(handler: Callable[[httpx.Request], httpx.Response]) -> "tuple[corral.AsyncClient, Recorder]":
    rec = Recorder(handler)
    c = corral.AsyncClient("http://corral.test:1")
    c._transport = httpx.MockTransport(rec)
    return c, rec
