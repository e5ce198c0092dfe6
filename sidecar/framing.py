"""The framed socket's framing, shared by the daemon, the client, the tests and the soak.

A connection opens with `PREAMBLE`, the protocol's name; then each message is a 4-byte
big-endian length and that many bytes of protobuf: a `FramedRequest` from the client, a
`FramedReply` back, one per request, in order. Nothing here reads or writes a socket:
each end has its own I/O (blocking, asyncio, or bytes as given), and only the byte layout
is the same.
"""

from __future__ import annotations

import struct

from google.protobuf.message import Message

from .api.v1 import sidecar_pb2 as pb

PREAMBLE = b"VSF2"  # a connection's first bytes: the protocol it speaks
PREAMBLE_BYTES = len(PREAMBLE)
# The protocol's number, which `AttachResponse.framed_version` names.
VERSION = 2
_LENGTH = struct.Struct(">I")
HEADER_BYTES = _LENGTH.size  # the length before each message

Request = pb.EncodeRequest | pb.LeaseRequest | pb.ReleaseRequest


def header(size: int) -> bytes:
    """The length that goes before a message of `size` bytes."""
    return _LENGTH.pack(size)


def frame(data: bytes) -> bytes:
    """A message's bytes with their length before them."""
    return _LENGTH.pack(len(data)) + data


def pack(message: Message) -> bytes:
    """A message as it goes on the socket."""
    return frame(message.SerializeToString())


def length(data: bytes | bytearray) -> int:
    """The message length a header (`HEADER_BYTES` bytes) states."""
    size: int = _LENGTH.unpack(data)[0]
    return size


def wrap(request: Request) -> pb.FramedRequest:
    """An encode, lease or release as the `FramedRequest` that carries it."""
    if isinstance(request, pb.EncodeRequest):
        return pb.FramedRequest(encode=request)
    if isinstance(request, pb.LeaseRequest):
        return pb.FramedRequest(lease=request)
    return pb.FramedRequest(release=request)


__all__ = [
    "HEADER_BYTES",
    "PREAMBLE",
    "PREAMBLE_BYTES",
    "VERSION",
    "Request",
    "frame",
    "header",
    "length",
    "pack",
    "wrap",
]
