"""The client's channel to the daemon: where it is, gRPC's options, and fork bookkeeping.

A child after fork keeps every client's gRPC objects from before the fork referenced
for good: collected, a call's finalizer would cancel it, on the connection the child
shares with its parent.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, ClassVar

from grpc_health.v1.health_pb2_grpc import HealthStub

from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.vocabulary import MAX_MESSAGE_BYTES, default_socket

from ._errors import SidecarError, SidecarUnavailable

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # A local daemon that restarts should be found again within a fraction of a second.
    # Not "grpc.min_reconnect_backoff_ms": gRPC also takes it as the time a connection
    # has to complete its handshake, and a daemon on a busy host may take longer than a
    # backoff's worth; each call would then fail at once, UNAVAILABLE.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class _Forks:
    """How many forks this process is a child of, counted as they happen: a fork check
    that costs no system call (`os.getpid` does), made before every call.

    A child also keeps every client's gRPC objects from before the fork (its channel and
    calls) referenced for good: collected, a call's finalizer would cancel
    it, on the connection the child shares with its parent."""

    generation = 0
    clients: ClassVar[weakref.WeakSet[Any]] = weakref.WeakSet()  # with `grpc_objects()`
    inherited: ClassVar[list[Any]] = []

    @classmethod
    def after_fork_in_child(cls) -> None:
        cls.generation += 1
        cls.inherited.extend(client.grpc_objects() for client in list(cls.clients))


os.register_at_fork(after_in_child=_Forks.after_fork_in_child)


def fork_generation() -> int:
    """Changes in a child after fork: anything made before belongs to the parent."""
    return _Forks.generation


def keep_after_fork(client: Any) -> None:
    """Have a child after fork keep `client.grpc_objects()` from being collected."""
    _Forks.clients.add(client)


def resolve_target(target: str | None) -> str:
    """A gRPC target from a socket path, `unix:` URI or `host:port`.

    With no target: $VIDEO_SIDECAR_SOCKET, else the daemon's default socket.
    """
    target = target or os.environ.get("VIDEO_SIDECAR_SOCKET") or default_socket()
    if target.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")):
        return target
    if "/" in target or target.endswith(".sock"):
        return f"unix:{os.path.abspath(target)}"
    return target


def no_daemon(target: str) -> str:
    """What to say when no daemon answers at `target`, naming the fix."""
    path = target.removeprefix("unix:")
    if path == target:  # a network target
        return f"no daemon answers at {target}: start one with video-sidecar serve --tcp {target}"
    return f"no daemon answers at {path}: start one with video-sidecar serve --socket {path}"


def explained(target: str, err: SidecarError) -> SidecarError:
    """`err` reworded when no daemon could be reached at `target`: the fix, not gRPC's."""
    if not isinstance(err, SidecarUnavailable) or not err.unsent:
        return err
    path = target.removeprefix("unix:")
    if "Permission denied" in err.message and path != target:
        err.reword(
            f"permission denied on {path}: the daemon's user or its --shm-group must include you"
        )
    else:
        err.reword(no_daemon(target))
    return err


def open_channel(api: Any, target: str, credentials: Any) -> tuple[Any, dict[str, Any]]:
    """A channel from `grpc` or `grpc.aio` (the same calls) with the client's options, and
    its stubs by `Call.service`."""
    options = list(CHANNEL_OPTIONS)
    if not api.__name__.endswith(".aio"):
        # Streamed answers (Encode's events) read on the calling thread: otherwise the
        # blocking API starts a thread per call, some 1.5 ms of each small request.
        from grpc.experimental import ChannelOptions

        options.append((ChannelOptions.SingleThreadedUnaryStream, 1))
    if credentials is not None:  # TCP with TLS
        channel = api.secure_channel(target, credentials, options=options)
    else:
        channel = api.insecure_channel(target, options=options)
    sidecar = pb_grpc.VideoSidecarStub(channel)  # type: ignore[no-untyped-call]
    return channel, {"sidecar": sidecar, "health": HealthStub(channel)}
