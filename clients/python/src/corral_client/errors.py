"""Typed errors: one exception class per gRPC status code, carrying the status details.

A failed RPC raises a subclass of :class:`CorralError`. corral puts a ``google.rpc.Status`` in the
``grpc-status-details-bin`` trailer when it has details (``INVALID_ARGUMENT`` names the offending
field in a ``google.rpc.BadRequest``); they are decoded into :attr:`CorralError.details`.

Tool failures seen through :meth:`Session.invoke` are not errors: they are model text with
``success=False``. Only the transport, the session, or a sandbox that cannot be set up fail there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc


@dataclass(frozen=True)
class FieldViolation:
    """One entry of a ``google.rpc.BadRequest``: which request field was wrong, and why."""

    field: str
    description: str


class CorralError(Exception):
    """A failed corral RPC.

    Attributes:
        code: the :class:`grpc.StatusCode`.
        message: the status message (for tool failures, the same text the model would get).
        details: the decoded ``google.rpc`` detail messages (``BadRequest``, ``ErrorInfo``, …);
            details of unknown types are kept as ``google.protobuf.Any``.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, code: grpc.StatusCode, message: str, details: list[Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = list(details or [])

    @property
    def field_violations(self) -> list[FieldViolation]:
        """The field violations of every ``google.rpc.BadRequest`` detail, in order."""
        from google.rpc import error_details_pb2

        out = []
        for d in self.details:
            if isinstance(d, error_details_pb2.BadRequest):
                out.extend(FieldViolation(v.field, v.description) for v in d.field_violations)
        return out

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.name}, message={self.message!r}, details={self.details!r})"


class Cancelled(CorralError):
    code = grpc.StatusCode.CANCELLED


class Unknown(CorralError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(CorralError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(CorralError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(CorralError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(CorralError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(CorralError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(CorralError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(CorralError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(CorralError):
    code = grpc.StatusCode.ABORTED


class OutOfRange(CorralError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(CorralError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(CorralError):
    code = grpc.StatusCode.INTERNAL


class Unavailable(CorralError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(CorralError):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(CorralError):
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: dict[grpc.StatusCode, type[CorralError]] = {
    cls.code: cls
    for cls in (
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    )
}


def _decode_details(err: grpc.RpcError) -> list[Any]:
    """The ``google.rpc.Status`` details of a failed call, unpacked where the type is known."""
    try:
        from grpc_status import rpc_status
    except ImportError:  # pragma: no cover - grpcio-status is a dependency
        return []
    try:
        status = rpc_status.from_call(err)  # type: ignore[arg-type]
    except Exception:  # a malformed trailer must not hide the error itself
        return []
    if status is None:
        return []
    from google.protobuf import descriptor_pool, message_factory
    from google.rpc import error_details_pb2  # noqa: F401  (registers the google.rpc types)

    pool = descriptor_pool.Default()
    out: list[Any] = []
    for any_ in status.details:
        try:
            cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(any_.TypeName()))
        except KeyError:
            out.append(any_)
            continue
        msg = cls()
        any_.Unpack(msg)
        out.append(msg)
    return out


def from_rpc_error(err: grpc.RpcError) -> CorralError:
    """Converts a grpc error (a failed call) into the matching :class:`CorralError` subclass."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    cls = _BY_CODE.get(code, CorralError)
    return cls(code, message or "", _decode_details(err))
