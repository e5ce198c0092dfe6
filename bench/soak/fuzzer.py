"""A fuzzing client's mix of valid and hostile requests, on every transport."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from sidecar.api.v1 import sidecar_pb2 as pb

from .framed import FramedFuzzing
from .requests import CONTAINERS, EXTRA, FRAME, LEASE, PATHS, SMALL, chunk, fps, i64, previews, text
from .wire import METHODS, SERVICE


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
        if r.random() < 0.3:
            request.previews.CopyFrom(previews(r, hostile=True))
        code = self.call("descriptor", self.encode_method(), request)
        self.settle("descriptor", lease.lease_id, code)

    def encode_method(self) -> Callable[..., Any]:
        """Encode (a reply stream) or a request on the kept framed connection, at random."""
        return self.r.choice([self.stub.Encode, self.framed])

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
        if r.random() < 0.3:
            request.output.file.path = f"soak/{self.seed}-{r.randrange(20)}.{container}"
            request.output.file.overwrite = r.random() < 0.7
        detail = f"{container} {codec} {options}" if extra else container
        if not extra and r.random() < 0.3:  # a thumbnail or sprite sheet beside the video
            request.previews.CopyFrom(previews(r))
            detail += " previews"
        if not extra and r.random() < 0.4:
            data, more = self.audio(request)
            request.audio_data.extend(data)
            detail += more
        kind = "extra" if extra else "encode-previews" if request.HasField("previews") else "encode"
        code = self.call(kind, self.encode_method(), request, detail)
        self.settle(kind, lease.lease_id, code)

    def stream(self) -> None:
        """A valid stream, with 0-3 chunks, maybe no end, maybe abandoned midway."""
        r = self.r
        container = r.choice(list(CONTAINERS))
        header = pb.StreamHeader(client_token=self.token, **SMALL, fps=fps())
        header.output.container = CONTAINERS[container]  # type: ignore[assignment]
        audio, detail = self.audio(header) if r.random() < 0.3 else ([], "")
        if r.random() < 0.3:
            header.previews.CopyFrom(previews(r, stream=True))
            detail += " previews"
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
        kind = "stream-previews" if header.HasField("previews") else "stream"
        if ending < 0.9:
            self.call(kind, self.stub.EncodeStream, iter(messages), container + detail)
        else:  # abandoned: cancelled while the daemon may be encoding
            reply = self.cancelled_stream(messages, 5, 30, r.uniform(0, 0.3))
            self.call(f"{kind}-abandoned", lambda *_a, **_k: reply, None, container + detail)
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
        elif method == "Framed":
            fn = self.raw_framed
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
