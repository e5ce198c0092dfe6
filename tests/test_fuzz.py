"""Thousands of malformed requests: the daemon answers each with a client error, never an
internal one, never reads outside a lease, and keeps serving."""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import struct
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar import framing
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.codec.codec_options import ALLOWED, KNOWN_DANGEROUS, KNOWN_DANGEROUS_PARAMS
from sidecar.codec.codec_rules import Params
from sidecar.vocabulary import DEADLINE_KEY

from .helpers import Daemon, RawFramed

LEASE = 64 * 1024
# Each test's examples: the counts written below (some 6,500 requests in all) times
# $VIDEO_SIDECAR_FUZZ_DEPTH; 0.4 unless set, which keeps the suite's time down, and a fresh
# random draw each run. Set it to 1 or more for a deeper hunt.
DEPTH = float(os.environ.get("VIDEO_SIDECAR_FUZZ_DEPTH", "0.4"))


def examples(written: int) -> int:
    return max(10, round(written * DEPTH))


CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION,
}
# A request that happens to be valid is encoded; one naming an existing file is refused.
ACCEPTABLE = CLIENT_ERRORS | {grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS}
# A Lease under a tag that an earlier Release withdrew.
WITHDRAWN = {grpc.StatusCode.CANCELLED}
TAG_RULE = re.compile(r"[A-Za-z0-9_-]{1,64}")
TAGS = st.one_of(
    st.just(""),
    st.sampled_from(
        ["t-1", "ok_Tag-9", "x" * 64, "x" * 65, "a b", "\u00e9", "\x1b[31m", "../x", "\x00"]
    ),
    st.text(max_size=80),
)
COUNTS: Counter[str] = Counter()  # answers by "test:code" ("code" for encode descriptors)
# The examples each test is written for, by its key in COUNTS.
WRITTEN = {
    "": 1500, "one": 1000, "deadline": 150, "lease": 600, "stream": 300, "previews": 300,
    "raw": 1200, "audio": 400, "codec": 300, "framed": 600, "framed-deadline": 150,
}  # fmt: skip

I64 = st.one_of(
    st.integers(-3, 300),
    st.sampled_from([-(2**63), -(2**31), 2**31 - 1, 2**31, 2**32, 2**48, 2**62, 2**63 - 1]),
    st.integers(-(2**63), 2**63 - 1),
)
U64 = st.one_of(st.integers(0, 300), st.sampled_from([2**32, 2**48, 2**63, 2**64 - 1]))
HOSTILE_PATHS = st.one_of(
    st.sampled_from(
        [
            "../x.mp4",
            "/etc/passwd",
            "a/../../x.mp4",
            "..",
            ".",
            "",
            "a/",
            "a\x00b.mp4",
            "x" * 5000,
            "link/../../x",
            "./ok.mp4",
            "deep/" * 50 + "x.mp4",
            "ok.mp4",
        ]
    ),
    st.text(st.characters(blacklist_categories=["Cs"]), max_size=40),
)


@pytest.fixture(scope="module")
def stub(daemon: Daemon) -> Iterator[tuple[pb_grpc.VideoSidecarStub, str]]:
    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        s = pb_grpc.VideoSidecarStub(channel)
        attached = s.Attach(pb.AttachRequest(client_name="fuzz"))
        token = attached.client_token
        _ATTACHED[token] = attached
        yield s, token
        for connection in _FRAMED.values():
            connection.sock.close()
        _FRAMED.clear()
    print("\nfuzz answers:", dict(sorted(COUNTS.items())))


def call(fn, request) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    try:
        result = fn(request, timeout=30)
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            for _ in result:
                pass
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


class Framed(RawFramed):
    """One connection to the framed socket kept open across requests, as the client
    keeps it: each request wrapped in a FramedRequest."""

    def ask(self, request: pb.EncodeRequest) -> grpc.StatusCode:
        return reply_code(self.exchange(request))

    def exchange(self, request: framing.Request | pb.FramedRequest) -> pb.FramedReply:
        """The reply to one request (wrapped here unless it comes wrapped)."""
        wrapped = request if isinstance(request, pb.FramedRequest) else framing.wrap(request)
        self.send(wrapped.SerializeToString())
        reply = self.reply()
        assert reply is not None, "the daemon ended a kept framed connection"
        return reply


def reply_code(reply: Any) -> grpc.StatusCode:
    """A framed reply's status code: OK for an answer, else its error's, which must say
    why."""
    if not reply.HasField("error"):
        assert reply.WhichOneof(reply.DESCRIPTOR.oneofs[0].name), reply  # an empty reply
        return grpc.StatusCode.OK
    assert reply.HasField("error") and reply.error.message, reply
    assert reply.error.reason != pb.ERROR_REASON_UNSPECIFIED, reply
    return {c.value[0]: c for c in grpc.StatusCode}[reply.error.code]


_ATTACHED: dict[str, pb.AttachResponse] = {}


def write_count(token: str, lease: pb.LeaseResponse, offset: int, count: int) -> None:
    """Write a landed-frame count into a lease, as a client whose frames all landed."""
    attached = _ATTACHED[token]
    slab = next(s for s in attached.slabs if s.id == lease.slab_id)
    with open(os.path.join(attached.shm_dir, slab.shm_name), "r+b") as f:
        f.seek(lease.offset + offset)
        f.write(struct.pack("<I", count))


_FRAMED: dict[str, Framed] = {}


def framed(daemon: Daemon) -> Framed:
    if daemon.socket not in _FRAMED:
        _FRAMED[daemon.socket] = Framed(f"{daemon.socket}.framed")
    return _FRAMED[daemon.socket]


def in_bounds(r: pb.FrameRange, width: int, height: int, fmt: int) -> bool:
    """Our own check of what the daemon may read: the accepted ranges must pass it."""
    bpp = {1: 3, 2: 3, 3: 4, 4: 1, 5: 1, 6: 1}[fmt]
    rows = height * 3 // 2 if fmt in (5, 6) else height
    row = r.row_stride or width * bpp
    frame = row * rows
    stride = r.frame_stride or frame
    return r.offset >= 0 and r.offset + (r.frame_count - 1) * stride + frame <= LEASE


SMALL = st.one_of(st.integers(0, 8), I64)
ranges = st.builds(
    lambda lease, offset, count, row, frame: (lease, offset, count, row, frame),
    st.sampled_from(["mine", "mine", "unknown", "empty", "garbage"]),
    st.one_of(st.just(0), I64), SMALL, st.one_of(st.just(0), I64), st.one_of(st.just(0), I64),
)  # fmt: skip


@settings(
    max_examples=examples(1500),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    # Mostly plausible sizes and formats, so the checks behind them are reached too.
    width=st.one_of(st.sampled_from([16, 32, 48, 64]), I64),
    height=st.one_of(st.sampled_from([16, 32, 48, 64]), I64),
    fmt=st.one_of(st.integers(1, 6), st.integers(-3, 12)),
    fps=st.one_of(st.just((24, 1)), st.tuples(I64, I64)),
    pieces=st.lists(ranges, min_size=1, max_size=3),
    codec=st.sampled_from(["", "", "h264", "h265", "av1", "vp9", "bogus", "h265\x00"]),
    crf=st.one_of(st.none(), st.integers(0, 51), st.integers(-(2**31), 2**31 - 1)),
    preset=st.one_of(st.just(""), st.just("ultrafast"), st.text(max_size=12)),
    profile=st.one_of(st.sampled_from(["", "fast", "balanced", "small"]), st.text(max_size=12)),
    bitrate=st.one_of(st.none(), st.sampled_from([10_000, 500_000]), st.integers(0, 2**64 - 1)),
    threads=st.one_of(st.just(0), st.integers(0, 2**32 - 1)),
    path=st.one_of(st.none(), HOSTILE_PATHS),
    container=st.integers(-2, 6),
    way=st.sampled_from(["Encode", "Framed"]),
    landed=st.one_of(
        st.just(0),
        st.just(0),
        st.sampled_from([2, 4, 1024, LEASE - 4, LEASE - 2, LEASE, LEASE + 4, 2**63]),
        st.integers(0, 2**64 - 1),
    ),
)
def test_encode_descriptors(
    daemon,
    stub,
    width,
    height,
    fmt,
    fps,
    pieces,
    codec,
    crf,
    preset,
    profile,
    bitrate,
    threads,
    path,
    container,
    way,
    landed,
) -> None:  # type: ignore[no-untyped-def]
    s, token = stub
    lease = s.Lease(pb.LeaseRequest(client_token=token, size=LEASE, wait_ms=5000))
    if 0 < landed <= LEASE - 4:
        write_count(token, lease, landed, 2**32 - 1)  # landed already: never waited for
    ids = {"mine": lease.lease_id, "unknown": "ab" * 16, "empty": "", "garbage": "../\x00" * 9}
    frame_ranges = [
        pb.FrameRange(lease_id=ids[k], offset=o, frame_count=n, row_stride=rs, frame_stride=fs)
        for k, o, n, rs, fs in pieces
    ]
    options = pb.CodecOptions(codec=codec, preset=preset, threads=threads, profile=profile)
    if crf is not None:
        options.crf = crf
    if bitrate is not None:
        options.bitrate = bitrate
    output = pb.OutputSpec(container=container)  # type: ignore[arg-type]
    if path is None:
        output.bytes.SetInParent()
    else:
        output.file.path = path
    request = pb.EncodeRequest(
        client_token=token,
        video=pb.VideoDescriptor(
            width=width,
            height=height,
            pixel_format=fmt,  # type: ignore[arg-type]
            fps=pb.Rational(num=fps[0], den=fps[1]),
            ranges=frame_ranges,
        ),
        codec=options,
        output=output,
        landed_count_offset=landed,
    )
    # A framed connection is one for the whole run: no request's error may end it.
    code = framed(daemon).ask(request) if way == "Framed" else call(getattr(s, way), request)
    COUNTS[code.name] += 1
    assert code in ACCEPTABLE, (code, request)
    if code == grpc.StatusCode.OK:
        assert frame_ranges and all(r.lease_id == lease.lease_id for r in frame_ranges)
        assert all(in_bounds(r, width, height, fmt) for r in frame_ranges)
    assert_lease_kept_unless_ok(s, token, lease.lease_id, code)


def assert_lease_kept_unless_ok(s, token: str, lease_id: str, code: grpc.StatusCode) -> None:  # type: ignore[no-untyped-def]
    """An accepted request consumed the lease; a refused one left it with the client."""
    released = call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=lease_id))
    if code == grpc.StatusCode.OK:
        assert released == grpc.StatusCode.NOT_FOUND, "an encoded lease is still held"
    else:
        assert released == grpc.StatusCode.OK, f"a request refused with {code} lost its lease"


FIELDS = [
    "width", "height", "pixel_format", "fps.num", "fps.den", "offset", "frame_count",
    "row_stride", "frame_stride", "lease_id", "crf", "gop", "threads", "preset", "codec",
    "path", "container", "extra", "bitrate", "profile",
]  # fmt: skip


@settings(
    max_examples=examples(1000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(field=st.sampled_from(FIELDS), number=I64, text=HOSTILE_PATHS)
def test_one_bad_field(stub, field, number, text) -> None:  # type: ignore[no-untyped-def]
    """A valid request with one field made hostile: each check is reached on its own."""
    s, token = stub
    lease = s.Lease(pb.LeaseRequest(client_token=token, size=LEASE, wait_ms=5000))
    r = pb.FrameRange(lease_id=lease.lease_id, frame_count=4)
    request = pb.EncodeRequest(
        client_token=token,
        video=pb.VideoDescriptor(
            width=32, height=32, pixel_format=pb.PIXEL_FORMAT_RGB24,
            fps=pb.Rational(num=24, den=1), ranges=[r],
        ),
        codec=pb.CodecOptions(codec="h264"),
        output=pb.OutputSpec(bytes=pb.BytesOutput()),
    )  # fmt: skip
    v, c = request.video, request.codec
    if field in ("width", "height"):
        setattr(v, field, number)
    elif field == "pixel_format":
        v.pixel_format = number % 64 - 8  # type: ignore[assignment]
    elif field.startswith("fps."):
        setattr(v.fps, field[4:], number)
    elif field in ("offset", "frame_count", "row_stride", "frame_stride"):
        setattr(r, field, number)
        v.ranges[0].CopyFrom(r)
    elif field == "lease_id":
        v.ranges[0].lease_id = text
    elif field in ("crf", "gop"):
        setattr(c, field, max(-(2**31), min(number, 2**31 - 1)))
    elif field == "threads":
        c.threads = number % 2**32
    elif field in ("preset", "codec", "profile"):
        setattr(c, field, text)
    elif field == "bitrate":
        c.bitrate = number % 2**64
    elif field == "path":
        request.output.file.path = text
    elif field == "container":
        request.output.container = number % 16 - 4  # type: ignore[assignment]
    else:
        c.extra[text[:64] or "k"] = text
    code = call(s.Encode, request)
    COUNTS["one:" + code.name] += 1
    assert code in ACCEPTABLE, (code, field, number, text)
    if code == grpc.StatusCode.OK:
        assert in_bounds(v.ranges[0], v.width, v.height, v.pixel_format)
    if field != "lease_id":
        assert_lease_kept_unless_ok(s, token, lease.lease_id, code)
    call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id))


def leased_clip(s, token: str) -> tuple[pb.LeaseResponse, pb.EncodeRequest]:  # type: ignore[no-untyped-def]
    """A fresh lease, and a valid request to encode four 32x32 RGB frames in it."""
    lease = s.Lease(pb.LeaseRequest(client_token=token, size=LEASE, wait_ms=5000))
    video = pb.VideoDescriptor(
        width=32, height=32, pixel_format=pb.PIXEL_FORMAT_RGB24, fps=pb.Rational(num=24, den=1),
        ranges=[pb.FrameRange(lease_id=lease.lease_id, frame_count=4)],
    )  # fmt: skip
    output = pb.OutputSpec(bytes=pb.BytesOutput())
    codec = pb.CodecOptions(codec="h264")
    return lease, pb.EncodeRequest(client_token=token, video=video, codec=codec, output=output)


DEADLINES = st.one_of(
    st.sampled_from(
        ["", "0", "1", "-5", "nan", "inf", "1e300", "1.5e9", " 1", "1.", ".5", "9" * 13,
         "99999999999.999999999", "4102444800", "0x10", "1_000", "+1", "1e3"]
    ),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
    st.floats(-1e12, 1e12, allow_nan=False).map(repr),
)  # fmt: skip


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(value=DEADLINES, stream=st.booleans())
def test_deadline_metadata(stub, value, stream) -> None:  # type: ignore[no-untyped-def]
    """Any value in the client-deadline metadata: one that is not a plain decimal Unix time
    is ignored, one already past stops the encode as its deadline; nothing else changes."""
    s, token = stub
    lease, request = leased_clip(s, token)
    video, codec, output = request.video, request.codec, request.output
    metadata = ((DEADLINE_KEY, value),)  # printable ASCII: gRPC sends no other text value
    try:
        if stream:
            header = pb.StreamHeader(
                client_token=token, width=32, height=32, pixel_format=video.pixel_format,
                fps=video.fps, codec=codec, output=output,
            )  # fmt: skip
            messages = [
                pb.StreamRequest(header=header),
                pb.StreamRequest(chunk=pb.StreamChunk(range=video.ranges[0])),
                pb.StreamRequest(end=pb.StreamEnd()),
            ]
            replies = s.EncodeStream(iter(messages), timeout=30, metadata=metadata)
        else:
            replies = s.Encode(request, timeout=30, metadata=metadata)
        for _ in replies:
            pass
        code = grpc.StatusCode.OK
    except grpc.RpcError as err:
        code = err.code()
    finally:
        call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id))
    COUNTS["deadline:" + code.name] += 1
    sent = re.fullmatch(r"[0-9]{1,12}(\.[0-9]{1,9})?", value)
    if sent is None or float(value) > time.time() + 30:
        assert code == grpc.StatusCode.OK, (value, code)  # ignored, or later than gRPC's
    elif float(value) < time.time() - 1:
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED, (value, code)


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    value=st.one_of(
        st.floats(),  # NaN, infinities, subnormals, huge and below zero too
        st.binary(min_size=8, max_size=8).map(lambda raw: struct.unpack("<d", raw)[0]),
        st.sampled_from([0.0, 1.0, 1.5e9, 4102444800.0, 2.0**63]),
        st.floats(-5, 60).map(lambda ahead: time.time() + ahead),
    )
)
def test_framed_deadline(daemon: Daemon, stub, value: float) -> None:  # type: ignore[no-untyped-def]
    """Any `deadline_unix_s` on a framed encode (any 8 bytes on the wire included): one
    that is no finite time from the epoch is refused naming it, the lease kept; 0 is
    none; one past stops the encode as its deadline; the connection carries on."""
    s, token = stub
    lease, request = leased_clip(s, token)
    release = pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id)
    try:
        reply = framed(daemon).exchange(pb.FramedRequest(encode=request, deadline_unix_s=value))
        code = reply_code(reply)
    except BaseException:
        call(s.Release, release)
        raise
    COUNTS["framed-deadline:" + code.name] += 1
    refused = not math.isfinite(value) or value < 0
    if refused:
        assert_lease_kept_unless_ok(s, token, lease.lease_id, code)  # and released
    else:
        call(s.Release, release)
    if refused:
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (value, reply)
        assert reply.error.field == "deadline_unix_s"
    elif value == 0 or value > time.time() + 30:
        assert code == grpc.StatusCode.OK, (value, reply)
    elif value < time.time() - 1:
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED, (value, reply)


@settings(
    max_examples=examples(600),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    size=U64,
    wait=st.integers(0, 2**32 - 1),
    token=st.sampled_from(["good", "bad", ""]),
    release=st.one_of(st.just("same"), st.text(max_size=80)),
    framed_way=st.booleans(),
    tag=TAGS,
    release_tag=TAGS,
    more=st.one_of(
        st.lists(st.one_of(U64, st.integers(0, 17 * 1024 * 1024)), max_size=6),
        st.integers(1020, 1030).map(lambda n: [4096] * n),  # about the cap of 1024 in all
    ),
)
def test_lease_and_release(  # type: ignore[no-untyped-def]
    daemon, stub, size, wait, token, release, framed_way, tag, release_tag, more
) -> None:
    """Leases and releases as gRPC calls, or on a kept "VSF2" connection to the framed
    socket: the same answers either way. Tags: only 1-64 of A-Z a-z 0-9 _ - are taken.
    Further regions (`more_sizes`) come all or none, at most 1024 in all."""
    s, good = stub
    tok = good if token == "good" else ("f" * 32 if token == "bad" else "")
    lease_request = pb.LeaseRequest(
        client_token=tok, size=size, wait_ms=min(wait, 200), tag=tag, more_sizes=more
    )
    got = None
    if framed_way:
        reply = framed(daemon).exchange(lease_request)
        code = reply_code(reply)
        got = reply.lease if code == grpc.StatusCode.OK else None
    else:
        try:
            got = s.Lease(lease_request)
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            code = err.code()
    COUNTS["lease:" + code.name] += 1
    withdrawn = WITHDRAWN if tag else set()
    assert (
        code in CLIENT_ERRORS | {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED} | withdrawn
    )
    if code == grpc.StatusCode.OK:
        assert got is not None and got.lease_id and 0 < size <= 16 * 1024 * 1024
        assert not tag or TAG_RULE.fullmatch(tag), tag
        assert len(got.more) == len(more) < 1024
        assert all(0 < n <= 16 * 1024 * 1024 for n in more)
        assert sum(r.size for r in got.more) + got.size <= 64 * 1024 * 1024
    if release_tag:  # by the tag alone: OK whether or not it names a lease, if well formed
        by_tag = pb.ReleaseRequest(client_token=tok, tag=release_tag)
        code = release_code(daemon, s, by_tag, framed_way)
        COUNTS["release-tag:" + code.name] += 1
        assert code in CLIENT_ERRORS | {grpc.StatusCode.OK}
        if tok == good:
            assert (code == grpc.StatusCode.OK) == bool(TAG_RULE.fullmatch(release_tag)), code
    if release != "same":
        release_request = pb.ReleaseRequest(client_token=tok, lease_id=release)
        code = release_code(daemon, s, release_request, framed_way)
        COUNTS["release:" + code.name] += 1
        assert code in CLIENT_ERRORS
    if got is not None:
        for granted in (got, *got.more):
            call(s.Release, pb.ReleaseRequest(client_token=tok, lease_id=granted.lease_id))


def release_code(daemon, s, request: pb.ReleaseRequest, framed_way: bool) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    """A Release's answer, on a kept framed connection or as the gRPC call."""
    if framed_way:
        return reply_code(framed(daemon).exchange(request))
    return call(s.Release, request)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    header=st.booleans(),
    width=st.integers(-2, 70),
    height=st.integers(-2, 70),
    messages=st.lists(
        st.one_of(
            st.tuples(st.just("inline"), st.binary(max_size=20000)),
            st.tuples(st.just("range"), I64, I64),
            st.tuples(st.just("end"), st.binary(max_size=64)),
            st.tuples(st.just("header"), st.just(b"")),
        ),
        max_size=5,
    ),
)
def test_stream_messages(stub, header, width, height, messages) -> None:  # type: ignore[no-untyped-def]
    s, token = stub
    lease = s.Lease(pb.LeaseRequest(client_token=token, size=LEASE, wait_ms=5000))
    requests = []
    if header:
        requests.append(
            pb.StreamRequest(
                header=pb.StreamHeader(
                    client_token=token, width=width, height=height,
                    pixel_format=pb.PIXEL_FORMAT_RGB24, fps=pb.Rational(num=24, den=1),
                    audio=pb.AudioSpec(sample_rate=16000, channels=1,
                                       sample_format=pb.SAMPLE_FORMAT_S16),
                )
            )
        )  # fmt: skip
    for kind, *args in messages:
        if kind == "inline":
            requests.append(pb.StreamRequest(chunk=pb.StreamChunk(inline=args[0])))
        elif kind == "range":
            r = pb.FrameRange(lease_id=lease.lease_id, offset=args[0], frame_count=args[1])
            requests.append(pb.StreamRequest(chunk=pb.StreamChunk(range=r)))
        elif kind == "end":
            audio = [pb.AudioData(inline=args[0])]
            requests.append(pb.StreamRequest(end=pb.StreamEnd(audio_data=audio)))
        else:
            requests.append(pb.StreamRequest(header=pb.StreamHeader()))
    try:
        for _ in s.EncodeStream(iter(requests), timeout=30):
            pass
        code = grpc.StatusCode.OK
    except grpc.RpcError as err:
        code = err.code()
    COUNTS["stream:" + code.name] += 1
    assert code in ACCEPTABLE, code
    if code == grpc.StatusCode.OK:  # an empty stream is refused, never an empty file
        inline = sum(len(a[0]) for k, *a in messages if k == "inline")
        assert inline >= width * height * 3 or any(k == "range" for k, *_ in messages)
    call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id))


DOUBLES = st.one_of(
    st.floats(0, 10),
    st.sampled_from([0.0, -1.0, 1e-300, 1e300, float("nan"), float("inf"), -float("inf")]),
    st.floats(allow_nan=True, allow_infinity=True),
)
U32 = st.one_of(st.integers(0, 130), st.sampled_from([640, 641, 1920, 1921, 8192, 2**32 - 1]))
ENUMS = st.one_of(st.integers(0, 3), st.integers(-(2**31), 2**31 - 1))


@st.composite
def previews(draw) -> pb.Previews:  # type: ignore[no-untyped-def]
    """Previews with every field drawn raw: enums past their values, NaN and huge sizes."""
    p = pb.Previews()
    if draw(st.booleans()):
        t = p.thumbnail
        t.SetInParent()
        at = draw(st.sampled_from(["none", "pick", "index", "time_s"]))
        if at == "pick":
            t.pick = draw(ENUMS)
        elif at == "index":
            t.index = draw(U64)
        elif at == "time_s":
            t.time_s = draw(DOUBLES)
        t.max_width, t.max_height, t.quality = draw(U32), draw(U32), draw(U32)
        t.format = draw(ENUMS)
    if draw(st.booleans()):
        sheet = p.sprite_sheet
        sheet.SetInParent()
        sheet.tiles, sheet.tile_width, sheet.columns = draw(U32), draw(U32), draw(U32)
        sheet.quality, sheet.format = draw(U32), draw(ENUMS)
        sheet.interval_s = draw(DOUBLES)
    return p


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    asked=previews(),
    frames=st.integers(1, 12),
    way=st.sampled_from(["Encode", "Framed", "EncodeStream"]),
    path=st.one_of(st.none(), st.sampled_from(["p/ok.mp4", "p/ok.webm", "p/../x.mp4"])),
)
def test_preview_fields(daemon, stub, asked, frames, way, path) -> None:  # type: ignore[no-untyped-def]
    """Every preview field raw, on every way in: a client error or a result with the
    previews asked for; a refused request keeps its lease."""
    s, token = stub
    lease = s.Lease(pb.LeaseRequest(client_token=token, size=LEASE, wait_ms=5000))
    video = dict(width=32, height=32, pixel_format=pb.PIXEL_FORMAT_RGB24)
    fps = pb.Rational(num=24, den=1)
    output = pb.OutputSpec(bytes=pb.BytesOutput())
    if path is not None:
        output = pb.OutputSpec(file=pb.FileOutput(path=path, overwrite=True))
    r = pb.FrameRange(lease_id=lease.lease_id, frame_count=frames)
    results: list[pb.EncodeResult] = []
    if way == "EncodeStream":
        header = pb.StreamHeader(
            client_token=token, fps=fps, output=output, previews=asked, **video
        )
        messages = [
            pb.StreamRequest(header=header),
            pb.StreamRequest(chunk=pb.StreamChunk(range=r)),
            pb.StreamRequest(end=pb.StreamEnd()),
        ]
        try:
            results = [
                e.result for e in s.EncodeStream(iter(messages), timeout=30) if e.HasField("result")
            ]
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            code = err.code()
    else:
        request = pb.EncodeRequest(
            client_token=token,
            video=pb.VideoDescriptor(fps=fps, ranges=[r], **video),
            output=output,
            previews=asked,
        )
        if way == "Framed":
            reply = framed(daemon).exchange(request)
            code = reply_code(reply)
            results = [reply.result] if code == grpc.StatusCode.OK else []
        else:
            try:
                results = [e.result for e in s.Encode(request, timeout=30) if e.HasField("result")]
                code = grpc.StatusCode.OK
            except grpc.RpcError as err:
                code = err.code()
    COUNTS["previews:" + code.name] += 1
    assert code in ACCEPTABLE, (code, asked)
    if code == grpc.StatusCode.OK:
        (result,) = results
        kinds = [p.kind for p in result.previews]
        wanted = ["thumbnail"] * asked.HasField("thumbnail")
        wanted += ["sprite_sheet"] * asked.HasField("sprite_sheet")
        assert kinds == wanted, (kinds, asked)
        for preview in result.previews:
            assert preview.size_bytes > 0 and preview.mime_type in ("image/jpeg", "image/webp")
            if path is None:
                assert len(preview.data) == preview.size_bytes and not preview.path
            else:
                assert Path(preview.path).stat().st_size == preview.size_bytes
    if way != "EncodeStream":
        assert_lease_kept_unless_ok(s, token, lease.lease_id, code)
    call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id))


METHODS = {
    "Attach": "unary_unary",
    "Lease": "unary_unary",
    "Release": "unary_unary",
    "Status": "unary_unary",
    "Encode": "unary_stream",
    "EncodeStream": "stream_stream",
}


def valid_bytes(token: str, lease_id: str) -> list[bytes]:
    """Well-formed messages of each kind, for the fuzzer to cut and flip."""
    header = pb.StreamHeader(
        client_token=token, width=32, height=32, pixel_format=pb.PIXEL_FORMAT_RGB24,
        fps=pb.Rational(num=24, den=1), request_id="r-1",
    )  # fmt: skip
    video = pb.VideoDescriptor(
        width=32, height=32, pixel_format=pb.PIXEL_FORMAT_RGB24, fps=pb.Rational(num=24, den=1),
        ranges=[pb.FrameRange(lease_id=lease_id, frame_count=2)],
    )  # fmt: skip
    return [
        pb.AttachRequest(client_name="fuzz", pid=7).SerializeToString(),
        pb.LeaseRequest(client_token=token, size=4096, wait_ms=10).SerializeToString(),
        pb.ReleaseRequest(client_token=token, lease_id=lease_id).SerializeToString(),
        pb.LeaseRequest(client_token=token, size=4096, wait_ms=10, tag="t-1").SerializeToString(),
        pb.ReleaseRequest(client_token=token, tag="t-1").SerializeToString(),
        pb.LeaseRequest(
            client_token=token, size=4096, wait_ms=10, more_sizes=[8192, 4096], tag="t-3"
        ).SerializeToString(),
        pb.EncodeRequest(client_token=token, request_id="r-2", video=video).SerializeToString(),
        pb.StreamRequest(header=header).SerializeToString(),
        pb.EncodeRequest(
            client_token=token,
            request_id="r-4",
            video=video,
            previews=pb.Previews(
                thumbnail=pb.Thumbnail(index=1, max_width=64, format=pb.IMAGE_FORMAT_WEBP),
                sprite_sheet=pb.SpriteSheet(tiles=2, tile_width=16, columns=2, quality=50),
            ),
        ).SerializeToString(),
        pb.EncodeRequest(
            client_token=token,
            request_id="r-5",
            video=video,
            codec=pb.CodecOptions(profile="small", bitrate=200_000),
        ).SerializeToString(),
        pb.StreamRequest(
            header=pb.StreamHeader(
                client_token=token, width=16, height=16, codec=pb.CodecOptions(profile="fast")
            )
        ).SerializeToString(),
        pb.StreamRequest(chunk=pb.StreamChunk(inline=b"\x01" * 64)).SerializeToString(),
        pb.FramedRequest(
            lease=pb.LeaseRequest(client_token=token, size=4096, wait_ms=10)
        ).SerializeToString(),
        pb.FramedRequest(
            release=pb.ReleaseRequest(client_token=token, lease_id=lease_id)
        ).SerializeToString(),
        pb.FramedRequest(
            lease=pb.LeaseRequest(client_token=token, size=4096, wait_ms=10, tag="t-2")
        ).SerializeToString(),
        pb.FramedRequest(
            release=pb.ReleaseRequest(client_token=token, tag="t-2")
        ).SerializeToString(),
        pb.FramedRequest(
            lease=pb.LeaseRequest(client_token=token, size=4096, wait_ms=10, more_sizes=[4096])
        ).SerializeToString(),
        pb.FramedRequest(
            encode=pb.EncodeRequest(client_token=token, request_id="r-3", video=video)
        ).SerializeToString(),
    ]


@st.composite
def raw_messages(draw, token: str, lease_id: str) -> bytes:  # type: ignore[no-untyped-def]
    """Random bytes, or a valid message cut short, flipped, or with bytes spliced in."""
    kind = draw(st.sampled_from(["random", "cut", "flip", "splice", "bad-utf8"]))
    if kind == "random":
        return bytes(draw(st.binary(max_size=256)))
    base = draw(st.sampled_from(valid_bytes(token, lease_id)))
    if kind == "cut":
        return base[: draw(st.integers(0, len(base)))]
    at = draw(st.integers(0, len(base) - 1))
    if kind == "flip":
        return base[:at] + bytes([base[at] ^ draw(st.integers(1, 255))]) + base[at + 1 :]
    if kind == "bad-utf8":  # a string field (1 is a string in most requests) of bad UTF-8
        junk = draw(st.binary(min_size=1, max_size=8).filter(lambda b: not _utf8(b)))
        return bytes([0x0A, len(junk)]) + junk + base
    return base[:at] + bytes(draw(st.binary(min_size=1, max_size=16))) + base[at:]


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@settings(
    max_examples=examples(1200),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(method=st.sampled_from(sorted(METHODS)), data=st.data())
def test_raw_bytes(daemon: Daemon, stub, method: str, data) -> None:  # type: ignore[no-untyped-def]
    """Bytes straight onto the wire, for every method: only documented status codes; a
    message that fails to decode is INVALID_ARGUMENT, never UNKNOWN or INTERNAL."""
    s, token = stub
    # Drawn before the lease is taken (hypothesis may abandon an example inside a draw),
    # with a stand-in id of the same length swapped for the real one after.
    stand_in = "e" * 32
    drawn = data.draw(st.lists(raw_messages(token, stand_in), min_size=1, max_size=3))
    lease = s.Lease(pb.LeaseRequest(client_token=token, size=LEASE, wait_ms=5000))
    messages = [m.replace(stand_in.encode(), lease.lease_id.encode()) for m in drawn]
    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        fn = getattr(channel, METHODS[method])(f"/video_sidecar.v1.VideoSidecar/{method}")
        if method == "Lease":  # a well-formed one takes a lease: give it back
            try:
                granted = pb.LeaseResponse.FromString(fn(messages[0], timeout=30))
                code = grpc.StatusCode.OK
            except grpc.RpcError as err:
                code = err.code()
            else:  # every region it granted, `more` too
                for region in (granted, *granted.more):
                    call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=region.lease_id))
        elif method.startswith("Encode"):
            code = grpc.StatusCode.OK
            try:
                replies = fn(iter(messages) if method == "EncodeStream" else messages[0])
                results = [pb.EncodeEvent.FromString(reply).result for reply in replies]
                for result in results:
                    # A flipped byte can ask for a spare lease: give it back too.
                    for spare in (result.next_lease.lease_id, result.data_lease.lease_id):
                        if spare:
                            call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=spare))
            except grpc.RpcError as err:
                code = err.code()
        else:
            code = call(fn, messages[0])
    COUNTS["raw:" + code.name] += 1
    withdrawn = WITHDRAWN if method == "Lease" else set()
    assert code in ACCEPTABLE | {grpc.StatusCode.RESOURCE_EXHAUSTED} | withdrawn, (
        code,
        method,
        messages,
    )
    call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id))


@settings(
    max_examples=examples(400),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    # Mostly plausible, so accepted requests are common too.
    frames=st.sampled_from([0, 1, 2, 2, 3, 3]),
    audio_offset=st.one_of(st.sampled_from([0, 3 * 32 * 32 * 3] * 3), I64),
    audio_size=st.one_of(st.sampled_from([4000, 4000, 4000, 0, 6, LEASE]), I64),
    channels=st.one_of(st.sampled_from([1, 2, 2]), st.integers(0, 9)),
    rate=st.sampled_from([48000, 48000, 16000, 44100, 0, 7, 2**31]),
    fmt=st.one_of(st.sampled_from([1, 2]), st.integers(-1, 3)),
    container=st.sampled_from([0, 1, 2, 3]),
    other=st.sampled_from(["same", "separate", "unknown"]),
)
def test_audio_in_leases(
    stub, frames, audio_offset, audio_size, channels, rate, fmt, container, other
) -> None:  # type: ignore[no-untyped-def]
    """Audio in the video's lease, its own lease or a missing one: accepted requests consume
    every lease they name; refused ones leave each with the client."""
    s, token = stub
    lease = s.Lease(pb.LeaseRequest(client_token=token, size=LEASE, wait_ms=5000))
    extra = s.Lease(pb.LeaseRequest(client_token=token, size=LEASE, wait_ms=5000))
    audio_lease = {"same": lease.lease_id, "separate": extra.lease_id, "unknown": "cd" * 16}
    container_codec = "vp9" if container == 3 else ""
    request = pb.EncodeRequest(
        client_token=token,
        video=pb.VideoDescriptor(
            width=32, height=32, pixel_format=pb.PIXEL_FORMAT_RGB24,
            fps=pb.Rational(num=24, den=1),
            ranges=[pb.FrameRange(lease_id=lease.lease_id, frame_count=frames)],
        ),
        codec=pb.CodecOptions(codec=container_codec),
        output=pb.OutputSpec(container=container),  # type: ignore[arg-type]
        audio=pb.AudioSpec(sample_rate=rate, channels=channels, sample_format=fmt),  # type: ignore[arg-type]
        audio_data=[pb.AudioData(range=pb.AudioRange(
            lease_id=audio_lease[other], offset=audio_offset, size=audio_size))],
    )  # fmt: skip
    code = call(s.Encode, request)
    COUNTS["audio:" + code.name] += 1
    assert code in ACCEPTABLE, (code, request)
    assert_lease_kept_unless_ok(s, token, lease.lease_id, code)
    if other == "separate":
        assert_lease_kept_unless_ok(s, token, extra.lease_id, code)
    call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=extra.lease_id))


CODEC_OF = {"libx264": "h264", "libx265": "h265", "libsvtav1": "av1", "libvpx-vp9": "vp9"}
PARAMS_OF = {"libx264": "x264-params", "libx265": "x265-params", "libsvtav1": "svtav1-params"}
PLANTED = "/tmp/video-sidecar-fuzz-planted"  # a path that must never come to exist


@st.composite
def codec_extra(draw) -> tuple[str, dict[str, str]]:  # type: ignore[no-untyped-def]
    """Options from a grammar of real encoder option names: allowed ones with valid or
    wrong values, and dangerous ones (files, logs, passes) with paths for values."""
    encoder = draw(st.sampled_from(sorted(CODEC_OF)))
    allowed = ALLOWED[encoder]
    value = st.one_of(
        st.sampled_from([PLANTED, f"{PLANTED}.log", "1", "0", "-1", "48", "film", "2,2"]),
        st.text(max_size=12),
    )

    def allowed_value(name: str) -> str:
        rule = allowed[name]
        if isinstance(rule, Params):
            return ""  # filled below
        return draw(st.one_of(st.sampled_from(rule.examples()), value))

    names = st.one_of(
        st.sampled_from(sorted(allowed)), st.sampled_from(KNOWN_DANGEROUS[encoder] or ("x",))
    )
    extra = {}
    for name in draw(st.lists(names, max_size=4, unique=True)):
        extra[name] = allowed_value(name) if name in allowed else draw(value)
    if encoder in PARAMS_OF and draw(st.booleans()):
        params = allowed[PARAMS_OF[encoder]]
        assert isinstance(params, Params)
        keys = st.one_of(
            st.sampled_from(sorted(params.allowed)),
            st.sampled_from(KNOWN_DANGEROUS_PARAMS[encoder]),
        )
        pairs = []
        for key in draw(st.lists(keys, min_size=1, max_size=4, unique=True)):
            rule = params.allowed.get(key)
            good = st.sampled_from(rule.examples()) if rule is not None else value
            pairs.append(f"{key}={draw(st.one_of(good, value))}")
        extra[PARAMS_OF[encoder]] = ":".join(pairs)
    return encoder, extra


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(choice=codec_extra())
def test_codec_options_grammar(daemon: Daemon, stub, choice) -> None:  # type: ignore[no-untyped-def]
    """Whatever the options, only documented answers; nothing is written outside the
    output root; a refused request keeps its lease."""
    encoder, extra = choice
    s, token = stub
    lease = s.Lease(pb.LeaseRequest(client_token=token, size=LEASE, wait_ms=5000))
    container = pb.CONTAINER_WEBM if encoder == "libvpx-vp9" else pb.CONTAINER_MP4
    request = pb.EncodeRequest(
        client_token=token,
        video=pb.VideoDescriptor(
            width=32, height=32, pixel_format=pb.PIXEL_FORMAT_RGB24,
            fps=pb.Rational(num=24, den=1),
            ranges=[pb.FrameRange(lease_id=lease.lease_id, frame_count=3)],
        ),
        codec=pb.CodecOptions(codec=CODEC_OF[encoder], extra=extra),
        output=pb.OutputSpec(container=container),
    )  # fmt: skip
    code = call(s.Encode, request)
    COUNTS["codec:" + code.name] += 1
    assert code in ACCEPTABLE, (code, encoder, extra)
    assert_lease_kept_unless_ok(s, token, lease.lease_id, code)
    planted = [p for p in Path(PLANTED).parent.glob(Path(PLANTED).name + "*")]
    assert not planted, f"an option wrote {planted}"
    for where in (Path.cwd(), daemon.dir):  # the daemon runs in the test's directory
        assert not list(where.glob("*2pass*")), "an option wrote a pass log"


@st.composite
def framed_tail(draw) -> tuple[bytes, bool]:  # type: ignore[no-untyped-def]
    """What may follow the good frames: nothing, a length over the limit (answered,
    then the connection ends: True), a frame cut short, or bytes with no framing."""
    kind = draw(st.sampled_from(["none", "oversized", "cut", "junk"]))
    if kind == "oversized":
        length = draw(st.integers(8 * 1024 * 1024 + 1, 2**32 - 1))
        return framing.header(length) + bytes(draw(st.binary(max_size=64))), True
    if kind == "cut":
        length = draw(st.integers(1, 4096))
        return framing.header(length) + bytes(draw(st.binary(max_size=length - 1))), False
    if kind == "junk":
        return bytes(draw(st.binary(min_size=1, max_size=64))), False
    return b"", False


@settings(
    max_examples=examples(600),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_raw_framed_bytes(daemon: Daemon, stub, data) -> None:  # type: ignore[no-untyped-def]
    """Bytes straight onto the framed socket: a preamble (now and then a wrong one),
    frames of random, cut, flipped and spliced messages, then something hostile. Each
    frame gets one reply, in order, with a documented status; a wrong preamble gets none;
    an oversized length gets one and the connection ends."""
    s, token = stub
    stand_in = "e" * 32
    preamble = data.draw(
        st.one_of(
            st.just(framing.PREAMBLE), st.just(framing.PREAMBLE), st.binary(min_size=4, max_size=4)
        ),
        label="preamble",
    )
    spoken = preamble == framing.PREAMBLE
    drawn = data.draw(st.lists(raw_messages(token, stand_in), max_size=3), label="messages")
    tail, ends = data.draw(framed_tail(), label="tail")
    lease = s.Lease(pb.LeaseRequest(client_token=token, size=LEASE, wait_ms=5000))
    messages = [m.replace(stand_in.encode(), lease.lease_id.encode()) for m in drawn]
    connection = Framed(f"{daemon.socket}.framed", preamble=b"")
    try:
        try:
            connection.sock.sendall(
                preamble + b"".join(map(framing.frame, messages)) + tail if spoken else preamble
            )
        except (BrokenPipeError, ConnectionResetError):
            assert not spoken
        if not spoken:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_WR)
            assert connection.reply() is None, "a stranger got a reply"
            COUNTS["framed:hung-up"] += 1
        else:
            for index in range(len(messages) + ends):
                reply = connection.reply()
                assert reply is not None, "a frame went unanswered"
                code = reply_code(reply)
                COUNTS[f"framed:{code.name}"] += 1
                withdrawn = WITHDRAWN if leases(messages, index) else set()
                assert code in ACCEPTABLE | {grpc.StatusCode.RESOURCE_EXHAUSTED} | withdrawn, (
                    code,
                    messages,
                )
                granted = [reply.result.next_lease.lease_id, reply.result.data_lease.lease_id]
                # A lease request that got through: every region it granted.
                granted += [r.lease_id for r in (reply.lease, *reply.lease.more)]
                for spare in filter(None, granted):
                    call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=spare))
            if ends:
                assert connection.reply() is None, "the connection outlived an oversized frame"
    except ConnectionResetError:
        assert not spoken
    finally:
        connection.sock.close()
        call(s.Release, pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id))


def leases(messages: list[bytes], index: int) -> bool:
    """Whether frame `index` decodes as a Lease request."""
    if index >= len(messages):
        return False
    try:
        return pb.FramedRequest.FromString(messages[index]).WhichOneof("request") == "lease"
    except DecodeError:  # not a message at all
        return False


def test_still_serving_and_nothing_held(daemon: Daemon, stub) -> None:  # type: ignore[no-untyped-def]
    with daemon.client() as c:
        assert c.health() == "SERVING"
        status = c.status()
        assert status.active_encodes == 0
        assert status.pool["active_leases"] == 0  # every lease came back
        assert c.encode(__import__("numpy").zeros((2, 32, 32, 3), "uint8")).frames == 2
    # Every fuzz test that ran on this daemon sent its examples, each answered. (Under
    # xdist the module's tests may be spread over workers, each with its own daemon.)
    for category, written in WRITTEN.items():
        answered = sum(v for k, v in COUNTS.items() if k.rpartition(":")[0] == category)
        assert answered == 0 or answered >= examples(written), (category, answered)
