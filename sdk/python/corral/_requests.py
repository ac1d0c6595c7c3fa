"""The request of every API call, shared by both clients.

``wrap`` arguments turn a sandbox or process description into the calling
client's handle (blocking or asyncio).
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Union

from . import _ops
from ._ops import Params, Request, process_path, sandbox_path, seg
from ._types import CodeContext, Pool, ProcessInfo, Snapshot, Stats, Template, Volume

Wrap = Callable[[Any], Any]


def list_sandboxes(state: Optional[str], metadata: Optional[Mapping[str, str]], wrap: Wrap) -> Request:
    params = []
    if state:
        params.append(("state", state))
    for k, v in (_ops._str_map("metadata", metadata) or {}).items():
        params.append(("metadata", f"{k}={v}"))
    return Request("GET", "/v1/sandboxes", params=params, parse=lambda d: [wrap(x) for x in d or []])


def events(sandbox_id: Optional[str], types: Optional[Sequence[str]]) -> Request:
    params = []
    if sandbox_id:
        params.append(("sandbox_id", sandbox_id))
    if types:
        params.append(("type", ",".join(types)))
    return Request("GET", "/v1/events", params=params)


def act(sandbox_id: str, action: str, wrap: Wrap, body: Any = None) -> Request:
    return Request("POST", sandbox_path(sandbox_id, "/" + action), body={} if body is None else body, parse=wrap)


def deadline_body(timeout: Optional[float]) -> Dict[str, int]:
    return {} if timeout is None else {"timeout": _ops.whole_seconds(timeout)}


def exec_(sandbox_id: str, body: Dict[str, Any]) -> Request:
    return Request("POST", sandbox_path(sandbox_id, "/exec"), body=body)


def spawn(sandbox_id: str, body: Dict[str, Any], open_stdin: bool, tag: Optional[str], wrap: Wrap) -> Request:
    body.update(_ops._prune({"open_stdin": open_stdin, "tag": tag}))
    return Request("POST", sandbox_path(sandbox_id, "/processes"), body=body, parse=wrap)


def pty(sandbox_id: str, cmd: Any, cols: int, rows: int, env: Any, cwd: Any, user: Any, tag: Any, wrap: Wrap) -> Request:
    body = _ops.exec_body(cmd if cmd is not None else ["/bin/sh"], env, cwd, user)
    body["pty"] = {"cols": int(cols), "rows": int(rows)}
    return spawn(sandbox_id, body, False, tag, wrap)


def processes(sandbox_id: str, wrap: Wrap) -> Request:
    return Request("GET", sandbox_path(sandbox_id, "/processes"), parse=lambda d: [wrap(x) for x in d or []])


def process(sandbox_id: str, pid: int, wrap: Wrap) -> Request:
    return Request("GET", process_path(sandbox_id, pid), parse=wrap)


def run_code(sandbox_id: str, body: Dict[str, Any]) -> Request:
    return Request("POST", sandbox_path(sandbox_id, "/code"), body=body)


def create_code_context(sandbox_id: str, language: str, cwd: Optional[str]) -> Request:
    body = {"language": language, "cwd": cwd or ""}
    return Request("POST", sandbox_path(sandbox_id, "/code/contexts"), body=body, parse=_ops.one(CodeContext))


def code_contexts(sandbox_id: str) -> Request:
    return Request("GET", sandbox_path(sandbox_id, "/code/contexts"), parse=_ops.list_of(CodeContext))


def _context_path(sandbox_id: str, context: Union[str, CodeContext], suffix: str = "") -> str:
    cid = context.id if isinstance(context, CodeContext) else context
    return sandbox_path(sandbox_id, "/code/contexts/" + seg(cid) + suffix)


def restart_code_context(sandbox_id: str, context: Union[str, CodeContext]) -> Request:
    return Request("POST", _context_path(sandbox_id, context, "/restart"), body={})


def delete_code_context(sandbox_id: str, context: Union[str, CodeContext]) -> Request:
    return Request("DELETE", _context_path(sandbox_id, context))


def refresh(sandbox_id: str, wrap: Wrap) -> Request:
    return Request("GET", sandbox_path(sandbox_id), parse=wrap)


def snapshot(sandbox_id: str, name: str, metadata: Optional[Mapping[str, str]], volumes: Optional[str]) -> Request:
    body = _ops._prune({"name": name, "metadata": _ops._str_map("metadata", metadata), "volumes": volumes})
    return Request("POST", sandbox_path(sandbox_id, "/snapshots"), body=body, parse=_ops.one(Snapshot))


def fork(sandbox_id: str, count: int, volumes: Optional[str], wrap: Wrap) -> Request:
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"fork count {count!r} must be a positive integer")
    body = _ops._prune({"count": count, "volumes": volumes})
    return Request("POST", sandbox_path(sandbox_id, "/fork"), body=body, parse=lambda d: [wrap(x) for x in d or []])


def set_timeout(sandbox_id: str, timeout: float, wrap: Wrap) -> Request:
    body = {"timeout": _ops.whole_seconds(timeout)}
    return Request("POST", sandbox_path(sandbox_id, "/timeout"), body=body, parse=wrap)


def update(sandbox_id: str, wrap: Wrap, idle_timeout: Optional[float], **fields: Any) -> Request:
    body = _ops._prune(fields)
    if idle_timeout is not None:
        body["idle_timeout"] = _ops.whole_seconds(idle_timeout)
    return Request("PATCH", sandbox_path(sandbox_id), body=body, parse=wrap)


def update_network(sandbox_id: str, network: Any, wrap: Wrap) -> Request:
    return Request("PUT", sandbox_path(sandbox_id, "/network"), body=_ops.network_json(network), parse=wrap)


def stats(sandbox_id: str) -> Request:
    return Request("GET", sandbox_path(sandbox_id, "/stats"), parse=_ops.one(Stats))


# ---- processes ----------------------------------------------------------


def process_info(sandbox_id: str, pid: int) -> Request:
    return Request("GET", process_path(sandbox_id, pid), parse=_ops.one(ProcessInfo))


def output(sandbox_id: str, pid: int, from_offset: int, follow: bool) -> Request:
    if from_offset < 0:
        raise ValueError(f"output offset {from_offset!r} is negative")
    params = []
    if from_offset > 0:
        params.append(("from", str(int(from_offset))))
    if follow:
        params.append(("follow", "true"))
    return Request("GET", process_path(sandbox_id, pid, "/output"), params=params)


def write_stdin(sandbox_id: str, pid: int, data: Any) -> Request:
    return Request(
        "POST", process_path(sandbox_id, pid, "/stdin"), content=_ops.to_bytes(data), content_type="application/octet-stream"
    )


def close_stdin(sandbox_id: str, pid: int) -> Request:
    return Request("DELETE", process_path(sandbox_id, pid, "/stdin"))


def signal(sandbox_id: str, pid: int, sig: str) -> Request:
    return Request("POST", process_path(sandbox_id, pid, "/signal"), body={"signal": str(sig)})


def resize(sandbox_id: str, pid: int, cols: int, rows: int) -> Request:
    return Request("POST", process_path(sandbox_id, pid, "/resize"), body={"cols": int(cols), "rows": int(rows)})


def remove_process(sandbox_id: str, pid: int) -> Request:
    return Request("DELETE", process_path(sandbox_id, pid))


# ---- templates, pools, snapshots, volumes -------------------------------


def _named(kind: str, name: str, suffix: str = "") -> str:
    return f"/v1/{kind}/" + seg(name) + suffix


def list_all(kind: str) -> Request:
    cls = {"templates": Template, "pools": Pool, "snapshots": Snapshot, "volumes": Volume}[kind]
    return Request("GET", "/v1/" + kind, parse=_ops.list_of(cls))


def get_one(kind: str, name: str) -> Request:
    cls = {"templates": Template, "pools": Pool, "snapshots": Snapshot, "volumes": Volume}[kind]
    return Request("GET", _named(kind, name), parse=_ops.one(cls))


def delete_one(kind: str, name: str) -> Request:
    return Request("DELETE", _named(kind, name))


def import_template(name: str, tarball: Any) -> Request:
    return Request("PUT", _named("templates", name), content=tarball, content_type="application/x-tar", parse=_ops.one(Template))


def template_from_snapshot(name: str, snapshot: str) -> Request:
    return Request("POST", _named("templates", name, "/from-snapshot"), body={"snapshot": snapshot}, parse=_ops.one(Template))


def set_pool(name: str, size: int, **fields: Any) -> Request:
    if not isinstance(size, int) or size < 0:
        raise ValueError(f"pool size {size!r} must be a whole number, 0 or more")
    body = _ops._prune(fields)
    body["size"] = size
    return Request("PUT", _named("pools", name), body=body, parse=_ops.one(Pool))


def create_volume(name: str, size_bytes: Optional[int], labels: Optional[Mapping[str, str]]) -> Request:
    body = _ops._prune({"name": name, "size_bytes": size_bytes, "labels": _ops._str_map("labels", labels)})
    return Request("POST", "/v1/volumes", body=body, parse=_ops.one(Volume))


def volume_files(name: str) -> _ops.FileOps:
    return _ops.FileOps(_named("volumes", name, "/files"))


def sandbox_files(sandbox_id: str) -> _ops.FileOps:
    return _ops.FileOps(sandbox_path(sandbox_id, "/files"))


def build_template(name: str, recipe: str, mirror: Optional[str], build_essential: bool, service: Any) -> Request:
    body = _ops._prune({"recipe": recipe, "mirror": mirror, "build_essential": build_essential, "service": service})
    return Request("POST", _named("templates", name, "/build"), body=body)


def pull_template(name: str, ref: str, platform: Optional[str], insecure: bool, service: Any) -> Request:
    body = _ops._prune({"ref": ref, "platform": platform, "insecure": insecure, "service": service})
    return Request("POST", _named("templates", name, "/pull"), body=body)


def dockerfile_build(name: str, dockerfile: Any, context: Any, params: Params) -> Request:
    """A multipart build: the Dockerfile, then (if given) a tar of the
    context, streamed. The boundary is random for each request, so that
    no Dockerfile or context can be made to contain it."""
    boundary = "corral-build-" + uuid.uuid4().hex

    def parts() -> Iterator[bytes]:
        yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"dockerfile\"; filename=\"Dockerfile\"\r\n"
               "Content-Type: application/octet-stream\r\n\r\n").encode()  # fmt: skip
        yield _ops.to_bytes(dockerfile)
        if context is not None:
            yield (f"\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"context\"; filename=\"context.tar\"\r\n"
                   "Content-Type: application/x-tar\r\n\r\n").encode()  # fmt: skip
            yield from _ops.chunks(context)
        yield f"\r\n--{boundary}--\r\n".encode()

    return Request("POST", _named("templates", name, "/build"), params=params, content=parts(),
                   content_type=f"multipart/form-data; boundary={boundary}")  # fmt: skip


def dockerfile_params(
    args: Optional[Mapping[str, str]],
    platform: Optional[str],
    insecure: bool,
    no_cache: bool,
    network: Optional[str],
    allow_domains: Optional[Sequence[str]],
    start: Optional[str],
    ready: Optional[str],
    ready_port: Optional[int],
    ready_url: Optional[str],
    ready_timeout: Optional[float],
    restart: Optional[str],
    no_start: bool,
) -> Params:
    params = [("build_arg", f"{k}={v}") for k, v in sorted((_ops._str_map("args", args) or {}).items())]
    for key, value in [("platform", platform), ("network", network), ("start", start), ("ready", ready),
                       ("ready_url", ready_url), ("restart", restart)]:  # fmt: skip
        if value:
            params.append((key, value))
    params += [("allow_domain", d) for d in allow_domains or []]
    if insecure:
        params.append(("insecure", "true"))
    if no_cache:
        params.append(("no_cache", "true"))
    if ready_port:
        params.append(("ready_port", str(int(ready_port))))
    if ready_timeout:
        params.append(("ready_timeout", repr(float(ready_timeout))))
    if no_start:
        params.append(("no_start", "true"))
    return params


def set_service(name: str, service: Optional[Mapping[str, Any]]) -> Request:
    path = _named("templates", name, "/service")
    if service is None:
        return Request("DELETE", path, parse=_ops.one(Template))
    return Request("PUT", path, body=dict(service), parse=_ops.one(Template))


def capture_ready(name: str, runtime: Optional[str]) -> Request:
    body = {"runtime": runtime} if runtime else {}
    return Request("POST", _named("templates", name, "/ready-snapshot"), body=body, parse=_ops.one(Template))


def drop_ready(name: str, runtime: Optional[str]) -> Request:
    params = [("runtime", runtime)] if runtime else []
    return Request("DELETE", _named("templates", name, "/ready-snapshot"), params=params, parse=_ops.one(Template))


def service_status(sandbox_id: str) -> Request:
    return Request("GET", sandbox_path(sandbox_id, "/service"), parse=dict)


def mount_changes(sandbox_id: str, target: str) -> Request:
    return Request("GET", sandbox_path(sandbox_id, "/mounts/changes"), params=[("target", target)],
                   parse=lambda d: list((d or {}).get("changes") or []))  # fmt: skip


def metrics() -> Request:
    return Request("GET", "/metrics", raw=True, parse=lambda b: b.decode("utf-8", "replace"))
