"""The client's exception tree. Catch the level you care about.

    SidecarError
    ├── TransportError              the daemon could not be reached or answered too late
    │   ├── SidecarUnavailable      UNAVAILABLE: not running, restarting, shutting down
    │   └── DeadlineExceeded        DEADLINE_EXCEEDED
    ├── RequestError                the daemon refused this request; it keeps serving
    │   ├── InvalidArgument         INVALID_ARGUMENT: a field is wrong (message names it)
    │   │   └── InvalidVideo        caught before sending: shape, dtype, layout
    │   ├── NotFound                NOT_FOUND: unknown, expired or foreign lease
    │   ├── AlreadyExists           ALREADY_EXISTS: output file exists, overwrite not set
    │   ├── OutOfRange              OUT_OF_RANGE: over a daemon limit
    │   ├── FailedPrecondition      FAILED_PRECONDITION: lease busy, output dir unusable
    │   └── ResourceExhausted       RESOURCE_EXHAUSTED: pool full after the wait, disk full
    ├── Cancelled                   CANCELLED
    ├── SidecarClosed               the client was closed: make a new one
    └── ServerError                 INTERNAL, UNKNOWN, ...: a daemon-side failure

Every error carries `code`, a `grpc.StatusCode` (the kind of failure), and `reason`, a
`Reason` (which failure: `Reason.DISK_FULL`, `Reason.LEASE_NOT_FOUND`, ...) as the daemon
documents it in `ErrorReason` (proto/video_sidecar/v1/sidecar.proto). `reason` is None for
errors raised in the client itself, and for a reason newer than this client: go by `code`
then. `Reason` is a `str` enum, so `err.reason == "DISK_FULL"` works too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import ERROR_KEY, Reason


class SidecarError(Exception):
    """Base class of everything the client raises on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    # True when the call never reached a daemon (none could be connected to, or the
    # connection was found closed when the request was to go): safe to send again once
    # one answers.
    unsent: bool = False

    def __init__(self, message: str, *, reason: Reason | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason

    def reword(self, message: str) -> None:
        """Say the error in other words (the client's, naming the fix)."""
        self.message = message
        self.args = (message,)


class TransportError(SidecarError):
    """The daemon could not be reached, or did not answer in time."""


class SidecarUnavailable(TransportError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(TransportError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class RequestError(SidecarError):
    """The daemon refused the request. Nothing was lost and the daemon keeps serving."""


class InvalidArgument(RequestError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidVideo(InvalidArgument):
    """The video's shape, dtype or layout is unusable; raised before anything is sent."""


class NotFound(RequestError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(RequestError):
    code = grpc.StatusCode.ALREADY_EXISTS


class OutOfRange(RequestError):
    code = grpc.StatusCode.OUT_OF_RANGE


class FailedPrecondition(RequestError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(RequestError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Cancelled(SidecarError):
    code = grpc.StatusCode.CANCELLED


class SidecarClosed(SidecarError):
    """A call on a client (or its stream) after `close()`; raised before anything is sent."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ServerError(SidecarError):
    """A daemon-side failure; `code` is the status the daemon sent (INTERNAL, UNKNOWN...)."""

    code = grpc.StatusCode.INTERNAL


ERROR_FOR_CODE: dict[grpc.StatusCode, type[SidecarError]] = {
    cls.code: cls
    for cls in (
        SidecarUnavailable,
        DeadlineExceeded,
        InvalidArgument,
        NotFound,
        AlreadyExists,
        OutOfRange,
        FailedPrecondition,
        ResourceExhausted,
        Cancelled,
    )
}


def error_for(code: grpc.StatusCode, message: str, reason: Reason | None = None) -> SidecarError:
    """The exception for a status code; unknown codes become a `ServerError` keeping it."""
    cls = ERROR_FOR_CODE.get(code, ServerError)
    err = cls(message, reason=reason)
    if cls is ServerError:
        err.code = code
    return err


def reason_in(trailing: Iterable[tuple[str, Any]] | None) -> Reason | None:
    """The daemon's reason from trailing metadata; None if absent or unknown here."""
    for key, value in trailing or ():
        if key == ERROR_KEY:
            text = value if isinstance(value, str) else bytes(value).decode(errors="replace")
            try:
                return Reason(text)
            except ValueError:
                return None
    return None


_CODE_OF_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
_REASON_NUMBERS = frozenset(v.number for v in pb.ErrorReason.DESCRIPTOR.values)


def error_from_reply(error: pb.FramedError) -> SidecarError:
    """Translate a request's error sent as a framed socket's reply into the client's tree."""
    code = _CODE_OF_NUMBER.get(error.code, grpc.StatusCode.UNKNOWN)
    name = pb.ErrorReason.Name(error.reason) if error.reason in _REASON_NUMBERS else ""
    try:
        reason: Reason | None = Reason(name.removeprefix("ERROR_REASON_"))
    except ValueError:  # unspecified, or newer than this client
        reason = None
    return error_for(code, error.message or code.name, reason)


def gone_mid_encode(err: BaseException, *, held: bool = False) -> BaseException:
    """A daemon that went away while it held a request (killed, crashed, its socket
    gone), said as what the caller must know instead of the transport's words. Refusals
    keep their own words: they carry a reason, and one never sent says no daemon answers,
    unless the daemon is known to hold the request (`held`: a stream it had opened)."""
    unavailable = isinstance(err, SidecarUnavailable) and err.reason is None
    cut = unavailable and (held or not getattr(err, "unsent", False))
    if cut and not str(err).startswith(GONE_TEXT):
        assert isinstance(err, SidecarUnavailable)
        err.reword(f"{GONE_TEXT}: the video was not written; send it again ({err.message})")
    return err


GONE_TEXT = "the daemon went away during the encode"


def error_from_rpc(err: grpc.RpcError) -> SidecarError:
    """Translate a gRPC error (a failed call of either stack) into the client's tree."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    error = error_for(code, details, reason_in(trailing))
    error.unsent = code == grpc.StatusCode.UNAVAILABLE and any(
        m in details for m in (*NOT_CONNECTED, *NOT_WRITTEN)
    )
    return error


# What gRPC says of a call it failed because no connection could be made: never sent.
NOT_CONNECTED = (
    "failed to connect to all addresses",
    "connect failed",
    "No such file or directory",
    "Connection refused",
    "Permission denied",
)
# What gRPC says of a call whose own write found the connection closed: the daemon left
# before the request went (a kept connection whose daemon died unnoticed). A
# connection lost once the request went ("Socket closed", a reset) is not among these:
# the daemon may have taken it.
NOT_WRITTEN = ("sendmsg: Broken pipe",)
