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


_STATUS_DETAILS = "grpc-status-details-bin"


def _decode_details(err: grpc.RpcError) -> list[Any]:
    """The ``google.rpc.Status`` details of a failed call (its ``grpc-status-details-bin``
    trailer), unpacked where the type is known. The same for ``grpc`` and ``grpc.aio`` errors:
    both carry their trailers."""
    try:
        trailers = err.trailing_metadata() or ()  # type: ignore[attr-defined]
    except Exception:  # an error without a call (e.g. a cancelled future) has none
        return []
    raw = next((v for k, v in trailers if k == _STATUS_DETAILS), None)
    if not isinstance(raw, bytes):
        return []
    from google.protobuf import descriptor_pool, message_factory
    from google.rpc import error_details_pb2  # noqa: F401  (registers the google.rpc types)
    from google.rpc import status_pb2

    try:
        status = status_pb2.Status.FromString(raw)
    except Exception:  # a malformed trailer must not hide the error itself
        return []
    pool = descriptor_pool.Default()
    out: list[Any] = []
    for any_ in status.details:
        try:
            cls = _message_class(message_factory, pool.FindMessageTypeByName(any_.TypeName()))
        except KeyError:
            out.append(any_)
            continue
        msg = cls()
        any_.Unpack(msg)
        out.append(msg)
    return out


def _message_class(message_factory: Any, descriptor: Any) -> Any:
    # GetMessageClass is protobuf >= 4.22; 4.21 has only the (since removed) MessageFactory.
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(descriptor.file.pool).GetPrototype(descriptor)


def from_rpc_error(err: grpc.RpcError) -> CorralError:
    """Converts a grpc error (a failed call) into the matching :class:`CorralError` subclass."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    cls = _BY_CODE.get(code, CorralError)
    return cls(code, message or "", _decode_details(err))
