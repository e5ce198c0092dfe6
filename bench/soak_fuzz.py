"""Fuzz soak: a real daemon under a long, bounded mix of hostile and valid gRPC requests.

Measures the daemon's memory while it runs (VmRSS and RssAnon from /proc/PID/status every
few seconds: warm start, end, max, and RssAnon again after `--idle` seconds of rest, alone
and with its encoder processes) and
tallies the answers by status code. Both transports are fuzzed: gRPC, and the framed
socket (its own framing broken, full-size requests refused, messages half sent and left).
An innocent client beside them asks for Status and a framed Release every 50 ms and keeps
its waits. Checks: (a) no UNKNOWN/INTERNAL/DATA_LOSS answer, (b) no file created outside
the output root, (c) every refused lease is still releasable and none is left held, (d)
no shared-memory segment left once the daemon stops, (e) with `--idle`, the daemon's
RssAnon once idle at most `--rss-bound` MiB over its warm start, (f) no innocent request
waited more than `--innocent-bound` seconds. Exits 1 when a check fails.

    python -m bench.soak_fuzz --minutes 10 --seed 1 --idle 60 --out soak.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import os
import queue
import random
import re
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sidecar.api import framing
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.tools.launcher import DaemonProcess

from .suites import tree_rss_anon

SERVICE = "/video_sidecar.v1.VideoSidecar/"
METHODS = [
    "Attach", "Lease", "Release", "Status", "Encode", "EncodeOnce", "EncodeStream",
    "EncodeSession",
]  # fmt: skip
LEASE = 64 * 1024
FRAME = 64 * 64 * 3  # valid requests send rgb24 64x64
SMALL: dict[str, Any] = {"width": 64, "height": 64, "pixel_format": pb.PIXEL_FORMAT_RGB24}
SERVER_ERRORS = {"UNKNOWN", "INTERNAL", "DATA_LOSS"}
REFUSED = {"INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE", "FAILED_PRECONDITION", "ALREADY_EXISTS"}
CONTAINERS = {"mp4": 1, "fmp4": 2, "webm": 3}  # pb.Container values
PATHS = ["../x.mp4", "/etc/passwd", "a/../../x.mp4", "..", "", "a/", "a\x00b.mp4", "ok.mp4"]
PATHS += ["./ok.mp4", "x" * 5000, "deep/" * 50 + "x.mp4"]
SPECIAL = [-(2**63), -(2**31), 2**31 - 1, 2**31, 2**32, 2**48, 2**62, 2**63 - 1]
EXTRA = [  # (codec, options, values): real x264/x265 options; {s} is outside the output root
    ("h264", "tune", "film zerolatency psnr grain bogus"),
    ("h264", "profile", "baseline main high high444 nope"),
    ("h264", "flags", "+cgop +global_header +bitexact bogus"),
    ("h264", "stats,pass", "{s}/x264.stats,1 relative.stats,1 relative.stats,2 x.stats,3"),
    ("h264", "x264-params", "dump-yuv=dump.yuv dump-yuv={s}/abs.yuv keyint=2:bframes=0 nonsense"),
    ("h264", "x264opts", "psy-rd=1.0:trellis=2 ref=16:me=tesa"),
    ("h264", "threads", "auto 16 -1"),
    ("h265", "x265-params", "csv=x265.csv:csv-log-level=2 analysis-save={s}/a.dat"),
    ("h265", "tune,profile", "psnr,main grain,main10"),
]
FULL_RANGES = 4_000_000  # empty ranges: about 8 MB on the wire
FULL_OPTIONS = 500_000  # encoder options: about 7 MB
HALF_SENT_KEPT = 16  # half-sent framed connections a fuzzer keeps open at once
INNOCENT_EVERY_S = 0.05
SLOW_SIZE = (320, 240)  # abandoned encodes: frames x264 takes a while over at veryslow
SLOW_FRAME = SLOW_SIZE[0] * SLOW_SIZE[1] * 3
SLOW_FRAMES = 48
_LOG_LINE = re.compile(r"request_id=(abandon-\S+) status=(\S+) .*?ms=([0-9.]+)")


def innocent(socket_path: str, stop: Any, answers: Any) -> None:
    """A client with nothing to do with the hostile ones, every `INNOCENT_EVERY_S`: a
    Status and a framed Release. Its waits are the others' doing; they go to `answers`."""
    waits: list[float] = []
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        stub, framed = pb_grpc.VideoSidecarStub(channel), Framed(f"{socket_path}.framed")
        token = stub.Attach(pb.AttachRequest(client_name="innocent")).client_token
        release = pb.FramedRequest(release=pb.ReleaseRequest(client_token=token, tag="t"))
        data = framing.pack(release)
        framed.ask(data, 30)  # connected
        while not stop.wait(INNOCENT_EVERY_S):
            try:
                t = time.monotonic()
                stub.Status(pb.StatusRequest(), timeout=30)
                waits.append(time.monotonic() - t)
                t = time.monotonic()
                framed.ask(data, 30)
                waits.append(time.monotonic() - t)
            except grpc.RpcError:
                break  # the daemon is gone
        framed.close()
    answers.put(waits)


def stop_latencies(
    log: str, abandoned: dict[str, tuple[float, float, str]]
) -> dict[str, list[float]]:
    """For each abandoned encode the daemon did not finish first, by the way it was sent:
    seconds from its client leaving to the daemon ending it (its log's `ms`, counted from
    when it came)."""
    late: dict[str, list[float]] = {}
    for request_id, status, ms in _LOG_LINE.findall(log):
        if request_id in abandoned and status != "OK":
            sent, left, kind = abandoned[request_id]
            late.setdefault(kind, []).append(max(0.0, sent + float(ms) / 1e3 - left))
    return late


def full_size_requests(token: str) -> dict[str, tuple[bytes, bytes]]:
    """The full-size requests as EncodeRequest bytes, and as FramedRequest bytes."""
    ranges = pb.EncodeRequest(client_token=token, request_id="full-ranges")
    ranges.video.ranges.add()
    ranges.video.ranges.extend([ranges.video.ranges[0]] * (FULL_RANGES - 1))
    options = pb.EncodeRequest(client_token=token, request_id="full-options")
    options.codec.extra.update({f"k{i}": "v" for i in range(FULL_OPTIONS)})
    return {
        kind: (request.SerializeToString(), pb.FramedRequest(encode=request).SerializeToString())
        for kind, request in (("full-ranges", ranges), ("full-options", options))
    }


# As tests/helpers.py starts one; --daemon-opt KEY=VALUE adds or overrides.
DAEMON = {"slabs": 4, "slab_size": "16MiB", "lease_ttl": 30, "max_lease_wait": 5}
DAEMON |= {"shutdown_grace": 10, "log_level": "info"}


def i64(r: random.Random) -> int:
    pick = r.random()
    if pick < 0.5:
        return r.randint(-3, 300)
    return r.choice(SPECIAL) if pick < 0.8 else r.randint(-(2**63), 2**63 - 1)


def text(r: random.Random, n: int = 40) -> str:
    chars = (r.choice([r.randrange(32, 127), r.randrange(0x80, 0xD800)]) for _ in range(n))
    return "".join(map(chr, chars))[: r.randrange(n)]


def fps(r: random.Random | None = None) -> pb.Rational:
    return pb.Rational(num=i64(r), den=i64(r)) if r else pb.Rational(num=24, den=1)


def chunk(**fields: Any) -> pb.StreamRequest:
    return pb.StreamRequest(chunk=pb.StreamChunk(**fields))


CODE_OF = {code.value[0]: code for code in grpc.StatusCode}


class ReplyError(grpc.RpcError):
    """An EncodeSession request's error reply, as the status EncodeOnce would end with."""

    def __init__(self, error: pb.SessionError) -> None:
        self._code = CODE_OF.get(error.code, grpc.StatusCode.UNKNOWN)

    def code(self) -> grpc.StatusCode:
        return self._code


class Session:
    """An EncodeSession call kept open across requests, as the client keeps it; `raw`
    sends bytes as given."""

    def __init__(self, channel: grpc.Channel, raw: bool = False) -> None:
        method = channel.stream_stream(
            SERVICE + "EncodeSession",
            request_serializer=None if raw else pb.EncodeRequest.SerializeToString,
            response_deserializer=pb.SessionReply.FromString,
        )
        self.requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.replies = method(iter(self.requests.get, None))

    def __call__(self, request: Any, timeout: float | None = None) -> pb.EncodeResult:
        self.requests.put(request)
        reply = next(self.replies)
        if reply.HasField("error"):
            raise ReplyError(reply.error)
        return reply.result

    def close(self) -> None:
        self.requests.put(None)


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
            raise ReplyError(pb.SessionError(code=grpc.StatusCode.UNKNOWN.value[0]))
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


class SoakClient:
    """One client thread's connections: its own channel, token, slab mappings, random stream
    and tallies."""

    def __init__(self, socket: str, scratch: Path, seed: int) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.stub = pb_grpc.VideoSidecarStub(self.channel)
        self.scratch, self.r, self.seed = scratch, random.Random(seed), seed
        attached = self.stub.Attach(pb.AttachRequest(client_name=f"soak-{seed}"))
        self.token = attached.client_token
        self.maps: dict[int, mmap.mmap] = {}
        for slab in attached.slabs:
            with open(os.path.join(attached.shm_dir, slab.shm_name), "r+b") as f:
                self.maps[slab.id] = mmap.mmap(f.fileno(), slab.size)
        self.codes: Counter[str] = Counter()
        self.offending: Counter[str] = Counter()
        self.problems: list[str] = []
        self.held: set[str] = set()
        self.session, self.raw_session = Session(self.channel), Session(self.channel, raw=True)
        self.framed = Framed(f"{socket}.framed")
        self.left_open: list[socket.socket] = []  # framed connections with a half-sent message
        self.full = full_size_requests(self.token)  # made once: building one holds the GIL
        # request id: (sent, left, how)
        self.abandoned_at: dict[str, tuple[float, float, str]] = {}
        self.raw_framed = Framed(f"{socket}.framed", raw=True)

    def close(self) -> None:
        for lease_id in sorted(self.held):
            self.release(lease_id, "cleanup")
        self.session.close()
        self.raw_session.close()
        self.framed.close()
        self.raw_framed.close()
        for sock in self.left_open:
            sock.close()
        self.channel.close()
        for m in self.maps.values():
            m.close()

    def call(self, kind: str, fn: Callable[..., Any], request: Any, detail: str = "") -> str:
        try:
            result = fn(request, timeout=30)
            results = [result] if isinstance(result, pb.EncodeResult) else []  # EncodeOnce
            if not hasattr(result, "DESCRIPTOR") and not isinstance(result, bytes):
                # A reply stream.
                results = [e.result for e in result if isinstance(e, pb.EncodeEvent)]
            spares = []
            for one in results:
                if one.HasField("next_lease"):
                    spares.append(one.next_lease.lease_id)
                if one.HasField("data_lease"):  # an output to read, then free
                    spares.append(one.data_lease.lease_id)
            code = "OK"
            for lease_id in dict.fromkeys(spares):  # granted with the result: ours to give back
                if self.release(lease_id, "release-next") != "OK":
                    self.problems.append("(c) a lease granted with a result was not releasable")
        except grpc.RpcError as err:
            code = err.code().name
        self.codes[f"{kind}:{code}"] += 1
        if code in SERVER_ERRORS:
            self.offending[f"{kind} {detail}".strip() + f" -> {code}"] += 1
        return code

    def lease(self, frames: bytes = b"") -> pb.LeaseResponse:
        request = pb.LeaseRequest(client_token=self.token, size=LEASE, wait_ms=5000)
        lease = self.stub.Lease(request, timeout=30)
        self.held.add(lease.lease_id)
        self.maps[lease.slab_id][lease.offset : lease.offset + len(frames)] = frames
        return lease

    def release(self, lease_id: str, kind: str = "release-own", token: str | None = None) -> str:
        self.held.discard(lease_id)
        request = pb.ReleaseRequest(client_token=self.token, lease_id=lease_id)
        request.client_token = request.client_token if token is None else token
        return self.call(kind, self.stub.Release, request)

    def settle(self, kind: str, lease_id: str, code: str) -> None:
        """Give a lease back; one named by a refused request must still be ours."""
        released = self.release(lease_id)
        if code in REFUSED and released != "OK":
            self.problems.append(f"(c) {kind} refused with {code}, then Release said {released}")

    # -- request kinds ---------------------------------------------------------------------


class FramedFuzzing(SoakClient):
    """What is thrown at the framed socket's own framing and limits, and encodes left by
    their clients."""

    def hostile_framed(self) -> None:
        """The framed socket's own framing broken: a wrong preamble, a length over the
        limit, a message cut short. The daemon must hang up or refuse, and keep serving."""
        r, connection = self.r, Framed(self.framed.path, raw=True)
        pick = r.random()
        try:
            if pick < 0.4:
                reply = connection.ask(framing.frame(b"ab"), 30, r.randbytes(4))
                kind, bad = "framed-preamble", reply is not None
            elif pick < 0.7:
                size = r.choice([8 * 1024 * 1024 + 1, 2**31, 2**32 - 1])
                reply = connection.ask(framing.header(size) + b"x" * 16, 30)
                kind = "framed-oversized"
                bad = reply is None or reply.error.code != grpc.StatusCode.INVALID_ARGUMENT.value[0]
            else:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as cut:
                    cut.settimeout(30)
                    cut.connect(self.framed.path)
                    cut.sendall(
                        framing.PREAMBLE + framing.header(r.randrange(9, 4096)) + r.randbytes(8)
                    )
                kind, bad = "framed-cut", False
        except OSError as exc:
            kind, bad = "framed-error", True
            self.problems.append(f"framed socket: {exc}")
        finally:
            connection.close()
        self.codes[kind + (":UNEXPECTED" if bad else ":OK")] += 1
        if bad:
            self.problems.append(f"{kind}: the daemon answered a broken frame wrongly")

    def full_size(self) -> None:
        """A request of nearly the largest message, refused: millions of empty frame
        ranges, or half a million encoder options, on either transport. Each decodes to
        hundreds of MiB, which must go as soon as it is refused. Made once, up front: a
        client building one holds its own GIL for most of a second."""
        r = self.r
        kind, (grpc_bytes, framed_bytes) = r.choice(list(self.full.items()))
        if r.random() < 0.5:
            self.call(kind + "-grpc", self.channel.unary_unary(SERVICE + "EncodeOnce"), grpc_bytes)
            return
        connection = Framed(self.framed.path)
        try:
            reply = connection.ask(framing.frame(framed_bytes), 30)
        finally:
            connection.close()
        code = (
            "HUNG_UP" if reply is None else CODE_OF.get(reply.error.code, grpc.StatusCode.OK).name
        )
        self.codes[f"{kind}-framed:{code}"] += 1
        if code != "INVALID_ARGUMENT":
            self.offending[f"{kind}-framed -> {code}"] += 1

    def abandoned(self) -> None:
        """An encode at the costliest settings the daemon allows (veryslow, lookahead 60),
        left by its client while the encoder works or drains: a stream (an encoder
        thread), or a whole video on the framed socket (an encoder process). When it
        stopped is read from the daemon's log at the end (`stop_latencies`)."""
        r = self.r
        request_id = f"abandon-{self.seed}-{len(self.abandoned_at)}"
        frames = bytes(r.randbytes(SLOW_FRAMES * SLOW_FRAME))
        codec = pb.CodecOptions(preset="veryslow", extra={"x264-params": "rc-lookahead=60"})
        geometry = {"width": SLOW_SIZE[0], "height": SLOW_SIZE[1], "pixel_format": 1}
        sent = time.monotonic()
        if r.random() < 0.5:
            header = pb.StreamHeader(
                client_token=self.token, request_id=request_id, codec=codec, fps=fps(), **geometry
            )
            header.output.container = CONTAINERS["fmp4"]  # type: ignore[assignment]
            gate = threading.Event()

            def feed() -> Iterator[pb.StreamRequest]:
                yield pb.StreamRequest(header=header)
                for start in range(0, len(frames), 1 << 20):
                    yield chunk(inline=frames[start : start + (1 << 20)])
                yield pb.StreamRequest(end=pb.StreamEnd())
                gate.wait(30)

            reply = self.stub.EncodeStream(feed(), timeout=60)
            time.sleep(r.uniform(0.3, 1.5))
            reply.cancel()
            gate.set()
            kind = "abandoned-stream"
        else:
            size = len(frames)
            lease = self.stub.Lease(pb.LeaseRequest(client_token=self.token, size=size), timeout=30)
            self.maps[lease.slab_id][lease.offset : lease.offset + size] = frames
            video = pb.VideoDescriptor(fps=fps(), **geometry)
            video.ranges.add(lease_id=lease.lease_id, frame_count=SLOW_FRAMES)
            request = pb.EncodeRequest(
                client_token=self.token, request_id=request_id, video=video, codec=codec
            )
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(self.framed.path)
                sock.sendall(framing.PREAMBLE + framing.pack(framing.wrap(request)))
                time.sleep(r.uniform(0.3, 1.5))
            self.release(lease.lease_id, "release-abandoned")  # freed by the encode: NOT_FOUND
            kind = "abandoned-framed"
        self.abandoned_at[request_id] = (sent, time.monotonic(), kind)
        self.codes[f"{kind}:LEFT"] += 1

    def half_sent(self) -> None:
        """A framed message begun and not finished, the connection left open: the daemon
        must give up on it (and its buffer) by itself."""
        r = self.r
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(5)
            sock.connect(self.framed.path)
            sock.sendall(
                framing.PREAMBLE + framing.header(8 * 1024 * 1024) + bytes(r.choice([1, 1 << 20]))
            )
        except OSError:
            sock.close()
            self.codes["half-sent:REFUSED"] += 1
            return
        self.left_open.append(sock)
        while len(self.left_open) > HALF_SENT_KEPT:  # the oldest go: the daemon may have ended them
            self.left_open.pop(0).close()
        self.codes["half-sent:LEFT"] += 1


class Fuzzer(FramedFuzzing):
    """One client thread's mix of valid and hostile requests, on every transport."""

    def descriptor(self) -> None:
        """A random, mostly hostile descriptor against a real lease."""
        r, lease = self.r, self.lease()
        ids = [lease.lease_id, lease.lease_id, "ab" * 16, "", "../\x00" * 9]
        ranges = [
            pb.FrameRange(lease_id=r.choice(ids), offset=r.choice([0, i64(r)]),
                          frame_count=r.choice([r.randint(0, 8), i64(r)]),
                          row_stride=r.choice([0, i64(r)]), frame_stride=r.choice([0, i64(r)]))
            for _ in range(r.randint(1, 3))
        ]  # fmt: skip
        codec = pb.CodecOptions(
            codec=r.choice(["", "", "h264", "av1", "vp9", "bogus", "h265\x00"]),
            preset=r.choice(["", "ultrafast", text(r, 12)]),
            threads=r.choice([0, 0, r.randrange(2**32)]),
        )
        if r.random() < 0.5:
            codec.crf = r.choice([r.randint(0, 51), r.randint(-(2**31), 2**31 - 1)])
        output = pb.OutputSpec(container=r.randint(-2, 6), bytes=pb.BytesOutput())  # type: ignore[arg-type]
        if r.random() < 0.5:
            output.file.path = r.choice([*PATHS, text(r)])
        side = lambda: r.choice([16, 32, 64]) if r.random() < 0.6 else i64(r)  # noqa: E731
        fmt: Any = r.choice([r.randint(1, 6), r.randint(-3, 12)])
        video = pb.VideoDescriptor(width=side(), height=side(), pixel_format=fmt, ranges=ranges)
        video.fps.CopyFrom(fps() if r.random() < 0.6 else fps(r))
        request = pb.EncodeRequest(client_token=self.token, video=video, codec=codec, output=output)
        code = self.call("descriptor", self.encode_method(), request)
        self.settle("descriptor", lease.lease_id, code)

    def encode_method(self) -> Callable[..., Any]:
        """Encode (a reply stream), EncodeOnce (one reply), or a request on the kept
        EncodeSession call or framed connection, at random."""
        return self.r.choice([self.stub.Encode, self.stub.EncodeOnce, self.session, self.framed])

    def audio(self, target: pb.EncodeRequest | pb.StreamHeader) -> tuple[list[pb.AudioData], str]:
        r = self.r
        channels, rate = r.choice([1, 1, 2, 2, 3, 4]), r.choice([16000, 44100, 48000])
        fmt = r.choice([pb.SAMPLE_FORMAT_S16, pb.SAMPLE_FORMAT_F32])
        target.audio.CopyFrom(pb.AudioSpec(sample_rate=rate, channels=channels, sample_format=fmt))
        size = rate // 8 * channels * (2 if fmt == pb.SAMPLE_FORMAT_S16 else 4)
        return [pb.AudioData(inline=r.randbytes(size))], f" audio ch={channels}"

    def encode(self, extra: bool = False) -> None:
        """A valid small encode; `extra`: with real x264/x265 options, some of them risky."""
        r, frames = self.r, self.r.randint(1, 8)
        lease = self.lease(r.randbytes(frames * FRAME))
        container = "mp4" if extra else r.choice(list(CONTAINERS))
        codec, names, values = r.choice(EXTRA) if extra else ("", "", "")
        value = r.choice(values.split(" ")).replace("{s}", str(self.scratch))
        options = dict(zip(names.split(","), value.split(","), strict=True)) if extra else {}
        video = pb.VideoDescriptor(**SMALL, fps=fps())
        video.ranges.add(lease_id=lease.lease_id, frame_count=frames)
        request = pb.EncodeRequest(client_token=self.token, video=video)
        request.codec.CopyFrom(pb.CodecOptions(codec=codec, extra=options))
        request.output.container = CONTAINERS[container]  # type: ignore[assignment]
        request.next_lease_bytes = r.choice([0, 0, LEASE])
        request.data_in_result, request.data_in_lease = r.random() < 0.5, r.random() < 0.5
        request.data_in_next_lease = r.random() < 0.5
        if r.random() < 0.3:
            request.output.file.path = f"soak/{self.seed}-{r.randrange(20)}.{container}"
            request.output.file.overwrite = r.random() < 0.7
        detail = f"{container} {codec} {options}" if extra else container
        if not extra and r.random() < 0.4:
            data, more = self.audio(request)
            request.audio_data.extend(data)
            detail += more
        kind = "extra" if extra else "encode"
        code = self.call(kind, self.encode_method(), request, detail)
        self.settle(kind, lease.lease_id, code)

    def stream(self) -> None:
        """A valid stream, with 0-3 chunks, maybe no end, maybe abandoned midway."""
        r = self.r
        container = r.choice(list(CONTAINERS))
        header = pb.StreamHeader(client_token=self.token, **SMALL, fps=fps())
        header.output.container = CONTAINERS[container]  # type: ignore[assignment]
        audio, detail = self.audio(header) if r.random() < 0.3 else ([], "")
        messages, leases = [pb.StreamRequest(header=header)], []
        for _ in range(r.choice([0, 0, 1, 2, 3])):
            n = r.randint(1, 4)
            if r.random() < 0.5:
                leases.append(self.lease(r.randbytes(n * FRAME)).lease_id)
                messages.append(chunk(range=pb.FrameRange(lease_id=leases[-1], frame_count=n)))
            else:
                messages.append(chunk(inline=r.randbytes(n * FRAME)))
        ending = r.random()
        if ending < 0.8:
            messages.append(pb.StreamRequest(end=pb.StreamEnd(audio_data=audio)))
        if ending < 0.9:
            self.call("stream", self.stub.EncodeStream, iter(messages), container + detail)
        else:  # abandoned: cancelled while the daemon may be encoding
            gate = threading.Event()

            def feed() -> Iterator[pb.StreamRequest]:
                yield from messages
                gate.wait(5)

            reply = self.stub.EncodeStream(feed(), timeout=30)
            time.sleep(r.uniform(0, 0.3))
            reply.cancel()
            gate.set()
            self.call("stream-abandoned", lambda *_a, **_k: reply, None, container + detail)
        for lease_id in leases:  # taken by the stream (NOT_FOUND), or given back
            self.release(lease_id)

    def hostile_stream(self) -> None:
        r, lease = self.r, self.lease()
        messages = []
        if r.random() < 0.7:
            header = pb.StreamHeader(client_token=self.token, **SMALL, fps=fps())
            header.width, header.height = r.randint(-2, 70), r.randint(-2, 70)
            header.audio.CopyFrom(pb.AudioSpec(sample_rate=16000, channels=1, sample_format=2))
            messages.append(pb.StreamRequest(header=header))
        for _ in range(r.randint(0, 5)):
            pick = r.random()
            if pick < 0.4:
                messages.append(chunk(inline=r.randbytes(r.randrange(20000))))
            elif pick < 0.7:
                bad = pb.FrameRange(lease_id=lease.lease_id, offset=i64(r), frame_count=i64(r))
                messages.append(chunk(range=bad))
            elif pick < 0.9:
                audio = [pb.AudioData(inline=r.randbytes(r.randrange(64)))]
                messages.append(pb.StreamRequest(end=pb.StreamEnd(audio_data=audio)))
            else:
                messages.append(pb.StreamRequest(header=pb.StreamHeader()))
        self.call("stream-hostile", self.stub.EncodeStream, iter(messages))
        self.release(lease.lease_id)  # it may have gone into the stream

    def raw(self) -> None:
        """Bytes that are not a valid message, to every method."""
        r, method = self.r, self.r.choice(METHODS)
        cut = pb.EncodeRequest(client_token=self.token).SerializeToString()[:-1]
        payload = r.choice([b"\xff\xff\xff\xff", r.randbytes(r.randrange(1, 64)), b"\n\x05ab", cut])
        fn: Any = self.channel.unary_unary(SERVICE + method)
        if method == "Encode":
            fn = self.channel.unary_stream(SERVICE + method)
        elif method == "EncodeStream":
            bidi = self.channel.stream_stream(SERVICE + method)
            fn = lambda p, timeout: bidi(iter([p, payload]), timeout=timeout)  # noqa: E731
        elif method == "EncodeSession":
            fn = self.r.choice([self.raw_session, self.raw_framed])
        self.call(f"raw-{method}", fn, payload)

    def huge(self) -> None:
        r, pick = self.r, self.r.random()
        if pick < 0.5:
            size = r.choice([2**63, 2**64 - 1, 2**40, 16 * 1024 * 1024 + 1, 0])
            wait = r.choice([0, 2**32 - 1])
            request = pb.LeaseRequest(client_token=self.token, size=size, wait_ms=wait)
            if self.call("huge-lease", self.stub.Lease, request) == "OK":
                self.problems.append(f"a lease of {size} bytes was granted")
        elif pick < 0.8:
            header = pb.StreamRequest(header=pb.StreamHeader(client_token=self.token, **SMALL))
            big = chunk(inline=bytes(8 * 1024 * 1024 + 1))
            self.call("huge-message", self.stub.EncodeStream, iter([header, big]))
        else:
            request = pb.AttachRequest(client_name="n" * 100_000, pid=2**32 - 1)
            self.call("huge-attach", self.stub.Attach, request)

    def release_unknown(self) -> None:
        r = self.r
        lease_id = r.choice([r.randbytes(16).hex(), text(r, 80), ""])
        self.release(lease_id, "release-unknown", r.choice([self.token, "f" * 32, ""]))

    def attach(self) -> None:
        self.call("attach", self.stub.Attach, pb.AttachRequest(client_name=text(self.r)))

    def run_one(self) -> None:
        kinds = {self.descriptor: 28, self.encode: 16, lambda: self.encode(extra=True): 8,
                 self.stream: 12, self.hostile_stream: 8, self.raw: 12, self.huge: 4,
                 self.hostile_framed: 3, self.full_size: 1, self.half_sent: 1,
                 self.abandoned: 1,
                 self.release_unknown: 6, self.attach: 4,
                 lambda: self.call("status", self.stub.Status, pb.StatusRequest()): 2}  # fmt: skip
        try:
            self.r.choices(list(kinds), weights=list(kinds.values()))[0]()
        except grpc.RpcError as err:  # a Lease the request needed failed
            self.codes[f"setup:{err.code().name}"] += 1


def memory(pid: int, t0: float, requests: int) -> dict[str, Any]:
    """Resident memory (KiB: VmRSS = RssAnon + RssFile + RssShmem), threads and open fds."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines)
    out = {k: int(fields[k].split()[0]) for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
    out |= {"threads": int(fields["Threads"]), "fds": len(os.listdir(f"/proc/{pid}/fd"))}
    return {"t": round(time.monotonic() - t0, 1), "n": requests, **out}


def figures(key: str, samples: list[dict[str, Any]], warm_t: float, end: dict[str, Any]) -> Any:
    """MiB of `key`: at the warm point and at the end of the load, the max, and those two as
    medians over 30 s windows (one sample swings with the encodes in flight)."""
    load = [s for s in samples if s["t"] < end["t"]] + [end]
    warm = next((s for s in load if s["t"] >= warm_t), end)  # a short run: its end

    def median(start: float, stop: float) -> float:
        window = [s[key] for s in load if start <= s["t"] <= stop]
        return statistics.median(window or [warm[key]])

    kib = {"warm": warm[key], "end": end[key], "max": max(s[key] for s in load)}
    kib |= {"warm_median": median(warm_t, warm_t + 30), "end_median": median(end["t"] - 30, 1e99)}
    kib |= {"growth": end[key] - warm[key], "growth_median": kib["end_median"] - kib["warm_median"]}
    return {k: round(v / 1024, 1) for k, v in kib.items()}


def files_under(root: Path, skip: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p != skip and skip not in p.parents}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser("python -m bench.soak_fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=0.0)
    p.add_argument("--requests", type=int, default=0, help="default 5000 when no --minutes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="client threads sending at once")
    p.add_argument("--sample-every", type=float, default=5.0, metavar="SECONDS")
    p.add_argument("--idle", type=float, default=0.0, metavar="SECONDS", help="rest, then sample")
    p.add_argument("--out", default="", help="write the summary and the samples as JSON")
    p.add_argument("--daemon-opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--rss-bound",
        type=float,
        default=30.0,
        metavar="MIB",
        help="(e): RssAnon once idle, at most this over the warm start",
    )
    p.add_argument(
        "--innocent-bound",
        type=float,
        default=0.3,
        metavar="SECONDS",
        help="(f): the longest an innocent request may wait",
    )
    p.add_argument(
        "--stop-bound",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="(g): the longest an abandoned encode may run on after its client left",
    )
    args = p.parse_args(argv)
    args.requests = args.requests or (0 if args.minutes else 5000)
    root = Path(tempfile.mkdtemp(prefix="vsd-soak-"))
    cwd, out, prefix = root / "cwd", root / "out", f"vsdsoak{os.getpid()}"
    cwd.mkdir()
    options = {**DAEMON, "output_dir": out, "shm_prefix": prefix}
    options |= dict(o.split("=", 1) for o in args.daemon_opt)
    daemon = DaemonProcess(str(root / "sidecar.sock"), **options)
    try:
        with open(root / "daemon.log", "ab") as log:  # relative paths land in cwd
            daemon.start(output=log, preexec_fn=lambda: os.chdir(cwd))
        return soak(args, daemon, root, prefix)
    finally:
        daemon.kill()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Load:
    """What the load left: its clients with their tallies, the daemon's memory samples, and
    the innocent client's waits."""

    fuzzers: list[Fuzzer]
    started: float  # on the monotonic clock, as the samples' times count from
    samples: list[dict[str, Any]]
    warm_t: list[float]  # when the daemon counts as warm, once it does
    requests: int
    seconds: float
    end: dict[str, Any]  # the memory sample as the load ended
    waits: list[float]


def run_load(args: argparse.Namespace, daemon: DaemonProcess, root: Path) -> Load:
    """The fuzzing clients' requests until `--minutes` or `--requests`, with the daemon's
    memory sampled meanwhile and an innocent client beside them."""
    samples: list[dict[str, Any]] = []
    warm_t: list[float] = []
    done, t0, finished, lock = [0], time.monotonic(), threading.Event(), threading.Lock()

    def progress() -> float:
        elapsed = time.monotonic() - t0
        return max(elapsed / (args.minutes * 60 or 1e99), done[0] / (args.requests or 1e99))

    def sample() -> None:
        while daemon.running():
            samples.append(memory(daemon.pid, t0, done[0]))
            if not warm_t and (progress() >= 0.1 or samples[-1]["t"] >= 60):
                warm_t.append(samples[-1]["t"])
            if finished.wait(args.sample_every):
                return

    def work(f: Fuzzer) -> None:
        while progress() < 1.0 and daemon.running():
            f.run_one()
            with lock:
                done[0] += 1

    # In a process of its own: the fuzzing clients' Python (building requests, random
    # bytes) would otherwise hold up its timing through their shared GIL.
    spawn = multiprocessing.get_context("spawn")
    stop, answers = spawn.Event(), spawn.Queue()
    bystander = spawn.Process(target=innocent, args=(daemon.socket, stop, answers), daemon=True)
    bystander.start()

    seeds = [args.seed * 1000 + n for n in range(args.workers)]
    fuzzers = [Fuzzer(daemon.socket, root / "cwd", seed) for seed in seeds]
    threads = [threading.Thread(target=work, args=(f,)) for f in fuzzers]
    for th in [*threads, threading.Thread(target=sample, daemon=True)]:
        th.start()
    for th in threads:
        th.join()
    finished.set()
    stop.set()
    waits: list[float] = (
        answers.get(timeout=60) if bystander.is_alive() or not answers.empty() else []
    )
    bystander.join(30)
    seconds, end = time.monotonic() - t0, memory(daemon.pid, t0, done[0])
    return Load(fuzzers, t0, samples, warm_t, done[0], seconds, end, waits)


def tally(fuzzers: list[Fuzzer]) -> tuple[Counter[str], Counter[str], list[str]]:
    """Every client's answers by kind, the offending ones, and the problems seen."""
    codes, offending, problems = Counter[str](), Counter[str](), []
    for f in fuzzers:
        codes.update(f.codes)
        offending.update(f.offending)
        problems += f.problems
    return codes, offending, problems


def soak(args: argparse.Namespace, daemon: DaemonProcess, root: Path, prefix: str) -> int:
    out = root / "out"
    before = files_under(root, out)
    load = run_load(args, daemon, root)
    samples, end = load.samples, load.end
    for f in load.fuzzers:
        f.close()
    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        pool = pb_grpc.VideoSidecarStub(channel).Status(pb.StatusRequest(), timeout=10).pool
    time.sleep(args.idle)
    idle = memory(daemon.pid, load.started, load.requests)
    idle_tree = tree_rss_anon(daemon.pid)  # RssAnon MiB of the daemon and its processes
    exit_code = daemon.stop()
    created = sorted(files_under(root, out) - before)
    segments = sorted(p.name for p in Path("/dev/shm").glob(f"{prefix}.*"))
    codes, offending, problems = tally(load.fuzzers)
    if pool.active_leases:
        problems.insert(0, f"(c) {pool.active_leases} leases held after the run")
    by_code = Counter[str]()
    for key, n in codes.items():
        by_code[key.rsplit(":", 1)[1]] += n
    checks = {
        "a_no_server_errors": not offending,
        "b_no_files_outside_output": not created,
        "c_refused_leases_releasable": not any(p.startswith("(c)") for p in problems),
        "d_no_segments_left": not segments,
    }
    warm_t = (load.warm_t or [0.0])[0]
    warm = figures("RssAnon", samples, warm_t, end)["warm_median"]
    idle_growth = round(idle["RssAnon"] / 1024 - warm, 1)
    if args.idle:
        checks["e_idle_rss_bounded"] = idle_growth <= args.rss_bound
    abandoned = {k: v for f in load.fuzzers for k, v in f.abandoned_at.items()}
    by_way = stop_latencies((root / "daemon.log").read_text(errors="replace"), abandoned)
    stops = sorted(s for way in by_way.values() for s in way)
    checks["g_abandoned_encodes_stop_within_1s"] = not stops or stops[-1] <= args.stop_bound
    waited = sorted(load.waits)
    checks["f_innocent_not_held_up"] = bool(waited) and waited[-1] <= args.innocent_bound
    summary = {
        "command": " ".join(sys.argv), "seed": args.seed, "workers": args.workers,
        "seconds": round(load.seconds, 1), "requests": load.requests, "daemon_exit": exit_code,
        "by_code": dict(by_code.most_common()), "by_kind": dict(sorted(codes.items())),
        "checks": checks, "offending": dict(offending.most_common()), "problems": problems[:20],
        "files_created": created[:20], "segments_left": segments, "warm_at_s": load.warm_t[:1],
        **{key: figures(key, samples, warm_t, end) for key in ("VmRSS", "RssAnon")},
        "idle": {"seconds": args.idle, "RssAnon": round(idle["RssAnon"] / 1024, 1),
                 "growth_over_warm": idle_growth, "with_processes": idle_tree}, "end": end,
        "abandoned": {"left": len(abandoned), "stopped_by_daemon": len(stops),
                      "max_s": round(stops[-1], 3) if stops else None,
                      "p50_s": round(stops[len(stops) // 2], 3) if stops else None,
                      "by_way": {way: {"n": len(v), "max_s": round(max(v), 3),
                                       "over_0.5_s": sum(x > 0.5 for x in v)}
                                 for way, v in sorted(by_way.items())}},
        "innocent": {"requests": len(waited),
                     "p50_s": round(waited[len(waited) // 2], 4) if waited else None,
                     "p99_s": round(waited[int(len(waited) * 0.99)], 4) if waited else None,
                     "max_s": round(waited[-1], 4) if waited else None},
    }  # fmt: skip
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps({**summary, "samples": samples}, indent=2) + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
