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
    └── ServerError                 INTERNAL, UNKNOWN, ...: a daemon-side failure

Every error carries `code` (the gRPC status name) and `reason` (the daemon's own error
class, e.g. "PoolExhausted", "DiskFull") when the daemon sent one.
"""

from __future__ import annotations


class SidecarError(Exception):
    """Base class of everything the client raises on purpose."""

    code: str = "UNKNOWN"

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


class TransportError(SidecarError):
    """The daemon could not be reached, or did not answer in time."""


class SidecarUnavailable(TransportError):
    code = "UNAVAILABLE"


class DeadlineExceeded(TransportError):
    code = "DEADLINE_EXCEEDED"


class RequestError(SidecarError):
    """The daemon refused the request. Nothing was lost and the daemon keeps serving."""


class InvalidArgument(RequestError):
    code = "INVALID_ARGUMENT"


class InvalidVideo(InvalidArgument):
    """The video's shape, dtype or layout is unusable; raised before anything is sent."""


class NotFound(RequestError):
    code = "NOT_FOUND"


class AlreadyExists(RequestError):
    code = "ALREADY_EXISTS"


class OutOfRange(RequestError):
    code = "OUT_OF_RANGE"


class FailedPrecondition(RequestError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(RequestError):
    code = "RESOURCE_EXHAUSTED"


class Cancelled(SidecarError):
    code = "CANCELLED"


class ServerError(SidecarError):
    code = "INTERNAL"


ERROR_FOR_CODE: dict[str, type[SidecarError]] = {
    "UNAVAILABLE": SidecarUnavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "INVALID_ARGUMENT": InvalidArgument,
    "NOT_FOUND": NotFound,
    "ALREADY_EXISTS": AlreadyExists,
    "OUT_OF_RANGE": OutOfRange,
    "FAILED_PRECONDITION": FailedPrecondition,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "CANCELLED": Cancelled,
}


def error_for(code: str, message: str, reason: str = "") -> SidecarError:
    cls = ERROR_FOR_CODE.get(code, ServerError)
    err = cls(message, reason=reason)
    if cls is ServerError:
        err.code = code
    return err
