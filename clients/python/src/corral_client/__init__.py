"""Python client for corral, the sandboxed tool-execution daemon for coding agents.

    from corral_client import Client, ResponsesAdapter

    with Client("unix:/run/corral/corral.sock") as client:
        with client.open_session("/path/to/repo", "workspace-write") as s:
            print(s.read_file("README.md", limit=5).text)
            for chunk in s.processes.start(["make", "test"]).follow():  # a long-lived process
                print(chunk.data.decode(), end="")
            s.files.upload("./data", "data")  # byte-exact transfer, either way
            adapter = ResponsesAdapter(s)   # tools() for the request, handle(item) for each call

The same on ``asyncio``: ``corral_client.aio.AsyncClient``. The protobuf messages are in
``corral_client.pb`` (``corral.v1``). ``visible_command(argv)`` and ``visible_text(text)`` show
a command and the model's text in an approval prompt with hidden characters escaped.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._visible import visible_command, visible_text

try:
    from ._proto import corral_pb2 as pb
except ImportError as _e:  # stubs not generated: a source checkout, not an install
    import os as _os

    if _os.path.exists(_os.path.join(_os.path.dirname(__file__), "_proto", "corral_pb2.py")):
        raise
    _MISSING = _e

    def __getattr__(name: str):
        raise ImportError(
            "corral_client's gRPC stubs are not generated: install the package "
            "(pip install ./clients/python) or run `python -m corral_client._generate`"
        ) from _MISSING

else:
    from .adapters import ChatCompletionsAdapter, ResponsesAdapter
    from .client import MAX_MESSAGE_BYTES, Client, Session, ShellStream, check_socket, default_target
    from .files import Files, TransferChanged
    from .errors import (
        Aborted,
        AlreadyExists,
        Cancelled,
        CorralError,
        DataLoss,
        DeadlineExceeded,
        FailedPrecondition,
        FieldViolation,
        Internal,
        InvalidArgument,
        NotFound,
        OutOfRange,
        PermissionDenied,
        ResourceExhausted,
        Unauthenticated,
        Unavailable,
        Unimplemented,
        Unknown,
    )
    from .processes import (
        Cursor,
        Follow,
        OutputChunk,
        Process,
        Processes,
        ProcessInfo,
        ProcessState,
        ReadResult,
    )

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "ChatCompletionsAdapter",
    "Client",
    "Cursor",
    "check_socket",
    "CorralError",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "Files",
    "Follow",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "OutputChunk",
    "PermissionDenied",
    "Process",
    "ProcessInfo",
    "ProcessState",
    "Processes",
    "ReadResult",
    "ResourceExhausted",
    "ResponsesAdapter",
    "Session",
    "ShellStream",
    "TransferChanged",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "default_target",
    "pb",
    "visible_command",
    "visible_text",
]
