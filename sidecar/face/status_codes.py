"""Every domain error's gRPC status, in one place, and how it travels.

Each error's reason (`vocabulary.Reason`) travels twice in the trailers: as
`video-sidecar-error`, and as a google.rpc.Status holding an ErrorInfo (the standard rich
error model), so clients can tell, say, an unknown token from a busy lease. The framed
socket answers the same as a `FramedError` reply.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from ..api.v1 import sidecar_pb2 as pb
from ..errors import SidecarError
from ..vocabulary import ERROR_DOMAIN, ERROR_KEY, Reason

# Every error's status code, in one place.
STATUS_OF: dict[Reason, grpc.StatusCode] = {
    Reason.INVALID_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.NOT_ATTACHED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.LEASE_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.LEASE_BUSY: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.POOL_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    Reason.OUTPUT_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Reason.OUTPUT_ERROR: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.DISK_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.ENCODE_FAILED: grpc.StatusCode.INTERNAL,
    Reason.CANCELLED: grpc.StatusCode.CANCELLED,
    Reason.SHUTTING_DOWN: grpc.StatusCode.UNAVAILABLE,
    Reason.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_of(exc: SidecarError) -> grpc.StatusCode:
    return STATUS_OF[exc.reason]


def forget_frames(exc: BaseException) -> None:
    """Let go of what an answered error holds. Its traceback's frames hold the request
    (hundreds of MiB decoded, for a message of a few) and the error itself, in a cycle
    that only a full collection breaks, which an idle daemon almost never runs."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        following = link.__context__ or link.__cause__
        link.__traceback__ = link.__context__ = link.__cause__ = None
        link = following


def errors_by_code(errors: Mapping[Reason, int]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for reason, count in errors.items():
        counts[STATUS_OF[reason].name] += count
    return dict(counts)


def error_trailers(exc: SidecarError, code: grpc.StatusCode) -> tuple[tuple[str, Any], ...]:
    """The error's reason as our own key and as a google.rpc.Status with an ErrorInfo."""
    info = error_details_pb2.ErrorInfo(reason=exc.reason.value, domain=ERROR_DOMAIN)
    if exc.field:
        info.metadata["field"] = exc.field
    detail = any_pb2.Any()
    detail.Pack(info)
    rich = status_pb2.Status(code=code.value[0], message=str(exc), details=[detail])
    return ((ERROR_KEY, exc.reason.value), *rpc_status.to_status(rich).trailing_metadata)


def framed_error(exc: SidecarError) -> pb.FramedError:
    """What `_fail` would send as a call's status, as a framed socket's reply."""
    return pb.FramedError(
        code=status_of(exc).value[0],
        message=str(exc),
        reason=exc.reason.proto,
        field=exc.field,
    )
