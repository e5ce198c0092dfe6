"""Domain errors of the daemon.

Each error is a plain exception that says what went wrong in the caller's terms. The
servicer maps every class to one gRPC status code in one table (`face.status_codes.STATUS_OF`);
nothing below the servicer knows about gRPC.

    SidecarError
    ├── InvalidRequest          a field of the request is wrong (names the field)
    ├── NotAttached             the client token is unknown: attach (again)
    ├── LeaseNotFound           unknown, expired or foreign lease id
    ├── LeaseBusy               the lease is already handed to an encode
    ├── PoolExhausted           no room in the pool within the bounded wait
    ├── OutOfRange              a size over a configured limit
    ├── OutputExists            the output file exists and overwrite was not asked
    ├── OutputError             the output could not be written (permissions, not a dir)
    │   └── DiskFull            no space left on the output device
    ├── EncodeFailed            the encoder itself failed
    ├── Cancelled               the request was cancelled mid-way
    │   └── DeadlinePassed      ... because its call's deadline passed
    └── ShuttingDown            the daemon is draining and takes no new work
"""

from __future__ import annotations

from .vocabulary import Reason


class SidecarError(Exception):
    """Base class of every error the daemon reports to a client."""

    reason: Reason = Reason.ENCODE_FAILED  # each class below names its own
    field: str = ""


class InvalidRequest(SidecarError):
    """A request field is malformed or inconsistent."""

    reason = Reason.INVALID_REQUEST

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NotAttached(SidecarError):
    """The client token is unknown, for example after a daemon restart."""

    reason = Reason.NOT_ATTACHED


class LeaseNotFound(SidecarError):
    """The lease id is unknown, expired, already consumed, or owned by another client."""

    reason = Reason.LEASE_NOT_FOUND


class LeaseBusy(SidecarError):
    """The lease is in use by an encode and cannot be released or reused."""

    reason = Reason.LEASE_BUSY


class PoolExhausted(SidecarError):
    """No region large enough became free within the bounded wait."""

    reason = Reason.POOL_EXHAUSTED


class OutOfRange(SidecarError):
    """A request exceeds a configured maximum (frames, resolution, bytes, lease size)."""

    reason = Reason.OUT_OF_RANGE


class OutputExists(SidecarError):
    """The output path exists and the request did not ask to overwrite it."""

    reason = Reason.OUTPUT_EXISTS


class OutputError(SidecarError):
    """The output could not be written: no space, no permission, not a directory."""

    reason = Reason.OUTPUT_ERROR


class DiskFull(OutputError):
    """The output device ran out of space; the partial file has been removed."""

    reason = Reason.DISK_FULL


class EncodeFailed(SidecarError):
    """The encoder or muxer raised an error not caused by the request."""

    reason = Reason.ENCODE_FAILED


class Cancelled(SidecarError):
    """The client cancelled the request or its deadline passed."""

    reason = Reason.CANCELLED


class DeadlinePassed(Cancelled):
    """The call's deadline passed before its encode finished; the encode was stopped."""

    reason = Reason.DEADLINE_EXCEEDED


class ShuttingDown(SidecarError):
    """The daemon is shutting down and accepts no new work."""

    reason = Reason.SHUTTING_DOWN


class StartupError(Exception):
    """The daemon cannot start as configured (no room in /dev/shm, instance already running)."""
