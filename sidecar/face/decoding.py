"""Request bytes to messages, on both transports, without letting one request hold up the
daemon.

protobuf decodes a message in one call that holds the GIL, and its time grows with the
number of fields, not the bytes: 8 MB of four million empty frame ranges takes a third of a
second, during which no other request is answered. So a large request (over
`DECODE_INLINE_BYTES`) is decoded on a thread of its own, and before protobuf sees it, its
wire format is walked in Python, which lets the event loop run every few milliseconds:
every repeated field is counted against the limit the domain would enforce anyway, and the
messages within it against `MESSAGE_BUDGET`. What is over a limit is refused before
anything is built from it, and what is left decodes in a bounded time.
"""

from __future__ import annotations

import asyncio
import functools
import mmap
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from ..errors import InvalidRequest

# Requests up to this are decoded where they come: at most a few milliseconds.
DECODE_INLINE_BYTES = 64 * 1024
# Messages within one request, all levels together. protobuf's time goes to the messages
# it builds (scalar fields cost a tenth as much): the largest valid request, 65,536 frame
# ranges, decodes in a few milliseconds, and four million empty ranges in a fifth of a
# second or more.
MESSAGE_BUDGET = 100_000
# Times a field that is not repeated may appear (protobuf merges repeats; no serialiser
# writes one twice), and fields of numbers the schema does not know, per message.
SINGULAR_REPEATS = 8
UNKNOWN_FIELDS = 64
# A repeated field that `limits` does not name.
DEFAULT_REPEATED = 4096


@functools.cache
def _threads() -> ThreadPoolExecutor:
    """Two: a large valid request is not held up by one hostile one."""
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="decode")


class Undecodable:
    """Stands in for a request whose bytes are not a valid message, or carry more than
    any valid one."""

    def __init__(self, message: str, why: str = "") -> None:
        self.message = message
        self.why = why

    def refuse(self) -> InvalidRequest:
        text = f"not a valid {self.message} message"
        return InvalidRequest("request", f"{text}: {self.why}" if self.why else text)


class Pending:
    """A large request's bytes, to be decoded off the event loop (`decode_pending`): in
    `bytes`, or in an anonymous map that the decoding thread closes once done with it."""

    __slots__ = ("data", "decode")

    def __init__(self, data: bytes | mmap.mmap, decode: Callable[[Any], Any]) -> None:
        self.data, self.decode = data, decode

    def run(self) -> Any:
        data, self.data = self.data, b""
        if not isinstance(data, mmap.mmap):
            return self.decode(data)
        try:
            with memoryview(data) as view:
                return self.decode(view)  # copied out: nothing refers to the map after
        finally:
            data.close()


class Decoder:
    """A deserialiser for `cls`: called, it gives a message, an `Undecodable` (grpc would
    answer UNKNOWN for a deserialiser's exception; the handlers answer INVALID_ARGUMENT),
    or a `Pending` for bytes over `DECODE_INLINE_BYTES`. `limits` caps repeated fields by
    full name."""

    def __init__(self, cls: Any, limits: Mapping[str, int]) -> None:
        self.cls, self.limits = cls, limits

    def __call__(self, data: bytes) -> Any:
        if len(data) > DECODE_INLINE_BYTES:
            return Pending(data, self.now)
        return self.now(data)

    def now(self, data: bytes | memoryview) -> Any:
        """`data` decoded here and now (on a decoding thread when large)."""
        descriptor = self.cls.DESCRIPTOR
        if len(data) > DECODE_INLINE_BYTES:
            why = over_limits(data, descriptor, self.limits)
            if why:
                return Undecodable(descriptor.name, why)
        try:
            return self.cls.FromString(data)
        except Exception:  # DecodeError, or invalid UTF-8 in a string field
            return Undecodable(descriptor.name)


async def decode_pending(pending: Pending) -> Any:
    """A `Pending` request decoded on the decoding thread."""
    # Cancelled, the thread still runs it to its end, and closes its map.
    return await asyncio.get_running_loop().run_in_executor(_threads(), pending.run)


def over_limits(data: bytes | memoryview, descriptor: Descriptor, limits: Mapping[str, int]) -> str:
    """Why `data`, read as `descriptor`'s wire format, carries more than a valid message
    may, or "" when it does not (or is malformed: protobuf then says so). Stops at the
    first field over a limit, so a hostile message costs at most the limits' worth."""
    budget = [MESSAGE_BUDGET]
    try:
        return _walk(data, 0, len(data), descriptor, limits, budget)
    except _Malformed:
        return ""


class _Malformed(Exception):
    pass


def _varint(data: bytes | memoryview, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise _Malformed
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def _walk(
    data: bytes | memoryview,
    i: int,
    end: int,
    descriptor: Descriptor,
    limits: Mapping[str, int],
    budget: list[int],
) -> str:
    counts: dict[int, int] = {}
    unknown = 0
    fields = descriptor.fields_by_number
    while i < end:
        tag, i = _varint(data, i)
        number, wire = tag >> 3, tag & 7
        length = -1
        if wire == 0:
            _, i = _varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            length, i = _varint(data, i)
            i += length
        else:
            raise _Malformed  # groups are not in this schema
        if i > end:
            raise _Malformed
        field = fields.get(number)
        if field is None:
            unknown += 1
            if unknown > UNKNOWN_FIELDS:
                return f"more than {UNKNOWN_FIELDS} unknown fields in {descriptor.name}"
            continue
        count = counts[number] = counts.get(number, 0) + 1
        if field.is_repeated:
            limit = limits.get(field.full_name, DEFAULT_REPEATED)
            if wire == 2 and field.type != FieldDescriptor.TYPE_MESSAGE:
                count = counts[number] = count - 1 + _packed_count(data, i - length, i)
            if count > limit:
                return f"more than {limit} {field.name} in {descriptor.name}"
        elif count > SINGULAR_REPEATS:
            return f"{field.name} repeated in {descriptor.name}"
        if field.type == FieldDescriptor.TYPE_MESSAGE and wire == 2:
            budget[0] -= 1
            if budget[0] < 0:
                return f"more than {MESSAGE_BUDGET} messages"
            inner = field.message_type
            if inner is not None and _holds_messages(inner):  # else: cheap fields only
                why = _walk(data, i - length, i, inner, limits, budget)
                if why:
                    return why
    return ""


@functools.cache
def _holds_messages(descriptor: Descriptor) -> bool:
    return any(f.type == FieldDescriptor.TYPE_MESSAGE for f in descriptor.fields)


_CONTINUED = bytes(range(0x80, 0x100))


def _packed_count(data: bytes | memoryview, start: int, end: int) -> int:
    """Values in a packed run of varints: its bytes without the continuation bit."""
    return len(bytes(data[start:end]).translate(None, _CONTINUED))
