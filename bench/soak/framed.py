"""What the fuzz soak throws at the framed socket, and encodes left by their clients."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import grpc

from sidecar import framing
from sidecar.api.v1 import sidecar_pb2 as pb

from .client import SoakClient
from .requests import CONTAINERS, SLOW_FRAME, SLOW_FRAMES, SLOW_SIZE, chunk, fps, previews
from .wire import CODE_OF, SERVICE, Framed

HALF_SENT_KEPT = 16  # half-sent framed connections a fuzzer keeps open at once


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
            self.call(kind + "-grpc", self.channel.unary_stream(SERVICE + "Encode"), grpc_bytes)
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
        # Half of them with a thumbnail or sprite sheet: preview work stops with the encode.
        streamed = r.random() < 0.5
        asked = previews(r, stream=streamed) if r.random() < 0.5 else None
        sent = time.monotonic()
        if streamed:
            header = pb.StreamHeader(
                client_token=self.token, request_id=request_id, codec=codec, fps=fps(), **geometry
            )
            if asked is not None:
                header.previews.CopyFrom(asked)
            header.output.container = CONTAINERS["fmp4"]  # type: ignore[assignment]

            def messages() -> Iterator[pb.StreamRequest]:
                yield pb.StreamRequest(header=header)
                for start in range(0, len(frames), 1 << 20):
                    yield chunk(inline=frames[start : start + (1 << 20)])
                yield pb.StreamRequest(end=pb.StreamEnd())

            self.cancelled_stream(messages(), 30, 60, r.uniform(0.3, 1.5))
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
            if asked is not None:
                request.previews.CopyFrom(asked)
            data = framing.PREAMBLE + framing.pack(framing.wrap(request))
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(self.framed.path)
                sent = time.monotonic()  # the daemon's `ms` counts from here, not the lease
                sock.sendall(data)
                time.sleep(r.uniform(0.3, 1.5))
            left = time.monotonic()
            self.release(lease.lease_id, "release-abandoned")  # freed by the encode: NOT_FOUND
            self.abandoned_at[request_id] = (sent, left, "abandoned-framed")
            self.codes["abandoned-framed:LEFT"] += 1
            return
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
