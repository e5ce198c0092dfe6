"""Domain errors of the daemon.

Each error is a plain exception that says what went wrong in the caller's terms. The
servicer maps every class to one gRPC status code in one table (`servicer.STATUS_OF`);
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
    └── ShuttingDown            the daemon is draining and takes no new work
"""

from __future__ import annotations


class SidecarError(Exception):
    """Base class of every error the daemon reports to a client."""


class InvalidRequest(SidecarError):
    """A request field is malformed or inconsistent."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NotAttached(SidecarError):
    """The client token is unknown, for example after a daemon restart."""


class LeaseNotFound(SidecarError):
    """The lease id is unknown, expired, already consumed, or owned by another client."""


class LeaseBusy(SidecarError):
    """The lease is in use by an encode and cannot be released or reused."""


class PoolExhausted(SidecarError):
    """No region large enough became free within the bounded wait."""


class OutOfRange(SidecarError):
    """A request exceeds a configured maximum (frames, resolution, bytes, lease size)."""


class OutputExists(SidecarError):
    """The output path exists and the request did not ask to overwrite it."""


class OutputError(SidecarError):
    """The output could not be written: no space, no permission, not a directory."""


class DiskFull(OutputError):
    """The output device ran out of space; the partial file has been removed."""


class EncodeFailed(SidecarError):
    """The encoder or muxer raised an error not caused by the request."""


class Cancelled(SidecarError):
    """The client cancelled the request or its deadline passed."""


class ShuttingDown(SidecarError):
    """The daemon is shutting down and accepts no new work."""


class StartupError(Exception):
    """The daemon cannot start as configured (no room in /dev/shm, instance already running)."""
