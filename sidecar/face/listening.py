"""The daemon's listening sockets: the Unix socket's path, directory, mode and group made
safe before gRPC binds it, and a TCP address checked first, since gRPC's own failure to
bind names no cause."""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from pathlib import Path

import grpc

from ..config import Config
from ..errors import StartupError
from ..pool.shm import group_id, not_in_group
from ..vocabulary import runtime_dir

log = logging.getLogger(f"{__package__}.server")  # startup's lines, under one name

# sun_path holds 108 bytes on Linux, the closing NUL included; gRPC raises past it.
SOCKET_PATH_MAX = 107


def socket_mode(group: str) -> int:
    """The sockets' mode: the group's members may connect when there is one."""
    return 0o660 if group else 0o600


def give_to_group(path: Path, group: str, what: str) -> None:
    """chgrp `path` to --shm-group, if one is set."""
    if not group:
        return
    gid = group_id(group)
    try:
        os.chown(path, -1, gid)
    except PermissionError:
        raise StartupError(not_in_group(group, what)) from None


def prepare_socket(path: Path, group: str) -> None:
    """Make the socket's directory ready, and its path free: a socket a dead daemon left
    is removed, a live daemon's or any other file is refused."""
    size = len(os.fsencode(str(path)))
    if size > SOCKET_PATH_MAX:
        raise StartupError(
            f"socket path {path} is {size} bytes, over the {SOCKET_PATH_MAX} a Unix socket "
            "allows; choose a shorter --socket"
        )
    try:
        _prepare_directory(path.parent, group)
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


def _prepare_directory(directory: Path, group: str) -> None:
    if directory == runtime_dir() or not directory.exists():
        mode = 0o770 if group else 0o700
        directory.mkdir(parents=True, exist_ok=True, mode=mode)
        st = directory.stat()
        if st.st_uid != os.getuid():
            raise StartupError(f"socket directory {directory} belongs to uid {st.st_uid}, not us")
        os.chmod(directory, mode)
        # The group's members must be able to enter it to reach the socket.
        give_to_group(directory, group, "the socket directory")
    if not directory.is_dir():
        raise StartupError(f"socket directory {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise StartupError(f"socket directory {directory} is not writable")


def listen_unix(server: grpc.aio.Server, path: Path) -> str:
    """Bind `server` to the Unix socket `path`; its address."""
    address = f"unix:{path}"
    try:  # grpcio raises on some failures rather than returning port 0
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise StartupError(f"cannot listen on {address}: {exc}") from None
    if port == 0:
        raise StartupError(f"cannot listen on {address}")
    return address


def listen_tcp(server: grpc.aio.Server, c: Config) -> int:
    """Bind `server` to `--tcp`, with TLS unless `--insecure`; the port."""
    problem = tcp_problem(c.tcp)
    if problem:
        raise StartupError(f"cannot listen on TCP {c.tcp}: {problem}")
    credentials = _tls(c)
    if credentials is None:
        log.warning("listening on TCP %s WITHOUT TLS (--insecure)", c.tcp)
    try:  # grpcio raises on some failures rather than returning port 0
        if credentials is not None:
            port = server.add_secure_port(c.tcp, credentials)
        else:
            port = server.add_insecure_port(c.tcp)
    except RuntimeError as exc:
        port, problem = 0, f": {str(exc).rstrip('.')}"
    if port == 0:
        if credentials is not None:  # gRPC reports a bad certificate as a failed bind
            problem += "; check that --tls-cert and --tls-key hold a matching PEM pair"
        raise StartupError(f"cannot listen on TCP {c.tcp}{problem}")
    log.info("also serving on TCP %s (port %d)%s", c.tcp, port, " with TLS" if c.tls_cert else "")
    return int(port)


def _tls(c: Config) -> grpc.ServerCredentials | None:
    """The TLS credentials `--tls-*` name, or None for none."""
    if not c.tls_cert:
        return None
    try:
        key, cert = Path(c.tls_key).read_bytes(), Path(c.tls_cert).read_bytes()
        ca = Path(c.tls_client_ca).read_bytes() if c.tls_client_ca else None
    except OSError as exc:
        raise StartupError(f"cannot read TLS files: {exc}") from None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def tcp_problem(address: str) -> str:
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
