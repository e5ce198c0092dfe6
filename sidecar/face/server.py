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
import errno
import grp
import logging
import os
import signal
import socket
import stat
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..api.v1 import sidecar_pb2 as pb
from ..codec import memory
from ..config import Config
from ..errors import StartupError
from ..pool.shm import not_in_group
from ..pool_sizing import describe_pool
from ..service import Sidecar
from ..vocabulary import MAX_MESSAGE_BYTES, runtime_dir
from .framed import FramedServer
from .metrics import Metrics
from .registration import add_to_server
from .servicer import VideoSidecarServicer

log = logging.getLogger(__name__)

STOP_WAIT_S = 1.5  # for encoders to stop at their next frame once told to

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["VideoSidecar"].full_name


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
        trimmer = asyncio.create_task(
            memory.trim_when_idle(
                lambda: sidecar.busy,
                lambda: sidecar.stats.requests,
                release=sidecar.warm.close_ready,
                release_s=self.config.idle_release,
            )
        )
        try:
            while not self.should_exit:
                await asyncio.sleep(0.1)
        finally:
            trimmer.cancel()
            await self.shutdown()

    # -- phases --------------------------------------------------------------------------

    async def startup(self) -> None:
        self._prepare_socket()
        await self.sidecar.start()
        try:
            server = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.so_reuseport", 0),
                ]
            )
            observer = None
            if self.config.metrics:
                metrics = Metrics(self.sidecar)
                metrics.serve(self.config.metrics)
                observer = metrics.observe
                log.info("metrics on http://%s/metrics", self.config.metrics)
            self._servicer = VideoSidecarServicer(self.sidecar, observer)
            add_to_server(self._servicer, server)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            reflection.enable_server_reflection(
                (
                    SERVICE_NAME,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    reflection.SERVICE_NAME,
                ),
                server,
            )
            address = f"unix:{self._socket_path}"
            try:  # grpcio raises on some failures rather than returning port 0
                port = server.add_insecure_port(address)
            except RuntimeError as exc:
                raise StartupError(f"cannot listen on {address}: {exc}") from None
            if port == 0:
                raise StartupError(f"cannot listen on {address}")
            if self.config.tcp:
                try:
                    self._listen_tcp(server)
                except StartupError:
                    self._socket_path.unlink(missing_ok=True)  # bound above, never served
                    raise
            await server.start()
            self._grpc = server
            mode = 0o660 if self.config.shm_group else 0o600
            gid = grp.getgrnam(self.config.shm_group).gr_gid if self.config.shm_group else -1
            os.chmod(self._socket_path, mode)
            self._give_to_group(self._socket_path, "the socket")
            if self.config.framed_socket:
                framed = FramedServer(self._servicer, self._socket_path)
                if await framed.start(mode, gid):
                    self._framed = framed
        except BaseException:
            await self.sidecar.close()
            raise
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        choice, *warning = describe_pool(self.config)  # once it serves: a failed start is one line
        log.info(choice)
        for line in warning:
            log.warning(line)
        log.info(
            "serving on %s%s",
            address,
            f" (and framed on {self._framed.path})" if self._framed is not None else "",
        )
        sd_notify("READY=1\nSTATUS=serving")

    async def shutdown(self) -> None:
        log.info("shutting down")
        sd_notify("STOPPING=1")
        await self.health.enter_graceful_shutdown()  # every service reports NOT_SERVING
        self.sidecar.stop_accepting()
        if self._servicer is not None:
            self._servicer.end_idle_sessions()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_grace
        while self.sidecar.busy and not self.force_exit and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.sidecar.busy:
            log.warning("stopping the encodes still running")
            if not await self.sidecar.cancel_all(timeout=STOP_WAIT_S):
                log.warning("encoder threads did not stop within %.1fs; leaving them", STOP_WAIT_S)
        if self._grpc is not None:
            # Long enough to send each stopped encode its status, no longer.
            await self._grpc.stop(grace=0.3 if self.force_exit else 1.0)
        if self._framed is not None:
            await self._framed.close()
        await self.sidecar.close()
        with contextlib.suppress(FileNotFoundError):
            self._socket_path.unlink()
        log.info("stopped")

    def _listen_tcp(self, server: grpc.aio.Server) -> int:
        c = self.config
        problem = self._tcp_problem(c.tcp)
        if problem:
            raise StartupError(f"cannot listen on TCP {c.tcp}: {problem}")
        credentials = None
        if c.tls_cert:
            try:
                key, cert = Path(c.tls_key).read_bytes(), Path(c.tls_cert).read_bytes()
                ca = Path(c.tls_client_ca).read_bytes() if c.tls_client_ca else None
            except OSError as exc:
                raise StartupError(f"cannot read TLS files: {exc}") from None
            credentials = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
            )
        else:
            log.warning("listening on TCP %s WITHOUT TLS (--insecure)", c.tcp)
        try:  # grpcio raises on some failures rather than returning port 0
            if credentials is not None:
                port = server.add_secure_port(c.tcp, credentials)
            else:
                port = server.add_insecure_port(c.tcp)
        except RuntimeError as exc:
            port, problem = 0, f": {str(exc).rstrip('.')}"
        else:
            problem = ""
        if port == 0:
            if credentials is not None:  # gRPC reports a bad certificate as a failed bind
                problem += "; check that --tls-cert and --tls-key hold a matching PEM pair"
            raise StartupError(f"cannot listen on TCP {c.tcp}{problem}")
        log.info(
            "also serving on TCP %s (port %d)%s", c.tcp, port, " with TLS" if c.tls_cert else ""
        )
        return int(port)

    @staticmethod
    def _tcp_problem(address: str) -> str:
        """Why gRPC would fail to listen on HOST:PORT, or "" if it looks fine. gRPC's own
        failure names no cause and logs a line of its own; it also wraps ports over 65535."""
        host, _, port_text = address.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        port = int(port_text)  # Config checked it is digits
        if port > 65535:
            return f"port {port} is outside 0..65535"
        try:
            addresses = socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except (OSError, UnicodeError) as exc:
            return f"cannot resolve {host!r}: {getattr(exc, 'strerror', None) or exc}"
        refused: list[OSError] = []
        for family, kind, proto, _, sockaddr in addresses:
            try:
                with socket.socket(family, kind, proto) as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC
                    probe.bind(sockaddr)
            except OSError as exc:
                refused.append(exc)
            else:
                return ""  # gRPC needs one address that binds
        # Only causes certain to stop gRPC too; it works around others (e.g. no IPv6).
        if refused and all(e.errno in (errno.EADDRINUSE, errno.EACCES) for e in refused):
            return str(refused[0].strerror)
        return ""

    # -- signals -------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, self.handle_exit, sig)

    def handle_exit(self, sig: int) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    # -- helpers -------------------------------------------------------------------------

    def _give_to_group(self, path: Path, what: str) -> None:
        """chgrp `path` to --shm-group, if one is set."""
        if not self.config.shm_group:
            return
        try:
            gid = grp.getgrnam(self.config.shm_group).gr_gid
        except KeyError:
            raise StartupError(f"no group named {self.config.shm_group!r} (--shm-group)") from None
        try:
            os.chown(path, -1, gid)
        except PermissionError:
            raise StartupError(not_in_group(self.config.shm_group, what)) from None

    def _prepare_socket(self) -> None:
        path = self._socket_path
        # sun_path holds 108 bytes on Linux, the closing NUL included; gRPC raises past it.
        size = len(os.fsencode(str(path)))
        if size > 107:
            raise StartupError(
                f"socket path {path} is {size} bytes, over the 107 a Unix socket allows; "
                "choose a shorter --socket"
            )
        directory = path.parent
        try:
            if directory == runtime_dir() or not directory.exists():
                mode = 0o770 if self.config.shm_group else 0o700
                directory.mkdir(parents=True, exist_ok=True, mode=mode)
                st = directory.stat()
                if st.st_uid != os.getuid():
                    raise StartupError(
                        f"socket directory {directory} belongs to uid {st.st_uid}, not us"
                    )
                os.chmod(directory, mode)
                # The group's members must be able to enter it to reach the socket.
                self._give_to_group(directory, "the socket directory")
            if not directory.is_dir():
                raise StartupError(f"socket directory {directory} is not a directory")
            if not os.access(directory, os.W_OK | os.X_OK):
                raise StartupError(f"socket directory {directory} is not writable")
            if path.exists() or path.is_symlink():
                if not stat.S_ISSOCK(path.lstat().st_mode):
                    raise StartupError(f"{path} exists and is not a socket")
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    try:
                        probe.connect(str(path))
                    except OSError:
                        path.unlink()  # left by a daemon that died
                    else:
                        raise StartupError(f"another daemon is already listening on {path}")
        except OSError as exc:
            raise StartupError(f"cannot use socket {path}: {exc}") from None
