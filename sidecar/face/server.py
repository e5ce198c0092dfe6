"""The daemon's lifecycle: startup, serve, graceful shutdown.

Signal handlers only set flags; the serve loop notices them. The first SIGTERM, SIGINT or
SIGHUP (the terminal it runs in closed: left to its default, the daemon would die with
its slabs still in /dev/shm) starts a graceful shutdown: health turns NOT_SERVING, new
work is refused, in-flight encodes (streams included: their clients may still lease) get
`shutdown_grace` seconds, then the rest are stopped, their clients told the daemon is
shutting down, and the slabs unlinked. A second signal cuts the grace short: the daemon
exits within about 2 seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..api.v1 import sidecar_pb2 as pb
from ..codec import memory
from ..config import Config
from ..errors import StartupError
from ..pool.shm import group_id
from ..pool.sizing import describe_pool
from ..service import Sidecar
from ..vocabulary import MAX_MESSAGE_BYTES
from .framed import FramedServer
from .listening import give_to_group, listen_tcp, listen_unix, prepare_socket, socket_mode
from .metrics import Metrics
from .outcomes import Observer
from .registration import add_to_server
from .servicer import VideoSidecarServicer

log = logging.getLogger(__name__)

STOP_WAIT_S = 1.5  # for encoders to stop at their next frame once told to

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["VideoSidecar"].full_name
SERVICES = (
    SERVICE_NAME,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    reflection.SERVICE_NAME,
)


def sd_notify(message: str) -> None:
    """Tell systemd about our state (Type=notify), if it is listening."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(address)
        s.sendall(message.encode())


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.should_exit = False
        self.force_exit = False
        self.sidecar = Sidecar(config)
        self.health = health.aio.HealthServicer()
        self._grpc: grpc.aio.Server | None = None
        self._servicer: VideoSidecarServicer | None = None
        self._framed: FramedServer | None = None
        self._socket_path = Path(config.socket)

    # -- entry points --------------------------------------------------------------------

    def run(self) -> None:
        """Serve until a signal asks us to stop. Raises StartupError on a bad setup."""
        try:
            import uvloop
        except ImportError:
            asyncio.run(self.serve())
        else:
            uvloop.run(self.serve())

    async def serve(self) -> None:
        # Before any encoder, gRPC or codec thread starts: an arena per concurrent encode.
        memory.limit_arenas(max(memory.ARENAS, self.config.max_concurrent_encodes))
        self.install_signal_handlers()
        await self.startup()
        sidecar = self.sidecar
        try:
            while not self.should_exit:
                await asyncio.sleep(0.1)
                idle_exit = self.config.idle_exit
                if idle_exit and sidecar.idle_for() >= idle_exit:
                    log.info("no client has called for %gs (--idle-exit): stopping", idle_exit)
                    self.should_exit = True
        finally:
            await self.shutdown()

    # -- phases --------------------------------------------------------------------------

    async def startup(self) -> None:
        prepare_socket(self._socket_path, self.config.shm_group)
        await self.sidecar.start()
        try:
            servicer = VideoSidecarServicer(self.sidecar, self._observer())
            self._servicer = servicer
            self._grpc = await self._serve_grpc(servicer)
            if self.config.framed_socket:
                await self._serve_framed(servicer)
        except BaseException:
            await self.sidecar.close()
            raise
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        # Once it serves: a failed start is one line.
        c = self.config
        choice, *warning = describe_pool(
            c.slabs, c.slab_size, c.pool_reason, c.max_concurrent_encodes
        )
        log.info(choice)
        for line in warning:
            log.warning(line)
        log.info(
            "serving on unix:%s%s",
            self._socket_path,
            f" (and framed on {self._framed.path})" if self._framed is not None else "",
        )
        sd_notify("READY=1\nSTATUS=serving")

    def _observer(self) -> Observer | None:
        """Prometheus metrics' observer of each encode, when --metrics asks for them."""
        if not self.config.metrics:
            return None
        metrics = Metrics(self.sidecar)
        metrics.serve(self.config.metrics)
        log.info("metrics on http://%s/metrics", self.config.metrics)
        return metrics.observe

    async def _serve_grpc(self, servicer: VideoSidecarServicer) -> grpc.aio.Server:
        """gRPC on the Unix socket, and on TCP when asked, started."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ]
        )
        add_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(SERVICES, server)
        listen_unix(server, self._socket_path)
        if self.config.tcp:
            try:
                listen_tcp(server, self.config)
            except StartupError:
                self._socket_path.unlink(missing_ok=True)  # bound above, never served
                raise
        await server.start()
        os.chmod(self._socket_path, socket_mode(self.config.shm_group))
        give_to_group(self._socket_path, self.config.shm_group, "the socket")
        return server

    async def _serve_framed(self, servicer: VideoSidecarServicer) -> None:
        """The framed socket beside the gRPC one, with its mode and group."""
        group = self.config.shm_group
        framed = FramedServer(servicer, self._socket_path)
        if await framed.start(socket_mode(group), group_id(group)):
            self._framed = framed

    async def shutdown(self) -> None:
        log.info("shutting down")
        sd_notify("STOPPING=1")
        await self.health.enter_graceful_shutdown()  # every service reports NOT_SERVING
        # The stop rule (pipeline/admission/drain.py): no new work, and what is in flight
        # finishes within the grace, both sockets serving it meanwhile.
        self.sidecar.begin_drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_grace
        while self.sidecar.in_flight and not self.force_exit and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.sidecar.in_flight:
            log.warning("stopping the work still in flight: its grace period is over")
            if not await self.sidecar.cancel_all(timeout=STOP_WAIT_S):
                log.warning("encoder threads did not stop within %.1fs; leaving them", STOP_WAIT_S)
        if self._servicer is not None:
            self._servicer.end_idle_connections()
        if self._grpc is not None:
            # Long enough to send each stopped encode its status, no longer.
            await self._grpc.stop(grace=0.3 if self.force_exit else 1.0)
        if self._framed is not None:
            await self._framed.close()
        await self.sidecar.close()
        with contextlib.suppress(FileNotFoundError):
            self._socket_path.unlink()
        log.info("stopped")

    # -- signals -------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, self.handle_exit, sig)

    def handle_exit(self, sig: int) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True
