"""The asyncio client: :class:`AsyncClient`, the twin of
:class:`corral.Client` with the same names, each a coroutine."""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any, AsyncIterator, Callable, Dict, Generic, List, Mapping, Optional, Sequence, TypeVar, Union

import httpx

from . import _errors, _ops, _tar, _wire
from . import _requests as R
from ._attach import AsyncAttachSession
from ._base import ProcessFields, SandboxFields
from ._host import Endpoint
from ._ops import Command, FileOps, Request
from ._types import (
    CodeContext,
    Event,
    ExecResult,
    Execution,
    ExecutionError,
    FileInfo,
    Mount,
    NetworkPolicy,
    OutputEvent,
    Pool,
    ProcessInfo,
    Result,
    Snapshot,
    Stats,
    Template,
    Volume,
    WatchEvent,
)

T = TypeVar("T")
# Callbacks may be plain functions or coroutine functions.
OnText = Optional[Callable[[str], Any]]
Network = Union[None, str, NetworkPolicy, Mapping[str, Any]]


async def _aiter_chunks(data: Any) -> AsyncIterator[bytes]:
    """The chunks of a request body; reading a file object (or the
    iterable of chunks given) happens on a worker thread, off the event
    loop."""
    if isinstance(data, (str, bytes, bytearray, memoryview)):
        yield _ops.to_bytes(data)
        return
    loop = asyncio.get_running_loop()
    it = iter(_ops.chunks(data))
    while True:
        chunk: Optional[bytes] = await loop.run_in_executor(None, next, it, None)
        if chunk is None:
            return
        yield chunk


class AsyncClient:
    """The asyncio twin of :class:`corral.Client`: the same methods and
    arguments, each awaited (``await client.create(...)``), and ``async
    with`` where the blocking client has ``with``. Callbacks may be plain
    functions or coroutine functions."""

    def __init__(self, host: Optional[str] = None, api_key: Optional[str] = None) -> None:
        self._ep = Endpoint(host, api_key)
        self._headers = self._ep.headers()
        self._transport: httpx.AsyncBaseTransport = httpx.AsyncHTTPTransport(uds=self._ep.uds)
        self.templates = AsyncTemplates(self)
        self.pools = AsyncPools(self)
        self.snapshots = AsyncSnapshots(self)
        self.volumes = AsyncVolumes(self)

    @property
    def host(self) -> str:
        return self._ep.host

    async def _send(self, req: Request) -> httpx.Response:
        content = req.content
        if content is not None and not isinstance(content, (bytes, str)):
            content = _aiter_chunks(content)
        try:
            resp = await self._transport.handle_async_request(_wire.http_request(self._ep, self._headers, req, content))
        except httpx.TransportError as e:
            raise _errors.Unavailable(f"corral daemon unreachable: {e}") from e
        if resp.status_code // 100 != 2:
            try:
                body = await resp.aread()
            except httpx.TransportError:
                body = b""
            finally:
                await resp.aclose()
            raise _errors.error_from_response(resp.status_code, body, resp.headers.get("Retry-After"))
        return resp

    async def _call(self, req: Request) -> Any:
        resp = await self._send(req)
        try:
            content = await resp.aread()
        except httpx.TransportError as e:
            raise _errors.Unavailable(f"reading the daemon's answer: {e}") from e
        finally:
            await resp.aclose()
        return _ops.answer(req, content)

    async def _consume(self, req: Request, reader: Any) -> Any:
        resp = await self._send(req)
        try:
            async for line in _lines(resp):
                if not reader.finished:
                    await _ops.ainvoke(reader.feed(_wire.event(line)))
        finally:
            await resp.aclose()
        return reader.result()

    async def create(
        self,
        template: Optional[str] = None,
        *,
        runtime: Optional[str] = None,
        cpus: Optional[float] = None,
        memory_mb: Optional[int] = None,
        pids: Optional[int] = None,
        disk_mb: Optional[int] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Network = None,
        volumes: Optional[Mapping[str, Union[str, Volume]]] = None,
        mounts: Optional[Sequence[Mount]] = None,
        pool: Optional[str] = None,
        idle_timeout: Optional[float] = None,
        on_deadline: Optional[str] = None,
        on_idle: Optional[str] = None,
        from_snapshot: Optional[str] = None,
    ) -> "AsyncSandbox":
        """See :meth:`corral.Client.create`."""
        body = _ops.create_body(
            template, runtime, cpus, memory_mb, pids, disk_mb, timeout, env, metadata, network,
            volumes, mounts, pool, idle_timeout, on_deadline, on_idle, from_snapshot,
        )  # fmt: skip
        return await self._call(Request("POST", "/v1/sandboxes", body=body, parse=self._sandbox))

    async def get(self, sandbox_id: str) -> "AsyncSandbox":
        """See :meth:`corral.Client.get`."""
        return await self._call(R.refresh(sandbox_id, self._sandbox))

    async def list(self, *, state: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None) -> List["AsyncSandbox"]:
        """See :meth:`corral.Client.list`."""
        return await self._call(R.list_sandboxes(state, metadata, self._sandbox))

    async def delete(self, sandbox_id: str) -> None:
        """See :meth:`corral.Client.delete`."""
        await self._call(Request("DELETE", _ops.sandbox_path(sandbox_id)))

    async def run(
        self,
        cmd: Command,
        *,
        template: Optional[str] = None,
        runtime: Optional[str] = None,
        cpus: Optional[float] = None,
        memory_mb: Optional[int] = None,
        disk_mb: Optional[int] = None,
        network: Network = None,
        metadata: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Union[None, str, bytes] = None,
        timeout: Optional[float] = None,
        on_stdout: OnText = None,
        on_stderr: OnText = None,
    ) -> ExecResult:
        """See :meth:`corral.Client.run`."""
        req = _ops.run_request(template, runtime, cpus, memory_mb, disk_mb, network, metadata, env, cmd, cwd, user, stdin, timeout)
        return await self._consume(req, _ops.RunReader(on_stdout, on_stderr))

    async def events(self, *, sandbox_id: Optional[str] = None, types: Optional[Sequence[str]] = None) -> "AsyncStream[Event]":
        """See :meth:`corral.Client.events`."""
        return AsyncStream(await self._send(R.events(sandbox_id, types)), _ops.EventReader())

    async def version(self) -> Dict[str, Any]:
        return await self._call(Request("GET", "/v1/version", parse=dict))

    async def health(self) -> Dict[str, Any]:
        return await self._call(Request("GET", "/v1/health", parse=dict))

    async def runtimes(self) -> List[Dict[str, Any]]:
        return await self._call(Request("GET", "/v1/runtimes", parse=list))

    async def metrics(self) -> str:
        return await self._call(R.metrics())

    async def close(self) -> None:
        """Closes idle connections."""
        await self._transport.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _sandbox(self, data: Any) -> "AsyncSandbox":
        return AsyncSandbox(self, data)


async def _lines(resp: httpx.Response) -> AsyncIterator[bytes]:
    """The non-empty lines of an answer's body as they arrive."""
    buf = _wire.LineBuffer()
    try:
        async for chunk in resp.stream:  # type: ignore[union-attr]
            for line in buf.feed(chunk):
                yield line
    except httpx.TransportError as e:
        raise _errors.Unavailable(f"stream from the daemon broke: {e}") from e
    rest = buf.rest()
    if rest is not None:
        yield rest


class AsyncStream(Generic[T]):
    """The asyncio twin of :class:`corral.Stream`: ``async for`` over it;
    ``aclose`` it (or ``async with``) to stop early."""

    def __init__(self, resp: httpx.Response, reader: Any) -> None:
        self._resp = resp
        self._lines = _lines(resp)
        self._reader = reader

    def __aiter__(self) -> "AsyncStream[T]":
        return self

    async def __anext__(self) -> T:
        # Whatever ends the iteration (the end, an error event, a broken
        # stream) closes the stream.
        try:
            while not self._reader.finished:
                try:
                    line = await self._lines.__anext__()
                except StopAsyncIteration:
                    self._reader.end()
                    break
                item = self._reader.feed(_wire.event(line))
                if item is not None:
                    return item
        except BaseException:
            await self.aclose()
            raise
        await self.aclose()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        await self._resp.aclose()

    async def __aenter__(self) -> "AsyncStream[T]":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncOutputStream(AsyncStream[OutputEvent]):
    """The asyncio twin of :class:`corral.OutputStream`."""

    @property
    def next_offset(self) -> int:
        return self._reader.next_offset

    @property
    def dropped(self) -> int:
        return self._reader.dropped

    @property
    def exit(self) -> Optional[ExecResult]:
        return self._reader.exit


class AsyncSandbox(SandboxFields):
    """The asyncio twin of :class:`corral.Sandbox`; ``async with`` deletes
    it on exit."""

    def __init__(self, client: AsyncClient, data: Mapping[str, Any]) -> None:
        self._client = client
        self._set(data)
        self.files = AsyncFiles(client, R.sandbox_files(self.id))

    def _update(self, data: Any) -> "AsyncSandbox":
        self._set(data)
        return self

    async def exec(
        self,
        cmd: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Union[None, str, bytes] = None,
        timeout: Optional[float] = None,
        on_stdout: OnText = None,
        on_stderr: OnText = None,
        max_output_bytes: Optional[int] = None,
    ) -> ExecResult:
        """See :meth:`corral.Sandbox.exec`."""
        body = _ops.exec_body(cmd, env, cwd, user, stdin, timeout, max_output_bytes)
        return await self._client._consume(R.exec_(self.id, body), _ops.ExecReader(on_stdout, on_stderr))

    async def spawn(
        self,
        cmd: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Union[None, str, bytes] = None,
        open_stdin: bool = False,
        tag: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> "AsyncProcess":
        """See :meth:`corral.Sandbox.spawn`."""
        body = _ops.exec_body(cmd, env, cwd, user, stdin, timeout)
        return await self._client._call(R.spawn(self.id, body, open_stdin, tag, self._process))

    async def pty(
        self,
        cmd: Optional[Command] = None,
        *,
        cols: int = 80,
        rows: int = 24,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        tag: Optional[str] = None,
    ) -> AsyncAttachSession:
        """See :meth:`corral.Sandbox.pty`."""
        proc = await self._client._call(R.pty(self.id, cmd, cols, rows, env, cwd, user, tag, self._process))
        try:
            return await self.attach(proc.pid)
        except BaseException:
            # Nobody could reach the terminal: end the process it started.
            try:
                await proc.kill()
            except _errors.CorralError:
                pass
            raise

    async def processes(self) -> List["AsyncProcess"]:
        return await self._client._call(R.processes(self.id, self._process))

    async def process(self, pid: int) -> "AsyncProcess":
        return await self._client._call(R.process(self.id, pid, self._process))

    async def attach(self, pid: int, *, from_offset: int = 0) -> AsyncAttachSession:
        """See :meth:`corral.Sandbox.attach`."""
        return await AsyncAttachSession.open(self._client._ep, self.id, pid, from_offset, self._client._call)

    def _process(self, data: Any) -> "AsyncProcess":
        return AsyncProcess(self, data)

    async def run_code(
        self,
        code: str,
        language: Optional[str] = "python",
        context: Union[None, str, CodeContext] = None,
        *,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        on_stdout: OnText = None,
        on_stderr: OnText = None,
        on_result: Optional[Callable[[Result], Any]] = None,
        on_error: Optional[Callable[[ExecutionError], Any]] = None,
        max_output_bytes: Optional[int] = None,
    ) -> Execution:
        """See :meth:`corral.Sandbox.run_code`."""
        body = _ops.code_body(code, language, context, env, timeout, max_output_bytes)
        reader = _ops.CodeReader(on_stdout, on_stderr, on_result, on_error)
        return await self._client._consume(R.run_code(self.id, body), reader)

    async def create_code_context(self, language: str = "python", cwd: Optional[str] = None) -> CodeContext:
        return await self._client._call(R.create_code_context(self.id, language, cwd))

    async def code_contexts(self) -> List[CodeContext]:
        return await self._client._call(R.code_contexts(self.id))

    async def restart_code_context(self, context: Union[str, CodeContext]) -> None:
        await self._client._call(R.restart_code_context(self.id, context))

    async def delete_code_context(self, context: Union[str, CodeContext]) -> None:
        await self._client._call(R.delete_code_context(self.id, context))

    async def refresh(self) -> "AsyncSandbox":
        return await self._client._call(R.refresh(self.id, self._update))

    async def pause(self) -> "AsyncSandbox":
        return await self._client._call(R.act(self.id, "pause", self._update))

    async def resume(self, timeout: Optional[float] = None) -> "AsyncSandbox":
        return await self._client._call(R.act(self.id, "resume", self._update, R.deadline_body(timeout)))

    async def stop(self) -> "AsyncSandbox":
        return await self._client._call(R.act(self.id, "stop", self._update))

    async def start(self, timeout: Optional[float] = None) -> "AsyncSandbox":
        return await self._client._call(R.act(self.id, "start", self._update, R.deadline_body(timeout)))

    async def snapshot(
        self, name: str, *, metadata: Optional[Mapping[str, str]] = None, volumes: Optional[str] = None
    ) -> Snapshot:
        return await self._client._call(R.snapshot(self.id, name, metadata, volumes))

    async def fork(self, count: int = 1, *, volumes: Optional[str] = None) -> List["AsyncSandbox"]:
        return await self._client._call(R.fork(self.id, count, volumes, self._client._sandbox))

    async def set_timeout(self, timeout: float) -> "AsyncSandbox":
        return await self._client._call(R.set_timeout(self.id, timeout, self._update))

    async def update(
        self,
        *,
        cpus: Optional[float] = None,
        memory_mb: Optional[int] = None,
        pids: Optional[int] = None,
        idle_timeout: Optional[float] = None,
        on_deadline: Optional[str] = None,
        on_idle: Optional[str] = None,
    ) -> "AsyncSandbox":
        req = R.update(self.id, self._update, idle_timeout, cpus=cpus, memory_mb=memory_mb, pids=pids,
                       on_deadline=on_deadline, on_idle=on_idle)  # fmt: skip
        return await self._client._call(req)

    async def update_network(self, network: Union[str, NetworkPolicy, Mapping[str, Any]]) -> "AsyncSandbox":
        return await self._client._call(R.update_network(self.id, network, self._update))

    async def stats(self) -> Stats:
        return await self._client._call(R.stats(self.id))

    async def service(self) -> Dict[str, Any]:
        return await self._client._call(R.service_status(self.id))

    async def mount_changes(self, target: str) -> List[Dict[str, str]]:
        return await self._client._call(R.mount_changes(self.id, target))

    async def kill(self) -> None:
        await self._client.delete(self.id)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.kill()
        except _errors.NotFound:
            pass


class AsyncProcess(ProcessFields):
    """The asyncio twin of :class:`corral.Process`; ``async for`` over it
    follows its output."""

    def __init__(self, sandbox: AsyncSandbox, info: Any) -> None:
        self._sandbox = sandbox
        self._client = sandbox._client
        self._set_info(sandbox.id, info)

    async def refresh(self) -> ProcessInfo:
        self.info = await self._client._call(R.process_info(self.sandbox_id, self.pid))
        return self.info

    async def wait(self, *, on_stdout: OnText = None, on_stderr: OnText = None) -> ExecResult:
        req = R.output(self.sandbox_id, self.pid, 0, True)
        return await self._client._consume(req, _ops.WaitReader(self.pid, on_stdout, on_stderr))

    async def output(self, from_offset: int = 0, *, follow: bool = False) -> AsyncOutputStream:
        resp = await self._client._send(R.output(self.sandbox_id, self.pid, from_offset, follow))
        return AsyncOutputStream(resp, _ops.OutputReader(self.pid, from_offset, follow))

    async def __aiter__(self) -> AsyncIterator[OutputEvent]:
        async with await self.output(follow=True) as stream:
            async for ev in stream:
                yield ev

    async def write_stdin(self, data: Union[str, bytes]) -> None:
        await self._client._call(R.write_stdin(self.sandbox_id, self.pid, data))

    async def close_stdin(self) -> None:
        await self._client._call(R.close_stdin(self.sandbox_id, self.pid))

    async def kill(self, signal: str = "SIGKILL") -> None:
        await self._client._call(R.signal(self.sandbox_id, self.pid, signal))

    async def resize(self, cols: int, rows: int) -> None:
        await self._client._call(R.resize(self.sandbox_id, self.pid, cols, rows))

    async def attach(self, *, from_offset: int = 0) -> AsyncAttachSession:
        return await self._sandbox.attach(self.pid, from_offset=from_offset)

    async def remove(self) -> None:
        await self._client._call(R.remove_process(self.sandbox_id, self.pid))


class AsyncVolumeFiles:
    """The asyncio twin of :class:`corral.VolumeFiles`."""

    def __init__(self, client: AsyncClient, ops: FileOps) -> None:
        self._client = client
        self._ops = ops

    async def read(self, path: str) -> bytes:
        return await self._client._call(self._ops.read(path))

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: Any, mode: Optional[int] = None) -> FileInfo:
        return await self._client._call(self._ops.write(path, data, mode))

    async def list(self, path: str) -> List[FileInfo]:
        return await self._client._call(self._ops.list(path))

    async def stat(self, path: str) -> FileInfo:
        return await self._client._call(self._ops.stat(path))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except _errors.NotFound:
            return False
        return True

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._client._call(self._ops.remove(path, recursive))

    async def mkdir(self, path: str, *, parents: bool = True) -> FileInfo:
        return await self._client._call(self._ops.mkdir(path, parents))


class AsyncFiles(AsyncVolumeFiles):
    """The asyncio twin of :class:`corral.Files`."""

    async def rename(self, src: str, dst: str) -> FileInfo:
        return await self._client._call(self._ops.rename(src, dst))

    async def upload(self, local_dir: str, remote_dir: str) -> None:
        """See :meth:`corral.Files.upload`; the archive is built on a
        worker thread."""
        archive = await asyncio.get_running_loop().run_in_executor(None, _tar.pack, local_dir)
        with archive:
            await self._client._call(self._ops.put_archive(remote_dir, archive))

    async def download(self, remote_dir: str, local_dir: str) -> None:
        """See :meth:`corral.Files.download`; spooling the archive and
        extracting it run on worker threads."""
        resp = await self._client._send(self._ops.get_archive(remote_dir))
        loop = asyncio.get_running_loop()
        with tempfile.SpooledTemporaryFile(max_size=_tar.SPOOL) as archive:
            try:
                async for chunk in resp.stream:  # type: ignore[union-attr]
                    # Past SPOOL bytes the spool is a file on disk.
                    await loop.run_in_executor(None, archive.write, chunk)
            except httpx.TransportError as e:
                raise _errors.Unavailable(f"download broke: {e}") from e
            finally:
                await resp.aclose()
            archive.seek(0)
            await loop.run_in_executor(None, _tar.extract, archive, local_dir)

    async def watch(self, path: str, *, recursive: bool = False) -> AsyncStream[WatchEvent]:
        return AsyncStream(await self._client._send(self._ops.watch(path, recursive)), _ops.WatchReader())


class _AsyncNamed(Generic[T]):
    """The list, get and delete of one kind of named object."""

    _kind = ""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> List[T]:
        return await self._c._call(R.list_all(self._kind))

    async def get(self, name: str) -> T:
        return await self._c._call(R.get_one(self._kind, name))

    async def delete(self, name: str) -> None:
        await self._c._call(R.delete_one(self._kind, name))


class AsyncTemplates(_AsyncNamed[Template]):
    """The asyncio twin of ``Client.templates``."""

    _kind = "templates"

    async def import_tar(self, name: str, tarball: Any) -> Template:
        return await self._c._call(R.import_template(name, tarball))

    async def from_snapshot(self, name: str, snapshot: str) -> Template:
        return await self._c._call(R.template_from_snapshot(name, snapshot))

    async def build(
        self,
        name: str,
        recipe: str,
        *,
        mirror: Optional[str] = None,
        build_essential: bool = False,
        service: Optional[Mapping[str, Any]] = None,
        on_log: OnText = None,
    ) -> Template:
        req = R.build_template(name, recipe, mirror, build_essential, service)
        return await self._c._consume(req, _ops.BuildReader(on_log, None))

    async def pull(
        self,
        name: str,
        ref: str,
        *,
        platform: Optional[str] = None,
        insecure: bool = False,
        service: Optional[Mapping[str, Any]] = None,
        on_log: OnText = None,
        on_progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
    ) -> Template:
        req = R.pull_template(name, ref, platform, insecure, service)
        return await self._c._consume(req, _ops.BuildReader(on_log, on_progress))

    async def build_dockerfile(
        self,
        name: str,
        dockerfile: Union[str, bytes],
        *,
        context_dir: Optional[str] = None,
        args: Optional[Mapping[str, str]] = None,
        platform: Optional[str] = None,
        insecure: bool = False,
        no_cache: bool = False,
        network: Optional[str] = None,
        allow_domains: Optional[Sequence[str]] = None,
        start: Optional[str] = None,
        ready: Optional[str] = None,
        ready_port: Optional[int] = None,
        ready_url: Optional[str] = None,
        ready_timeout: Optional[float] = None,
        restart: Optional[str] = None,
        no_start: bool = False,
        on_log: OnText = None,
        on_progress: Optional[Callable[[Dict[str, Any]], Any]] = None,
    ) -> Template:
        """See :meth:`corral.Client.templates.build_dockerfile`; the
        context's archive is built on a worker thread."""
        params = R.dockerfile_params(args, platform, insecure, no_cache, network, allow_domains, start, ready,
                                     ready_port, ready_url, ready_timeout, restart, no_start)  # fmt: skip
        context = None
        if context_dir is not None:
            context = await asyncio.get_running_loop().run_in_executor(None, _tar.pack, context_dir)
        try:
            req = R.dockerfile_build(name, dockerfile, context, params)
            return await self._c._consume(req, _ops.BuildReader(on_log, on_progress))
        finally:
            if context is not None:
                context.close()

    async def set_service(self, name: str, service: Optional[Mapping[str, Any]]) -> Template:
        return await self._c._call(R.set_service(name, service))

    async def capture_ready(self, name: str, runtime: Optional[str] = None) -> Template:
        return await self._c._call(R.capture_ready(name, runtime))

    async def drop_ready(self, name: str, runtime: Optional[str] = None) -> Template:
        return await self._c._call(R.drop_ready(name, runtime))


class AsyncPools(_AsyncNamed[Pool]):
    """The asyncio twin of ``Client.pools``."""

    _kind = "pools"

    async def set(
        self,
        name: str,
        *,
        template: str,
        size: int,
        runtime: Optional[str] = None,
        cpus: Optional[float] = None,
        memory_mb: Optional[int] = None,
        pids: Optional[int] = None,
        disk_mb: Optional[int] = None,
        network: Optional[str] = None,
    ) -> Pool:
        return await self._c._call(R.set_pool(name, size, template=template, runtime=runtime, cpus=cpus,
                                              memory_mb=memory_mb, pids=pids, disk_mb=disk_mb, network=network))  # fmt: skip


class AsyncSnapshots(_AsyncNamed[Snapshot]):
    """The asyncio twin of ``Client.snapshots``."""

    _kind = "snapshots"


class AsyncVolumes(_AsyncNamed[Volume]):
    """The asyncio twin of ``Client.volumes``."""

    _kind = "volumes"

    async def create(
        self, name: str, *, size_bytes: Optional[int] = None, labels: Optional[Mapping[str, str]] = None
    ) -> Volume:
        return await self._c._call(R.create_volume(name, size_bytes, labels))

    def files(self, name: str) -> AsyncVolumeFiles:
        return AsyncVolumeFiles(self._c, R.volume_files(name))
