"""The encoder: borrowed frames in, an MP4 out. PyAV only; no gRPC, no leases.

Frames arrive as numpy views of slab memory and become PyAV frames with
`VideoFrame.from_numpy_buffer`, which points FFmpeg at the same bytes instead of copying.
RGB-family input is converted to yuv420p (BT.709, limited range) by swscale; 4:2:0 input
that a GPU already converted goes to the encoder as is. libx264 copies each picture into
its own buffers inside `encode()`, so a slab region may be reused once `encode()` returns.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, BinaryIO

import av
import numpy as np

from ..errors import InvalidRequest
from .audio import AudioFormat, AudioTrack
from .catalogue import AUDIO_CODECS, CONTAINERS, ResolvedCodec
from .cmaf import Init, LiveSink, init_segment, length_prefixed
from .colour import BT709, LIMITED_RANGE, FrameConverter
from .frames import Geometry
from .landing import Frames
from .threads import slice_threads

FASTSTART = "+faststart"


def container_options(
    container: str, sink: str | BinaryIO, audio: AudioFormat | None
) -> dict[str, str]:
    options: dict[str, str] = {}
    if container == "fmp4":
        # Short fragments, so the first bytes reach the client early. The edit lists that
        # make players skip the AAC priming samples (and any B-frame delay) need the first
        # samples' timestamps, which an empty moov written before any packet has not got:
        # delay_moov holds the init segment back until the first fragment is cut, then
        # writes both together, so the first bytes still leave with the first fragment.
        # FFmpeg writes it only once every track has a sample: audio sent with a stream's
        # end holds the output back until then (MSE could not play before it anyway).
        options["movflags"] = "frag_keyframe+empty_moov+delay_moov+default_base_moof"
        options["frag_duration"] = "500000"
        options["use_editlist"] = "1"
    elif container == "mp4" and isinstance(sink, str):
        options["movflags"] = FASTSTART  # see VideoEncoder.reserve_index
    if audio is not None and container != "fmp4":
        # Audio may arrive only at the end: hold video packets so the two interleave.
        options["max_interleave_delta"] = "0"
    return options


def configure_context(
    ctx: av.VideoCodecContext,
    geometry: Geometry,
    codec: ResolvedCodec,
    threads: int,
    thread_type: str,
) -> None:
    """Set up a video encoder context (not yet opened) for these settings."""
    ctx.width = geometry.width
    ctx.height = geometry.height
    ctx.pix_fmt = "yuv420p"
    ctx.time_base = Fraction(1) / geometry.fps
    # Tag the stream as BT.709 limited range, which is what the conversion produces.
    ctx.color_primaries = BT709
    ctx.color_trc = BT709
    ctx.colorspace = BT709
    ctx.color_range = LIMITED_RANGE
    if codec.gop is not None:
        ctx.gop_size = codec.gop
    ctx.thread_type = thread_type
    if thread_type == "SLICE":
        ctx.thread_count = slice_threads(geometry, threads, codec.options.get("preset", ""))
    else:
        ctx.thread_count = threads
    ctx.options = dict(codec.options)


def open_context(ctx: av.VideoCodecContext, codec: ResolvedCodec) -> None:
    try:
        ctx.open()
    except av.error.FFmpegError as exc:
        raise InvalidRequest(
            "codec", f"{codec.choice.encoder} rejected the options {codec.options}: {exc}"
        ) from None


# The MP4's index (moov) goes ahead of the frames, so that players can start before the
# whole file is in. FFmpeg's faststart writes it at the end and then moves every byte of
# the file up to make room: 1.9 ms of a 4.4 MB output, 14 ms of a 42 MB one. When the
# frame count is known before the first frame, the room is kept at the start instead and
# the index written into it: generous, as an index that does not fit fails the output.
INDEX_BYTES = 4096  # what does not grow with the samples, extradata included
# Size, offset, chunk, sync and time entries, at worst; B-frames with audio took 12.
INDEX_BYTES_PER_SAMPLE = 48
# Smaller videos keep faststart: moving their file costs little, and the room kept would
# be a larger share of it (1344x768x60: 7 KiB, 1.4% of a smooth video's 0.5 MB).
RESERVE_INDEX_MIN_PIXELS = 1344 * 768 * 60


@dataclass
class EncodeTimings:
    open: float = 0.0
    convert: float = 0.0
    encode: float = 0.0
    mux: float = 0.0
    finalize: float = 0.0


def flush_packets(
    ctx: av.VideoCodecContext, check: Callable[[], None] | None = None
) -> Generator[av.Packet[Any]]:
    """The packets an encoder still holds at the end, one at a time. PyAV's `encode(None)`
    hands them all over from one call, which nothing can interrupt: x264 at placebo with
    rc-lookahead=250 spent 25-63 s in it after its client had left. `encode_lazy(None)`
    receives one packet per step, so `check` runs before the first and after each (it
    may raise to stop; the caller then discards the output). A stop is then as late as
    one packet's wait: on the 2-core machine, for frames of noise at placebo with
    rc-lookahead=250, 0.3 s at 256x144, 1.6 s at 320x240 and 3.1 s at 640x480 (the first
    packet: the lookahead decides every frame it holds); see `CostCeiling`."""
    if check is not None:
        check()
    packets = ctx.encode_lazy(None)
    try:
        for packet in packets:
            yield packet
            if check is not None:
                check()
    finally:
        close = getattr(packets, "close", None)  # a generator: let go of the context now
        if close is not None:
            close()


class VideoEncoder:
    """One output container (MP4, fragmented MP4 or WebM): a video stream fed borrowed
    frames, and optionally an audio track that follows it.

    `sink` is a path FFmpeg opens itself (a file, or /proc/self/fd/N of a memfd), so the
    muxer can rewrite the header for faststart and no Python I/O sits in the hot loop; or,
    for fragmented MP4 streamed back while encoding, a writable object.

    With `headers_later`, the stream's own encoder is not opened: the video's packets come
    from segment encoders (`mux_encoded`), and the stream only needs their headers, given
    with `take_headers()` before the first packet. Opening x264 for the headers alone took
    5-6.5 ms at 1344x768 with the cores' frame threads, before the first frame.
    """

    def __init__(
        self,
        sink: str | BinaryIO,
        geometry: Geometry,
        codec: ResolvedCodec,
        threads: int,
        thread_type: str = "FRAME",
        *,
        container: str = "mp4",
        audio: AudioFormat | None = None,
        converter: FrameConverter | None = None,
        headers_later: bool = False,
        live: LiveSink | None = None,
    ) -> None:
        self.geometry = geometry
        self.codec = codec
        self.container = container
        self.frames = 0
        self.timings = EncodeTimings()
        self.audio: AudioTrack | None = None
        self.headers_later = headers_later
        self.live = live  # the same packets, packaged as they come (see cmaf)
        self._converter = converter or FrameConverter(geometry, threads)
        t0 = time.perf_counter()
        self._container = av.open(
            sink,
            "w",
            format=CONTAINERS[container],
            options=container_options(container, sink, audio),
        )
        try:
            self._stream = self._add_stream(threads, thread_type)
            if audio is not None:
                self.audio = AudioTrack.add_to(self._container, audio, AUDIO_CODECS[container])
        except BaseException:
            self._container.close()
            raise
        if live is not None:
            if headers_later:
                raise RuntimeError("a live package takes its packets from one encoder")
            live.start(
                init_segment(self._stream, self.extradata, Fraction(1) / geometry.fps),
                self._audio_init(),
            )
        self.timings.open = time.perf_counter() - t0

    def _audio_init(self) -> Init | None:
        """The audio track's init segment, for a live package: where it is AAC (which
        CMAF's HLS carries), its packets go to the package too."""
        if self.audio is None or self.audio.stream.codec_context.name != "aac":
            return None
        stream = self.audio.stream
        return init_segment(stream, stream.codec_context.extradata, Fraction(1, stream.rate))

    def _add_stream(self, threads: int, thread_type: str) -> av.video.stream.VideoStream:
        if self.headers_later:
            # A stream made from a template is one PyAV leaves unopened when it writes
            # the header; the template's container is never written.
            with av.open(io.BytesIO(), "w", format="mp4") as holder:
                template = holder.add_stream(
                    self.codec.choice.encoder,
                    rate=self.geometry.fps,
                    width=self.geometry.width,
                    height=self.geometry.height,
                )
                stream = self._container.add_stream_from_template(template)
        else:
            stream = self._container.add_stream(self.codec.choice.encoder, rate=self.geometry.fps)
        assert isinstance(stream, av.VideoStream)
        configure_context(stream.codec_context, self.geometry, self.codec, threads, thread_type)
        stream.time_base = stream.codec_context.time_base
        if not self.headers_later:
            open_context(stream.codec_context, self.codec)
        return stream

    def take_headers(self, extradata: bytes | None) -> None:
        """The codec headers (SPS/PPS) of the encoders whose packets this stream muxes:
        for a stream with `headers_later`, before its first packet."""
        if not self.headers_later or self.frames:
            raise RuntimeError("headers are taken once, by a stream without an encoder")
        self._stream.codec_context.extradata = extradata

    def reserve_index(self, frames: int) -> None:
        """Keep room for the index of an MP4 of `frames` frames ahead of them, instead of
        moving the whole file at the end (see `INDEX_BYTES`). What is left over stays a
        `free` box of a few kilobytes. Only before the first frame is muxed."""
        options = self._container.options
        pixels = frames * self.geometry.width * self.geometry.height
        if pixels < RESERVE_INDEX_MIN_PIXELS or self.frames:
            return
        if options.get("movflags") != FASTSTART:
            return  # not an MP4 written to a path: no index to move
        samples = frames
        if self.audio is not None:  # AAC: 1024 samples a packet, trimmed to the video
            rate = self.audio.stream.rate
            samples += math.ceil(frames / self.geometry.fps * rate / 1024) + 4
        del options["movflags"]
        options["moov_size"] = str(INDEX_BYTES + INDEX_BYTES_PER_SAMPLE * samples)

    def _frame(self, image: np.ndarray) -> av.VideoFrame:
        return self._converter.frame(image)

    def prime(self, blank: np.ndarray) -> None:
        """Set up the colour converter ahead of the first frame; encodes nothing."""
        self._converter.prime(blank)

    @property
    def extradata(self) -> bytes | None:
        """The stream's codec headers (SPS/PPS for H.264), which segments must share."""
        return self._stream.codec_context.extradata

    def mux_encoded(self, packets: list[Any], frames: int) -> None:
        """Mux packets a segment encoder made for this stream; `frames` were in them."""
        t0 = time.perf_counter()
        for packet in packets:
            packet.stream = self._stream
        self._container.mux(packets)
        self.frames += frames
        if self.audio is not None:
            self._mux_audio(self.audio.encode_until(self.duration))
        self.timings.mux += time.perf_counter() - t0

    def encode(self, image: np.ndarray) -> None:
        """Encode one frame; `image` is borrowed and may be reused when this returns."""
        t0 = time.perf_counter()
        frame = self._frame(image)
        self.timings.convert += time.perf_counter() - t0
        self.encode_frame(frame)

    def encode_all(self, images: Frames, after_each: Callable[[], None] | None = None) -> None:
        """Encode every frame of `images` (borrowed; reusable when this returns; each
        taken once it has landed), RGB converted ahead while the encoder works;
        `after_each` runs after every frame and may raise to stop."""
        with contextlib.closing(self._converter.frames(images, len(images))) as converted:
            while True:
                t0 = time.perf_counter()
                frame = next(converted, None)
                self.timings.convert += time.perf_counter() - t0
                if frame is None:
                    return
                self.encode_frame(frame)
                if after_each is not None:
                    after_each()

    def encode_frame(self, frame: av.VideoFrame) -> None:
        """Encode one frame `FrameConverter` made for this encoder."""
        if self.headers_later:
            raise RuntimeError("this stream has no encoder: its packets come from segments")
        t1 = time.perf_counter()
        frame.pts = self.frames
        packets = self._stream.encode(frame)
        t2 = time.perf_counter()
        self._package(packets)
        self._container.mux(packets)
        self.frames += 1
        if self.audio is not None:
            self._mux_audio(self.audio.encode_until(self.duration))
        t3 = time.perf_counter()
        self.timings.encode += t2 - t1
        self.timings.mux += t3 - t2

    def set_audio(self, pcm: np.ndarray) -> None:
        """All the track's samples, (samples, channels) float32; may come at any time."""
        if self.audio is None:
            raise InvalidRequest("audio_data", "audio samples sent but no audio track declared")
        self.audio.pcm = pcm

    def close(self, check: Callable[[], None] | None = None) -> None:
        """Drain the encoders and finish the container (MP4: the index goes up front).
        `check` runs before the drain and between its packets, and may raise to stop: the
        caller then `abort()`s (see `flush_packets`)."""
        if not self.headers_later:
            self._drain(check)
        t1 = time.perf_counter()
        if self.audio is not None:
            self._mux_audio(self.audio.finish(self.duration))
        if self.live is not None:
            self.live.finish()
        t2 = time.perf_counter()
        self._container.close()
        t3 = time.perf_counter()
        self.timings.mux += t2 - t1
        self.timings.finalize += t3 - t2

    def _drain(self, check: Callable[[], None] | None) -> None:
        """The video encoder's delayed packets, muxed one by one as they come."""
        encode = mux = 0.0
        t0 = time.perf_counter()
        for packet in flush_packets(self._stream.codec_context, check):
            t1 = time.perf_counter()
            encode += t1 - t0
            packet.stream = self._stream
            self._package([packet])
            self._container.mux(packet)
            t0 = time.perf_counter()
            mux += t0 - t1
        self.timings.encode += encode + (time.perf_counter() - t0)
        self.timings.mux += mux

    def _package(self, packets: list[av.Packet[Any]]) -> None:
        if self.live is not None:
            for packet in packets:
                pts, dts = packet.pts, packet.dts
                assert pts is not None and dts is not None  # an encoder's packet has both
                self.live.add(length_prefixed(bytes(packet)), packet.is_keyframe, pts, dts)

    def _mux_audio(self, packets: list[Any]) -> None:
        """The audio track's packets into the container, and, where the package takes
        them, the same packets into the live package first."""
        if self.live is not None and self.audio is not None and packets:
            for packet in packets:
                pts = packet.pts
                assert pts is not None  # an encoder's packet has one
                self.live.add_audio(bytes(packet), pts, packet.duration or 0)
        self._container.mux(packets)

    def abort(self) -> None:
        """Stop without finishing; the caller discards the output. A live package is
        closed with what it has (viewers keep a playable, shorter video)."""
        with contextlib.suppress(Exception):
            self._container.close()
        if self.live is not None:
            with contextlib.suppress(Exception):
                self.live.finish()

    @property
    def duration(self) -> float:
        return float(self.frames / self.geometry.fps)
