"""The blocking client: :class:`Client`, :class:`Sandbox` and their parts."""

from __future__ import annotations

import tempfile
from typing import Any, Callable, Dict, Generic, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union

import httpx

from . import _errors, _ops, _tar, _wire
from . import _requests as R
from ._attach import AttachSession
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
OnText = Optional[Callable[[str], Any]]
Network = Union[None, str, NetworkPolicy, Mapping[str, Any]]


class Client:
    """A connection to one Corral daemon; safe to share between threads.

    ``host`` is ``"unix:///path/to.sock"`` or ``"http(s)://host:port"``
    (default: ``CORRAL_HOST``, else the daemon's default socket) and
    ``api_key`` the bearer key (default: ``CORRAL_API_KEY``; the local unix
    socket needs none). Use it as a context manager, or :meth:`close` it.

    Templates, pools, snapshots and volumes are managed through
    :attr:`templates`, :attr:`pools`, :attr:`snapshots` and :attr:`volumes`.
    """

    def __init__(self, host: Optional[str] = None, api_key: Optional[str] = None) -> None:
        self._ep = Endpoint(host, api_key)
        self._headers = self._ep.headers()
        self._transport: httpx.BaseTransport = httpx.HTTPTransport(uds=self._ep.uds)
        self.templates = Templates(self)
        self.pools = Pools(self)
        self.snapshots = Snapshots(self)
        self.volumes = Volumes(self)

    @property
    def host(self) -> str:
        """The daemon's address this client uses."""
        return self._ep.host

    # ---- transport ----------------------------------------------------

    def _send(self, req: Request) -> httpx.Response:
        """Sends req and returns the answer, its body unread, when its
        status is 2xx; other statuses raise the error they carry."""
        content = req.content
        if content is not None and not isinstance(content, (bytes, str)):
            content = _ops.chunks(content)
        try:
            resp = self._transport.handle_request(_wire.http_request(self._ep, self._headers, req, content))
        except httpx.TransportError as e:
            raise _errors.Unavailable(f"corral daemon unreachable: {e}") from e
        if resp.status_code // 100 != 2:
            try:
                body = resp.read()
            except httpx.TransportError:
                body = b""
            finally:
                resp.close()
            raise _errors.error_from_response(resp.status_code, body, resp.headers.get("Retry-After"))
        return resp

    def _call(self, req: Request) -> Any:
        resp = self._send(req)
        try:
            content = resp.read()
        except httpx.TransportError as e:
            raise _errors.Unavailable(f"reading the daemon's answer: {e}") from e
        finally:
            resp.close()
        return _ops.answer(req, content)

    def _consume(self, req: Request, reader: Any) -> Any:
        """Reads a stream to its end, calling callbacks as the reader asks,
        and returns the reader's result. Lines after the reader's last
        event are read and dropped (the daemon ends the stream right
        after it), so that the connection can be used again."""
        resp = self._send(req)
        try:
            for line in _lines(resp):
                if not reader.finished:
                    _ops.invoke(reader.feed(_wire.event(line)))
        finally:
            resp.close()
        return reader.result()

    # ---- sandboxes ----------------------------------------------------

    def create(
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
    ) -> "Sandbox":
        """Creates a sandbox and returns it once it runs.

        Unset arguments take the daemon's defaults. ``timeout`` is the
        sandbox's lifetime in seconds (``NO_TIMEOUT`` asks for no deadline
        where the daemon allows it); ``network`` is a mode name (``"none"``,
        ``"allowlist"``, ``"open"``) or a :class:`NetworkPolicy`;
        ``volumes`` maps a path in the sandbox to a volume (its name or a
        :class:`Volume`); ``mounts`` are host directories the daemon's
        operator allows. ``idle_timeout`` fires ``on_idle`` (``"destroy"``,
        ``"pause"`` or ``"stop"``) after that many seconds without
        activity. ``from_snapshot`` starts from a snapshot.

        Raises :class:`Busy` when the daemon is at capacity, with
        ``retry_after`` set.
        """
        body = _ops.create_body(
            template, runtime, cpus, memory_mb, pids, disk_mb, timeout, env, metadata, network,
            volumes, mounts, pool, idle_timeout, on_deadline, on_idle, from_snapshot,
        )  # fmt: skip
        return self._call(Request("POST", "/v1/sandboxes", body=body, parse=self._sandbox))

    def get(self, sandbox_id: str) -> "Sandbox":
        """Returns an existing sandbox (:class:`NotFound` if there is none)."""
        return self._call(R.refresh(sandbox_id, self._sandbox))

    def list(self, *, state: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None) -> List["Sandbox"]:
        """Lists sandboxes, oldest first: those with every given metadata
        pair, and in ``state`` if given."""
        return self._call(R.list_sandboxes(state, metadata, self._sandbox))

    def delete(self, sandbox_id: str) -> None:
        """Destroys a sandbox."""
        self._call(Request("DELETE", _ops.sandbox_path(sandbox_id)))

    def run(
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
        """Creates a sandbox, runs one command in it and deletes it, in one
        round trip (like ``corral run``). ``timeout`` bounds the command
        (seconds); the other arguments are those of :meth:`create` and
        :meth:`Sandbox.exec`. The sandbox is deleted also when the command
        fails or this call is interrupted."""
        req = _ops.run_request(template, runtime, cpus, memory_mb, disk_mb, network, metadata, env, cmd, cwd, user, stdin, timeout)
        return self._consume(req, _ops.RunReader(on_stdout, on_stderr))

    def events(self, *, sandbox_id: Optional[str] = None, types: Optional[Sequence[str]] = None) -> "Stream[Event]":
        """Subscribes to lifecycle events; every change after this returns
        is delivered. Iterate the stream; close it when done."""
        return Stream(self._send(R.events(sandbox_id, types)), _ops.EventReader())

    # ---- the daemon ---------------------------------------------------

    def version(self) -> Dict[str, Any]:
        """The daemon's version, storage backend and runtimes."""
        return self._call(Request("GET", "/v1/version", parse=dict))

    def health(self) -> Dict[str, Any]:
        """The daemon's health: ``ok`` and any ``problems``."""
        return self._call(Request("GET", "/v1/health", parse=dict))

    def runtimes(self) -> List[Dict[str, Any]]:
        """The runtimes the daemon offers, with their capabilities."""
        return self._call(Request("GET", "/v1/runtimes", parse=list))

    def metrics(self) -> str:
        """The daemon's metrics in the Prometheus text format."""
        return self._call(R.metrics())

    def close(self) -> None:
        """Closes idle connections."""
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _sandbox(self, data: Any) -> "Sandbox":
        return Sandbox(self, data)


def _lines(resp: httpx.Response) -> Iterator[bytes]:
    """The non-empty lines of an answer's body as they arrive."""
    buf = _wire.LineBuffer()
    try:
        for chunk in resp.stream:  # type: ignore[union-attr]
            yield from buf.feed(chunk)
    except httpx.TransportError as e:
        raise _errors.Unavailable(f"stream from the daemon broke: {e}") from e
    rest = buf.rest()
    if rest is not None:
        yield rest


class Stream(Generic[T]):
    """An open stream of items (output chunks, file changes, events):
    iterate it; close it (or use ``with``) to stop early."""

    def __init__(self, resp: httpx.Response, reader: Any) -> None:
        self._resp = resp
        self._lines = _lines(resp)
        self._reader = reader

    def __iter__(self) -> "Stream[T]":
        return self

    def __next__(self) -> T:
        # Whatever ends the iteration (the end, an error event, a broken
        # stream) closes the stream.
        try:
            while not self._reader.finished:
                line = next(self._lines, None)
                if line is None:
                    self._reader.end()
                    break
                item = self._reader.feed(_wire.event(line))
                if item is not None:
                    return item
        except BaseException:
            self.close()
            raise
        self.close()
        raise StopIteration

    def close(self) -> None:
        self._resp.close()

    def __enter__(self) -> "Stream[T]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class OutputStream(Stream[OutputEvent]):
    """A process's output from an offset. After iterating,
    :attr:`next_offset` is where to continue, :attr:`dropped` counts bytes
    no longer buffered, and :attr:`exit` is how the process ended (None
    while it runs)."""

    @property
    def next_offset(self) -> int:
        return self._reader.next_offset

    @property
    def dropped(self) -> int:
        return self._reader.dropped

    @property
    def exit(self) -> Optional[ExecResult]:
        return self._reader.exit


class Sandbox(SandboxFields):
    """A sandbox. Its fields are the daemon's last report; its methods act
    on it. As a context manager it deletes the sandbox on exit.

    ``files`` reads and writes its files.
    """

    def __init__(self, client: Client, data: Mapping[str, Any]) -> None:
        self._client = client
        self._set(data)
        self.files = Files(client, R.sandbox_files(self.id))

    def _update(self, data: Any) -> "Sandbox":
        self._set(data)
        return self

    # ---- commands -----------------------------------------------------

    def exec(
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
        """Runs a command and returns how it ended, with its output.

        ``cmd`` is a list of arguments, or a string the shell runs.
        ``stdin`` is written to it, then closed. ``timeout`` kills it after
        that many seconds. ``on_stdout`` and ``on_stderr`` receive output
        as it arrives (text, never splitting a character). A non-zero exit
        is not an error; a command that cannot start is (:class:`NotFound`
        for a missing program).
        """
        body = _ops.exec_body(cmd, env, cwd, user, stdin, timeout, max_output_bytes)
        return self._client._consume(R.exec_(self.id, body), _ops.ExecReader(on_stdout, on_stderr))

    def spawn(
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
    ) -> "Process":
        """Starts a background process and returns at once. It belongs to
        the sandbox: it keeps running when this client goes away, its last
        1 MiB of output is kept, and any client can re-attach to it by
        PID. ``open_stdin`` keeps stdin open for :meth:`Process.write_stdin`.
        """
        body = _ops.exec_body(cmd, env, cwd, user, stdin, timeout)
        return self._client._call(R.spawn(self.id, body, open_stdin, tag, self._process))

    def pty(
        self,
        cmd: Optional[Command] = None,
        *,
        cols: int = 80,
        rows: int = 24,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        tag: Optional[str] = None,
    ) -> AttachSession:
        """Starts ``cmd`` (default ``/bin/sh``) on a new terminal of
        ``cols`` x ``rows`` and attaches to it: :meth:`AttachSession.send`
        types, iterating reads the screen's bytes, ``resize`` changes the
        size. Closing the session leaves the process running; ``kill`` ends
        it. When attaching fails, the process is killed and the error
        raised."""
        proc = self._client._call(R.pty(self.id, cmd, cols, rows, env, cwd, user, tag, self._process))
        try:
            return self.attach(proc.pid)
        except BaseException:
            # Nobody could reach the terminal: end the process it started.
            try:
                proc.kill()
            except _errors.CorralError:
                pass
            raise

    def processes(self) -> List["Process"]:
        """The sandbox's running processes and the exited ones it keeps."""
        return self._client._call(R.processes(self.id, self._process))

    def process(self, pid: int) -> "Process":
        """The process ``pid`` (:class:`NotFound` if the sandbox has none)."""
        return self._client._call(R.process(self.id, pid, self._process))

    def attach(self, pid: int, *, from_offset: int = 0) -> AttachSession:
        """Connects to process ``pid`` over a WebSocket: its output from
        ``from_offset`` (what is still buffered, then live), its stdin, its
        terminal size and signals. Closing the session leaves the process
        running."""
        return AttachSession(self._client._ep, self.id, pid, from_offset, self._client._call)

    def _process(self, data: Any) -> "Process":
        return Process(self, data)

    # ---- code interpreter ---------------------------------------------

    def run_code(
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
        """Runs code in the sandbox's code interpreter (a sandbox of a
        code-interpreter template) and returns what it printed and produced.

        ``context`` (a :class:`CodeContext` or its ID) runs the code there,
        with the variables earlier runs left; otherwise the default context
        of ``language`` (``"python"``, ``"javascript"``, ``"bash"``) does.
        Code that raises is not an exception here: see
        :attr:`Execution.error`. :class:`FailedPrecondition` means the
        sandbox has no interpreter, :class:`NotFound` an unknown context.
        """
        body = _ops.code_body(code, language, context, env, timeout, max_output_bytes)
        reader = _ops.CodeReader(on_stdout, on_stderr, on_result, on_error)
        return self._client._consume(R.run_code(self.id, body), reader)

    def create_code_context(self, language: str = "python", cwd: Optional[str] = None) -> CodeContext:
        """Starts a new context (kernel) for language in cwd (default:
        the user's home)."""
        return self._client._call(R.create_code_context(self.id, language, cwd))

    def code_contexts(self) -> List[CodeContext]:
        """The code interpreter's contexts."""
        return self._client._call(R.code_contexts(self.id))

    def restart_code_context(self, context: Union[str, CodeContext]) -> None:
        """Starts a context's kernel anew: its variables are gone."""
        self._client._call(R.restart_code_context(self.id, context))

    def delete_code_context(self, context: Union[str, CodeContext]) -> None:
        """Stops a context."""
        self._client._call(R.delete_code_context(self.id, context))

    # ---- lifecycle ----------------------------------------------------

    def refresh(self) -> "Sandbox":
        """Reads the sandbox's description again."""
        return self._client._call(R.refresh(self.id, self._update))

    def pause(self) -> "Sandbox":
        """Freezes every process of the sandbox until :meth:`resume`."""
        return self._client._call(R.act(self.id, "pause", self._update))

    def resume(self, timeout: Optional[float] = None) -> "Sandbox":
        """Thaws a paused sandbox; its deadline becomes now + timeout
        seconds (None: the daemon's default, ``NO_TIMEOUT``: none)."""
        return self._client._call(R.act(self.id, "resume", self._update, R.deadline_body(timeout)))

    def stop(self) -> "Sandbox":
        """Ends every process and frees memory and CPU; files, network
        policy, environment and ID stay until :meth:`start`."""
        return self._client._call(R.act(self.id, "stop", self._update))

    def start(self, timeout: Optional[float] = None) -> "Sandbox":
        """Boots a stopped sandbox again on its files; the deadline is as
        with :meth:`resume`."""
        return self._client._call(R.act(self.id, "start", self._update, R.deadline_body(timeout)))

    def snapshot(self, name: str, *, metadata: Optional[Mapping[str, str]] = None, volumes: Optional[str] = None) -> Snapshot:
        """Saves the sandbox as snapshot ``name``: its files, and with a
        memory-capable runtime (gVisor) its processes too. ``volumes`` is
        ``"share"`` or ``"copy"`` when the sandbox mounts volumes."""
        return self._client._call(R.snapshot(self.id, name, metadata, volumes))

    def fork(self, count: int = 1, *, volumes: Optional[str] = None) -> List["Sandbox"]:
        """Makes ``count`` copies of the sandbox: with a memory-capable
        runtime they continue its processes, otherwise they start fresh on
        a copy of its files."""
        return self._client._call(R.fork(self.id, count, volumes, self._client._sandbox))

    def set_timeout(self, timeout: float) -> "Sandbox":
        """Sets the deadline to now + timeout seconds (``NO_TIMEOUT``
        removes it where the daemon allows)."""
        return self._client._call(R.set_timeout(self.id, timeout, self._update))

    def update(
        self,
        *,
        cpus: Optional[float] = None,
        memory_mb: Optional[int] = None,
        pids: Optional[int] = None,
        idle_timeout: Optional[float] = None,
        on_deadline: Optional[str] = None,
        on_idle: Optional[str] = None,
    ) -> "Sandbox":
        """Changes CPU, memory and pids limits while the sandbox runs, and
        its idle timeout (0 turns it off) and timer actions."""
        req = R.update(self.id, self._update, idle_timeout, cpus=cpus, memory_mb=memory_mb, pids=pids,
                       on_deadline=on_deadline, on_idle=on_idle)  # fmt: skip
        return self._client._call(req)

    def update_network(self, network: Union[str, NetworkPolicy, Mapping[str, Any]]) -> "Sandbox":
        """Replaces the network policy; it applies at once to new
        connections. Switching to or from ``"none"`` raises
        :class:`FailedPrecondition`."""
        return self._client._call(R.update_network(self.id, network, self._update))

    def stats(self) -> Stats:
        """The sandbox's memory, CPU and pids readings."""
        return self._client._call(R.stats(self.id))

    def service(self) -> Dict[str, Any]:
        """The state of the template's service in this sandbox (state,
        pid, restarts, ready_at, ...); :class:`NotFound` without one."""
        return self._client._call(R.service_status(self.id))

    def mount_changes(self, target: str) -> List[Dict[str, str]]:
        """What the sandbox changed under its copy-on-write mount at
        ``target``: ``{"path", "kind"}`` with kind added, modified or
        deleted."""
        return self._client._call(R.mount_changes(self.id, target))

    def kill(self) -> None:
        """Deletes the sandbox with everything in it."""
        self._client.delete(self.id)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        except _errors.NotFound:
            pass


class Process(ProcessFields):
    """A background process of a sandbox (see :meth:`Sandbox.spawn`).
    ``info`` is its description as last read; iterating the process
    follows its output from the start until it exits."""

    def __init__(self, sandbox: Sandbox, info: Any) -> None:
        self._sandbox = sandbox
        self._client = sandbox._client
        self._set_info(sandbox.id, info)

    def refresh(self) -> ProcessInfo:
        """Reads the process's description again."""
        self.info = self._client._call(R.process_info(self.sandbox_id, self.pid))
        return self.info

    def wait(self, *, on_stdout: OnText = None, on_stderr: OnText = None) -> ExecResult:
        """Waits for the process to exit and returns how it ended with its
        output (all that is still buffered, from the start); the callbacks
        see that output as it arrives."""
        req = R.output(self.sandbox_id, self.pid, 0, True)
        return self._client._consume(req, _ops.WaitReader(self.pid, on_stdout, on_stderr))

    def output(self, from_offset: int = 0, *, follow: bool = False) -> OutputStream:
        """The output from byte ``from_offset`` of all the process wrote:
        what is buffered, and with ``follow`` live output until it exits."""
        resp = self._client._send(R.output(self.sandbox_id, self.pid, from_offset, follow))
        return OutputStream(resp, _ops.OutputReader(self.pid, from_offset, follow))

    def __iter__(self) -> Iterator[OutputEvent]:
        with self.output(follow=True) as stream:
            yield from stream

    def write_stdin(self, data: Union[str, bytes]) -> None:
        """Writes data to the process's stdin (spawned with
        ``open_stdin=True``); stdin stays open."""
        self._client._call(R.write_stdin(self.sandbox_id, self.pid, data))

    def close_stdin(self) -> None:
        """Closes stdin, so that the process reads end of file."""
        self._client._call(R.close_stdin(self.sandbox_id, self.pid))

    def kill(self, signal: str = "SIGKILL") -> None:
        """Sends a signal (``"SIGTERM"``, ``"TERM"`` or ``"15"``; default
        SIGKILL) to the process's group."""
        self._client._call(R.signal(self.sandbox_id, self.pid, signal))

    def resize(self, cols: int, rows: int) -> None:
        """Sets the terminal size of a PTY process."""
        self._client._call(R.resize(self.sandbox_id, self.pid, cols, rows))

    def attach(self, *, from_offset: int = 0) -> AttachSession:
        """Connects to the process over a WebSocket (see
        :meth:`Sandbox.attach`)."""
        return self._sandbox.attach(self.pid, from_offset=from_offset)

    def remove(self) -> None:
        """Kills the process if it runs and forgets it, its output and its
        exit status."""
        self._client._call(R.remove_process(self.sandbox_id, self.pid))


class VolumeFiles:
    """The files of a volume (``client.volumes.files(name)``): what the
    daemon offers for volumes, which is also the base of a sandbox's
    :class:`Files`. Paths are absolute inside it."""

    def __init__(self, client: Client, ops: FileOps) -> None:
        self._client = client
        self._ops = ops

    def read(self, path: str) -> bytes:
        """The whole content of a file."""
        return self._client._call(self._ops.read(path))

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A file's content decoded as text."""
        return self.read(path).decode(encoding)

    def write(self, path: str, data: Any, mode: Optional[int] = None) -> FileInfo:
        """Writes data (str, bytes or a binary file object, streamed) to a
        file, creating parent directories; ``mode`` such as ``0o755``."""
        return self._client._call(self._ops.write(path, data, mode))

    def list(self, path: str) -> List[FileInfo]:
        """A directory's entries, sorted by name."""
        return self._client._call(self._ops.list(path))

    def stat(self, path: str) -> FileInfo:
        """Describes one file (:class:`NotFound` if it does not exist)."""
        return self._client._call(self._ops.stat(path))

    def exists(self, path: str) -> bool:
        """Whether something exists at path."""
        try:
            self.stat(path)
        except _errors.NotFound:
            return False
        return True

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Deletes a file, or with ``recursive`` a directory tree."""
        self._client._call(self._ops.remove(path, recursive))

    def mkdir(self, path: str, *, parents: bool = True) -> FileInfo:
        """Creates a directory (and its parents unless ``parents=False``)."""
        return self._client._call(self._ops.mkdir(path, parents))


class Files(VolumeFiles):
    """The files of a sandbox (``sb.files``): those of
    :class:`VolumeFiles`, and rename, directory upload and download, and
    watch. Paths are absolute inside it."""

    def rename(self, src: str, dst: str) -> FileInfo:
        """Moves a file or directory."""
        return self._client._call(self._ops.rename(src, dst))

    def upload(self, local_dir: str, remote_dir: str) -> None:
        """Copies the contents of a local directory into ``remote_dir``
        (created if missing): regular files, directories and symbolic
        links, with their permission bits; files belong to root there."""
        with _tar.pack(local_dir) as archive:
            self._client._call(self._ops.put_archive(remote_dir, archive))

    def download(self, remote_dir: str, local_dir: str) -> None:
        """Copies ``remote_dir`` (a directory's contents, or a file) into
        ``local_dir``, created if missing. The archive is untrusted: an
        entry that would leave ``local_dir`` or be written through a
        symbolic link, and a link that may lead outside it, raise
        ValueError; setuid, setgid and sticky bits are dropped."""
        resp = self._client._send(self._ops.get_archive(remote_dir))
        with tempfile.SpooledTemporaryFile(max_size=_tar.SPOOL) as archive:
            try:
                for chunk in resp.stream:  # type: ignore[union-attr]
                    archive.write(chunk)
            except httpx.TransportError as e:
                raise _errors.Unavailable(f"download broke: {e}") from e
            finally:
                resp.close()
            archive.seek(0)
            _tar.extract(archive, local_dir)

    def watch(self, path: str, *, recursive: bool = False) -> Stream[WatchEvent]:
        """Follows changes under the directory ``path``: iterate the stream
        for :class:`WatchEvent` values; close it to stop. The watch is in
        place a moment after this returns: changes made at once may be
        missed."""
        return Stream(self._client._send(self._ops.watch(path, recursive)), _ops.WatchReader())


class _Named(Generic[T]):
    """The list, get and delete of one kind of named object."""

    _kind = ""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> List[T]:
        """All of them, by name."""
        return self._c._call(R.list_all(self._kind))

    def get(self, name: str) -> T:
        """One of them (:class:`NotFound` if there is none)."""
        return self._c._call(R.get_one(self._kind, name))

    def delete(self, name: str) -> None:
        """Deletes one of them."""
        self._c._call(R.delete_one(self._kind, name))


class Templates(_Named[Template]):
    """Templates: the root file systems sandboxes start from
    (``client.templates``)."""

    _kind = "templates"

    def import_tar(self, name: str, tarball: Any) -> Template:
        """Makes template ``name`` from a tar (plain or gzip) of a root
        file system or an image, as bytes or a binary file object."""
        return self._c._call(R.import_template(name, tarball))

    def from_snapshot(self, name: str, snapshot: str) -> Template:
        """Makes template ``name`` from a snapshot's files."""
        return self._c._call(R.template_from_snapshot(name, snapshot))

    def build(
        self,
        name: str,
        recipe: str,
        *,
        mirror: Optional[str] = None,
        build_essential: bool = False,
        service: Optional[Mapping[str, Any]] = None,
        on_log: OnText = None,
    ) -> Template:
        """Builds template ``name`` on the daemon from a recipe
        (``"debian"``, ``"code-interpreter"``, ``"busybox"``); ``on_log``
        gets its log lines as they come."""
        return self._c._consume(R.build_template(name, recipe, mirror, build_essential, service), _ops.BuildReader(on_log, None))

    def pull(
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
        """Makes template ``name`` from a registry image (``ref`` such as
        ``"python:3.12"``), without a Docker daemon."""
        return self._c._consume(R.pull_template(name, ref, platform, insecure, service), _ops.BuildReader(on_log, on_progress))

    def build_dockerfile(
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
        """Builds template ``name`` from a Dockerfile's text, with the
        local directory ``context_dir`` as its context; unchanged steps
        are cached. ``network`` and ``allow_domains`` are what RUN steps
        may reach; ``start``, ``ready*`` and ``restart`` make the
        template's service (``no_start`` keeps CMD from starting)."""
        params = R.dockerfile_params(args, platform, insecure, no_cache, network, allow_domains, start, ready,
                                     ready_port, ready_url, ready_timeout, restart, no_start)  # fmt: skip
        context = _tar.pack(context_dir) if context_dir is not None else None
        try:
            return self._c._consume(R.dockerfile_build(name, dockerfile, context, params), _ops.BuildReader(on_log, on_progress))
        finally:
            if context is not None:
                context.close()

    def set_service(self, name: str, service: Optional[Mapping[str, Any]]) -> Template:
        """Replaces the service of template ``name`` (``{"cmd": [...],
        "ready": {"port": 8000}, "restart": "on-failure"}``); None removes
        it. Sandboxes made afterwards start the new service."""
        return self._c._call(R.set_service(name, service))

    def capture_ready(self, name: str, runtime: Optional[str] = None) -> Template:
        """Saves a sandbox of the template, service ready, with its
        memory; later sandboxes on that runtime start from it."""
        return self._c._call(R.capture_ready(name, runtime))

    def drop_ready(self, name: str, runtime: Optional[str] = None) -> Template:
        """Removes the template's ready snapshot on runtime."""
        return self._c._call(R.drop_ready(name, runtime))


class Pools(_Named[Pool]):
    """Warm pools of ready sandboxes (``client.pools``); deleting a pool
    deletes the sandboxes it holds ready."""

    _kind = "pools"

    def set(
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
        """Creates or changes pool ``name``, which keeps ``size`` sandboxes
        of this shape ready; :meth:`Client.create` with the same shape (or
        ``pool=name``) claims one."""
        return self._c._call(R.set_pool(name, size, template=template, runtime=runtime, cpus=cpus, memory_mb=memory_mb,
                                        pids=pids, disk_mb=disk_mb, network=network))  # fmt: skip


class Snapshots(_Named[Snapshot]):
    """Snapshots of sandboxes (``client.snapshots``); make them with
    :meth:`Sandbox.snapshot`, start from them with
    ``client.create(from_snapshot=name)``."""

    _kind = "snapshots"


class Volumes(_Named[Volume]):
    """Volumes: named directories with their own quota that sandboxes
    mount (``client.volumes``); only a volume no sandbox mounts can be
    deleted."""

    _kind = "volumes"

    def create(self, name: str, *, size_bytes: Optional[int] = None, labels: Optional[Mapping[str, str]] = None) -> Volume:
        """Makes an empty volume (:class:`AlreadyExists` if the name is
        taken)."""
        return self._c._call(R.create_volume(name, size_bytes, labels))

    def files(self, name: str) -> VolumeFiles:
        """The files of volume ``name`` (read, write, list, stat, mkdir,
        remove; the daemon offers no rename, archives or watch for
        volumes)."""
        return VolumeFiles(self._c, R.volume_files(name))
