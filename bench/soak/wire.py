"""The fuzz soak's transports: a framed connection kept open, and what its errors read as."""

from __future__ import annotations

import socket
from typing import Any

import grpc

from sidecar import framing
from sidecar.api.v1 import sidecar_pb2 as pb

SERVICE = "/video_sidecar.v1.VideoSidecar/"
METHODS = ["Attach", "Lease", "Release", "Status", "Encode", "EncodeStream", "Framed"]

CODE_OF = {code.value[0]: code for code in grpc.StatusCode}


class ReplyError(grpc.RpcError):
    """A framed request's error reply, as the status an Encode call would end with."""

    def __init__(self, error: pb.FramedError) -> None:
        self._code = CODE_OF.get(error.code, grpc.StatusCode.UNKNOWN)

    def code(self) -> grpc.StatusCode:
        return self._code


class Framed:
    """A connection to the daemon's framed socket kept across requests, as the client
    keeps it; `raw` sends FramedRequest bytes as given. A hostile preamble or a broken
    frame ends it, and the next request opens another."""

    def __init__(self, path: str, raw: bool = False) -> None:
        self.path, self.raw = path, raw
        self.sock: socket.socket | None = None

    def __call__(self, request: Any, timeout: float | None = None) -> pb.EncodeResult:
        data = request if self.raw else pb.FramedRequest(encode=request).SerializeToString()
        reply = self.ask(framing.frame(data), timeout)
        if reply is None:  # hung up where a reply was due: a server error
            raise ReplyError(pb.FramedError(code=grpc.StatusCode.UNKNOWN.value[0]))
        if reply.HasField("error"):
            raise ReplyError(reply.error)
        return reply.result

    def ask(
        self, data: bytes, timeout: float | None, preamble: bytes = framing.PREAMBLE
    ) -> pb.FramedReply | None:
        """Send `data` (after `preamble` on a new connection) and read one reply; None if
        the daemon closed the connection instead."""
        if self.sock is None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(self.path)
            data = preamble + data
        try:
            self.sock.sendall(data)
            header = self._exactly(framing.HEADER_BYTES)
            body = self._exactly(framing.length(header)) if header else None
        except OSError:
            body = None
        if body is None:
            self.close()
            return None
        return pb.FramedReply.FromString(body)

    def _exactly(self, size: int) -> bytes | None:
        assert self.sock is not None
        data = b""
        while len(data) < size:
            more = self.sock.recv(size - len(data))
            if not more:
                return None
            data += more
        return data

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
