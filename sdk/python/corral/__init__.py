"""Corral's Python client: sandboxes for AI agents on your own machines.

A blocking :class:`Client` and an asyncio :class:`AsyncClient` with the
same names::

    import corral

    with corral.Client() as client:          # CORRAL_HOST, CORRAL_API_KEY
        with client.create(template="default") as sb:
            print(sb.exec("python3 -c 'print(6*7)'").stdout)

Every error the daemon answers is a :class:`CorralError` subclass named
after the API's code (:class:`NotFound`, :class:`Busy`, ...).
"""

from __future__ import annotations

from ._async import AsyncAttachSession, AsyncClient, AsyncFiles, AsyncProcess, AsyncSandbox, AsyncStream, AsyncVolumeFiles
from ._attach import AttachSession
from ._client import Client, Files, OutputStream, Process, Sandbox, Stream, VolumeFiles
from ._errors import (
    AlreadyExists,
    Busy,
    CorralError,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from ._host import DEFAULT_HOST
from ._ops import NO_TIMEOUT
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

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "AsyncAttachSession",
    "AsyncClient",
    "AsyncFiles",
    "AsyncProcess",
    "AsyncSandbox",
    "AsyncStream",
    "AsyncVolumeFiles",
    "AttachSession",
    "Busy",
    "Client",
    "CodeContext",
    "CorralError",
    "DEFAULT_HOST",
    "Event",
    "ExecResult",
    "Execution",
    "ExecutionError",
    "FailedPrecondition",
    "FileInfo",
    "Files",
    "Internal",
    "InvalidArgument",
    "Mount",
    "NO_TIMEOUT",
    "NetworkPolicy",
    "NotFound",
    "OutputEvent",
    "OutputStream",
    "PermissionDenied",
    "Pool",
    "Process",
    "ProcessInfo",
    "ResourceExhausted",
    "Result",
    "Sandbox",
    "Snapshot",
    "Stats",
    "Stream",
    "Template",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Volume",
    "VolumeFiles",
    "WatchEvent",
]
