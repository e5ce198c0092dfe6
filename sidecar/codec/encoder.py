"""The encoder: borrowed frames in, an MP4 out. PyAV only; no gRPC, no leases.

Frames arrive as numpy views of slab memory and become PyAV frames with
`VideoFrame.from_numpy_buffer`, which points FFmpeg at the same bytes instead of copying.
RGB-family input is converted to yuv420p (BT.709, limited range) by swscale; 4:2:0 input
that a GPU already converted goes to the encoder as is. libx264 copies each picture into
its own buffers inside `encode()`, so a slab region may be reused once `encode()` returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, BinaryIO

import av
import numpy as np
from av.video.reformatter import ColorRange, Colorspace, VideoReformatter

from ..errors import InvalidRequest
from .audio import AudioFormat, AudioTrack
from .codec_options import PRESET_LADDER, CostCeiling, merge_options
from .codec_rules import join_params, split_params
from .frames import Geometry
from .landing import Frames

# AVCOL_* values for BT.709: primaries, transfer and matrix are all 1; limited range is 1.
BT709 = 1
LIMITED_RANGE = 1


X26X_PRESETS = PRESET_LADDER
SVT_AV1_PRESETS = tuple(str(n) for n in range(-1, 14))
VP9_DEADLINES = ("realtime", "good", "best")


@dataclass(frozen=True)
class CodecChoice:
    name: str
    encoder: str
    presets: tuple[str, ...]
    default_preset: str
    default_crf: int
    max_crf: int
    quiet: Mapping[str, str] = field(default_factory=dict)
    preset_option: str = "preset"
    containers: tuple[str, ...] = ("mp4", "fmp4")
    min_size: int = 2  # the smallest width and height it is given


CODECS: dict[str, CodecChoice] = {
    "h264": CodecChoice("h264", "libx264", X26X_PRESETS, "ultrafast", 18, 51),
    # x265 corrupts its heap now and then on frames narrower than its 64-pixel coding
    # tree unit (40 and 48 pixels wide, at every preset: glibc aborts the process).
    "h265": CodecChoice(
        "h265",
        "libx265",
        X26X_PRESETS,
        "ultrafast",
        20,
        51,
        {"x265-params": "log-level=error"},
        min_size=64,
    ),
    # SVT-AV1 refuses a side of 2 pixels when it opens; said up front, it names the side.
    "av1": CodecChoice("av1", "libsvtav1", SVT_AV1_PRESETS, "10", 30, 63, min_size=4),
    # Constant quality needs b=0; row-mt and cpu-used 8 keep realtime VP9 fast.
    "vp9": CodecChoice(
        "vp9",
        "libvpx-vp9",
        VP9_DEADLINES,
        "realtime",
        32,
        63,
        {"b": "0", "cpu-used": "8", "row-mt": "1"},
        preset_option="deadline",
        containers=("webm",),
    ),
}
CONTAINERS = {"mp4": "mp4", "fmp4": "mp4", "webm": "webm"}
AUDIO_CODECS = {"mp4": "aac", "fmp4": "aac", "webm": "libopus"}
DEFAULT_CODEC = {"mp4": "h264", "fmp4": "h264", "webm": "vp9"}
ALIASES = {
    "libvpx-vp9": "vp9",
    "avc": "h264",
    "x264": "h264",
    "libx264": "h264",
    "hevc": "h265",
    "x265": "h265",
    "libx265": "h265",
    "libsvtav1": "av1",
    "svtav1": "av1",
}


@dataclass(frozen=True)
class CodecSpec:
    """What the client asked for; `resolve()` checks it and fills in defaults."""

    codec: str = ""  # empty: the container's default (h264 in MP4, vp9 in WebM)
    crf: int | None = None
    preset: str = ""
    gop: int | None = None
    threads: int = 0
    extra: tuple[tuple[str, str], ...] = ()

    def resolve(self, container: str = "mp4", ceiling: CostCeiling | None = None) -> ResolvedCodec:
        """The settings, checked; and, with a `ceiling` (the daemon's), within it."""
        key = self.codec.strip().lower() or DEFAULT_CODEC[container]
        choice = CODECS.get(ALIASES.get(key, key))
        if choice is None:
            raise InvalidRequest(
                "codec.codec", f"unknown codec {self.codec[:32]!r}; use one of {', '.join(CODECS)}"
            )
        if container not in choice.containers:
            raise InvalidRequest(
                "codec.codec",
                f"{choice.name} does not go in {container}; use {DEFAULT_CODEC[container]}",
            )
        crf = choice.default_crf if self.crf is None else self.crf
        if not 0 <= crf <= choice.max_crf:
            raise InvalidRequest(
                "codec.crf", f"{crf} is outside 0..{choice.max_crf} for {choice.name}"
            )
        preset = self.preset or choice.default_preset
        if preset not in choice.presets:
            raise InvalidRequest(
                "codec.preset",
                f"{preset[:40]!r} is not a {choice.encoder} preset; use one of "
                + ", ".join(choice.presets),
            )
        if self.gop is not None and not 1 <= self.gop <= 100_000:
            raise InvalidRequest("codec.gop", f"{self.gop} is outside 1..100000")
        if not 0 <= self.threads <= 256:
            raise InvalidRequest("codec.threads", f"{self.threads} is outside 0..256")
        # Only allow-listed options, checked and rewritten: see codec_options.
        options = {
            choice.preset_option: preset,
            "crf": str(crf),
            **merge_options(choice.encoder, choice.quiet, self.extra),
        }
        if ceiling is not None:
            ceiling.check(choice.encoder, preset, options)
        return ResolvedCodec(choice, options, self.gop, self.threads)


@dataclass(frozen=True)
class ResolvedCodec:
    choice: CodecChoice
    options: dict[str, str]
    gop: int | None
    threads: int

    def check_size(self, width: int, height: int) -> None:
        """InvalidRequest if the encoder is not to be given frames of this size."""
        least = self.choice.min_size
        for name, value in (("video.width", width), ("video.height", height)):
            if value < least:
                raise InvalidRequest(
                    name, f"{width}x{height}: {self.choice.name} needs {least}x{least} at least"
                )

    def for_frames(self, frames: int) -> ResolvedCodec:
        """These settings for a video of `frames` frames (0: not known yet). x265 with
        B-frames gives a clip of a few frames timestamps FFmpeg's MP4 muxer cannot
        write ("not yet implemented"): such clips are encoded without B-frames."""
        if self.choice.encoder != "libx265" or not 0 < frames <= SHORT_CLIP_FRAMES:
            return self
        params = split_params(self.options.get("x265-params", ""))
        options = {**self.options, "x265-params": join_params({**params, "bframes": "0"})}
        return dataclasses.replace(self, options=options)


SHORT_CLIP_FRAMES = 8


def threading_for(
    frames: int, height: int, cores: int, *, converts: bool = False
) -> tuple[int, str]:
    """(threads, thread_type) for an encode given `cores` to itself.

    Frame threads need frames to work on: a short clip gets slice threads instead (each
    frame split across cores, at least three macroblock rows a slice; x264 gets fewer
    for a small frame, see `slice_threads`), a long one frame threads (`frame_threads`,
    or `converting_frame_threads` when swscale converts its frames beside it), never
    more than it has frames.
    """
    if frames <= SHORT_CLIP_FRAMES:
        rows = (height + 15) // 16
        return max(1, min(cores, rows // 3)), "SLICE"
    threads = converting_frame_threads(cores) if converts else frame_threads(cores)
    return max(1, min(threads, frames)), "FRAME"


PAIRED_SLICE_MIN_MACROBLOCKS = 1000


def slice_threads(geometry: Geometry, threads: int) -> int:
    """x264 slice threads for frames of `geometry`, given `threads`: one instead of two on
    a frame under `PAIRED_SLICE_MIN_MACROBLOCKS`, where the second thread's hand-off each
    frame costs more than it saves. On the 2-core machine 448x256x4 (448 macroblocks a
    frame) encoded in 2.9-3.3 ms on one thread and in 3.5 ms on two, idle; with an encoder
    opening beside it, as the daemon's processes do, in 3.5-3.6 ms and 3.6-4.8 ms. More
    threads do pay: on the 16-core host five took 1.8-2.2 ms and one 3.4-4.5 ms. (The
    colour converter keeps its `threads`.)"""
    macroblocks = ((geometry.width + 15) // 16) * ((geometry.height + 15) // 16)
    if threads == 2 and macroblocks < PAIRED_SLICE_MIN_MACROBLOCKS:
        return 1
    return threads


def frame_threads(cores: int) -> int:
    """x264 frame threads for one stream with `cores` to itself: one a core up to four
    cores, three in four past that, leaving the rest to the thread that feeds it frames
    and muxes its packets, and to the daemon around it. On 16 cores 12 threads encoded
    1344x768x122 11-12% faster than 16 (bench/results/2026-11-30-h200-threads-ab.md); 32
    were 30-45% slower (-frame-threads-ab.json). On 2 cores two were faster than one."""
    return cores if cores <= 4 else cores - cores // 4


def converting_frame_threads(cores: int) -> int:
    """x264 frame threads for one stream whose RGB frames are converted beside it, by
    swscale with up to 8 threads of its own (`FrameConverter`): half the cores past four,
    so that the two do not fight over them. On 16 cores 8 threads encoded rgb24
    1344x768x122 2-20% faster than 12 on three hosts (-h200-threads-ab.md)."""
    return cores if cores <= 4 else cores // 2


def converts(geometry: Geometry) -> bool:
    """Whether frames of this geometry go through swscale before the encoder."""
    return geometry.layout.name != "yuv420p"


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


def configure(
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
    ctx.thread_count = slice_threads(geometry, threads) if thread_type == "SLICE" else threads
    ctx.options = dict(codec.options)


def open_context(ctx: av.VideoCodecContext, codec: ResolvedCodec) -> None:
    try:
        ctx.open()
    except av.error.FFmpegError as exc:
        raise InvalidRequest(
            "codec", f"{codec.choice.encoder} rejected the options {codec.options}: {exc}"
        ) from None


class FrameConverter:
    """Borrowed frames in the client's format to yuv420p frames for the encoder. Used by
    one thread at a time: the converter keeps state (swscale's context, set up by the
    first frame), and may serve one encoder after another of the same `key`."""

    def __init__(self, geometry: Geometry, threads: int) -> None:
        self._layout = geometry.layout
        self._needs_convert = converts(geometry)
        # PyAV mis-sizes borrowed 4:2:0 frames whose height is not a multiple of 4.
        self._copy_420 = self._layout.planar420 and geometry.height % 4 != 0
        self._reformatter = VideoReformatter()
        self._threads = self.key_for(geometry, threads)[1]
        self.primed = not self._needs_convert

    @staticmethod
    def key_for(geometry: Geometry, threads: int) -> tuple[Geometry, int]:
        """What a converter is set up for: encoders of the same key may share one."""
        return geometry, max(1, min(threads, 8)) if threads else 1

    def frame(self, image: np.ndarray) -> av.VideoFrame:
        """A PyAV frame over `image` (borrowed), converted to yuv420p if need be."""
        if self._copy_420:
            frame = av.VideoFrame.from_ndarray(image, format=self._layout.name)
        else:
            frame = av.VideoFrame.from_numpy_buffer(image, format=self._layout.name)
        if self._needs_convert:
            frame = self._reformatter.reformat(
                frame,
                format="yuv420p",
                src_colorspace=Colorspace.ITU709,
                dst_colorspace=Colorspace.ITU709,
                src_color_range=ColorRange.MPEG if self._layout.planar420 else ColorRange.JPEG,
                dst_color_range=ColorRange.MPEG,
                threads=self._threads,
            )
            self.primed = True
        frame.colorspace = BT709
        frame.color_range = LIMITED_RANGE
        return frame

    def prime(self, blank: np.ndarray) -> None:
        """Set up the colour converter ahead of the first frame (once)."""
        if not self.primed:
            self.frame(blank)

    def frames(self, images: Iterable[np.ndarray], count: int) -> Generator[av.VideoFrame]:
        """`frame()` of each of `count` images, in order. RGB input of more than a few
        frames is converted ahead on a helper thread while the caller encodes: swscale
        and x264 both release the GIL, so the two overlap instead of taking turns (at
        1344x768 each costs about as much as the other)."""
        if self._needs_convert and count >= CONVERT_AHEAD_MIN_FRAMES:
            yield from converted_ahead(self.frame, images)
        else:
            for image in images:
                yield self.frame(image)


CONVERT_AHEAD_MIN_FRAMES = 8
CONVERT_AHEAD_DEPTH = 3  # frames converted before the encoder asks: enough to never wait


def converted_ahead(
    convert: Callable[[np.ndarray], av.VideoFrame], images: Iterable[np.ndarray]
) -> Generator[av.VideoFrame]:
    """`convert` of each image, in order, run on one helper thread a few frames ahead.
    The frames it yields are new buffers: an image's memory may be reused once its frame
    has been yielded. Closing the iterator early waits for conversions under way."""
    source = iter(images)
    pending: deque[Future[av.VideoFrame]] = deque()
    pool = ThreadPoolExecutor(1, thread_name_prefix="convert")
    try:
        for image in source:
            pending.append(pool.submit(convert, image))
            if len(pending) > CONVERT_AHEAD_DEPTH:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


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


def drain(
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
    ) -> None:
        self.geometry = geometry
        self.codec = codec
        self.container = container
        self.frames = 0
        self.timings = EncodeTimings()
        self.audio: AudioTrack | None = None
        self.headers_later = headers_later
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
        self.timings.open = time.perf_counter() - t0

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
        configure(stream.codec_context, self.geometry, self.codec, threads, thread_type)
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
            self._container.mux(self.audio.encode_until(self.duration))
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
        self._container.mux(packets)
        self.frames += 1
        if self.audio is not None:
            self._container.mux(self.audio.encode_until(self.duration))
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
        caller then `abort()`s (see `drain`)."""
        if not self.headers_later:
            self._drain(check)
        t1 = time.perf_counter()
        if self.audio is not None:
            self._container.mux(self.audio.finish(self.duration))
        t2 = time.perf_counter()
        self._container.close()
        t3 = time.perf_counter()
        self.timings.mux += t2 - t1
        self.timings.finalize += t3 - t2

    def _drain(self, check: Callable[[], None] | None) -> None:
        """The video encoder's delayed packets, muxed one by one as they come."""
        encode = mux = 0.0
        t0 = time.perf_counter()
        for packet in drain(self._stream.codec_context, check):
            t1 = time.perf_counter()
            encode += t1 - t0
            packet.stream = self._stream
            self._container.mux(packet)
            t0 = time.perf_counter()
            mux += t0 - t1
        self.timings.encode += encode + (time.perf_counter() - t0)
        self.timings.mux += mux

    def abort(self) -> None:
        """Stop without finishing; the caller discards the output."""
        with contextlib.suppress(Exception):
            self._container.close()

    @property
    def duration(self) -> float:
        return float(self.frames / self.geometry.fps)
