"""Python client for corral, the sandboxed tool-execution daemon for coding agents.

    from corral_client import Client, ResponsesAdapter

    with Client("unix:/run/corral/corral.sock") as client:
        with client.open_session("/path/to/repo", "workspace-write", env={"PATH": "/usr/bin:/bin"}) as s:
            print(s.read_file("README.md", limit=5).text)
            adapter = ResponsesAdapter(s)   # tools() for the request, handle(item) for each call

The protobuf messages are in ``corral_client.pb`` (``corral.v1``).
"""

from __future__ import annotations

__version__ = "0.1.0"

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
    from .client import Client, Session, ShellStream, check_socket, default_target
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

__all__ = [
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "ChatCompletionsAdapter",
    "Client",
    "check_socket",
    "CorralError",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "ResponsesAdapter",
    "Session",
    "ShellStream",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "default_target",
    "pb",
]
