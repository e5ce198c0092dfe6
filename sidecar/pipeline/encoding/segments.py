"""Segment-parallel encoding: a long video cut into GOP-aligned segments that encode at once.

x264 with frame threads scales poorly past a handful of threads on one stream, while a
1344x768x362 video has cores to spare. So a long video whose frames are all in hand (an
Encode, not a stream) is cut into segments of whole GOPs; each segment gets its own
encoder, configured exactly like the output stream's (so they share its SPS/PPS), and
starts on a keyframe; their packets are muxed into the one output in order, with the
segment's own timestamps, so the result is one valid file with continuous timestamps.

Cuts fall only where a single pass puts a keyframe anyway: on multiples of the keyframe
interval (the request's `gop`, a `keyint`/`g` option, else the encoders' default of 250).
A cut anywhere else costs a keyframe, which on grainy content is worth some 20 other
frames: 1344x768x122 with one such cut came out 13% larger, with three 39%. So with the
default interval a video is cut only past 250 frames, and a short GOP cuts freely. As
many segments as the job's share of the cores allows: concurrent requests each get fewer
cores and so fewer segments, and a 2-core machine never cuts at all.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import av
import numpy as np

from ...codec.catalogue import ResolvedCodec
from ...codec.codec_rules import split_params
from ...codec.colour import FrameConverter
from ...codec.encoder import VideoEncoder, configure_context, flush_packets, open_context
from ...codec.landing import Frames
from ...errors import Cancelled

MIN_SEGMENT_FRAMES = 60
DEFAULT_KEYINT = 250  # x264's and x265's keyint when nothing sets it
THREADS_PER_SEGMENT = 4  # frame threads per segment encoder; x264 scales well to this
MAX_SEGMENTS = 8
# Segments must share one set of headers. x265 writes its settings, frame threads
# included, into its headers, so its segment encoders, each with its share of the cores,
# never agreed with the stream's: every h265 video fell back to one pass after an x265
# open for nothing. x264's headers do not depend on its threads.
SEGMENTABLE = ("libx264",)


def plan_segments(frames: int, cores: int, keyint: int) -> list[tuple[int, int]]:
    """[start, stop) frame ranges: one (no cut) unless the video and the cores allow more.
    Cuts fall on multiples of `keyint` only, where the encoder starts a GOP anyway."""
    count = min(cores // THREADS_PER_SEGMENT, frames // MIN_SEGMENT_FRAMES, MAX_SEGMENTS)
    if count < 2:
        return [(0, frames)]
    cuts = {round(frames * k / count / keyint) * keyint for k in range(1, count)}
    edges = [0, *sorted(c for c in cuts if 0 < c < frames), frames]
    return list(itertools.pairwise(edges))


def thread_shares(threads: int, lengths: list[int]) -> list[int]:
    """`threads` divided among segments of `lengths` frames, in proportion, at least one
    each, so that they finish together: cuts fall on whole GOPs, so 362 frames make
    segments of 250 and 112, and an even split left the shorter one's threads idle while
    the longer one still ran."""
    total = sum(lengths)
    shares = [max(1, threads * n // total) for n in lengths]
    for _ in range(threads - sum(shares)):  # what rounding left: the most frames a thread
        i = max(range(len(lengths)), key=lambda k: lengths[k] / shares[k])
        shares[i] += 1
    return shares


def keyframe_interval(codec: ResolvedCodec) -> int:
    """The largest GOP a single pass of `codec` makes: where it starts a new one anyway."""
    params = split_params(codec.options.get(codec.choice.encoder[3:] + "-params", ""))
    for value in (codec.gop, params.get("keyint"), codec.options.get("g")):
        if value is not None and int(value) > 0:
            return int(value)
    return DEFAULT_KEYINT


class SegmentCoder:
    """A bare encoder for one segment, set up like the output stream's encoder."""

    def __init__(self, encoder: VideoEncoder, threads: int) -> None:
        ctx = av.CodecContext.create(encoder.codec.choice.encoder, "w")
        assert isinstance(ctx, av.VideoCodecContext)
        configure_context(ctx, encoder.geometry, encoder.codec, threads, "FRAME")
        # Headers out of band, as the container asked of the stream's own encoder.
        ctx.flags |= av.codec.context.Flags.global_header
        open_context(ctx, encoder.codec)
        self._ctx = ctx
        self._converter = FrameConverter(encoder.geometry, threads)

    @property
    def extradata(self) -> bytes | None:
        return self._ctx.extradata

    def encode(
        self,
        frame_at: Callable[[int], np.ndarray],
        start: int,
        stop: int,
        stopped: Callable[[], bool],
    ) -> list[Any]:
        packets: list[Any] = []
        images = (frame_at(index) for index in range(start, stop))
        with contextlib.closing(self._converter.frames(images, stop - start)) as frames:
            for index, frame in enumerate(frames, start):
                if stopped():
                    raise Cancelled("cancelled by the client")
                frame.pts = index  # the segment's place in the whole video
                packets += self._ctx.encode(frame)

        def check() -> None:
            if stopped():
                raise Cancelled("cancelled by the client")

        packets += flush_packets(self._ctx, check)  # stops between packets too
        return packets


def frame_lookup(pieces: Sequence[Frames]) -> Callable[[int], np.ndarray]:
    """Frame `i` of the whole video, from its pieces' frame arrays in order."""
    starts = list(itertools.accumulate((len(p) for p in pieces), initial=0))

    def frame_at(index: int) -> np.ndarray:
        k = bisect.bisect_right(starts, index) - 1
        frame: np.ndarray = pieces[k][index - starts[k]]
        return frame

    return frame_at


def encode_segments(
    encoder: VideoEncoder,
    frame_at: Callable[[int], np.ndarray],
    segments: list[tuple[int, int]],
    threads: int,
    stopped: Callable[[], bool],
    progress: Callable[[int], None],
) -> bool:
    """Encode `segments` at once and mux them in order; False (nothing done) when the
    segment encoders would not share the stream's headers. A stream opened with
    `headers_later` takes the first segment encoder's."""
    shares = thread_shares(threads, [stop - start for start, stop in segments])
    first = SegmentCoder(encoder, shares[0])
    if encoder.headers_later:
        encoder.take_headers(first.extradata)  # the stream opened no encoder of its own
    elif first.extradata != encoder.extradata:
        return False
    failed = threading.Event()

    def halt() -> bool:
        return failed.is_set() or stopped()

    def encode(index: int, start: int, stop: int) -> list[Any]:
        # The others open in their own threads: the first segment encodes meanwhile.
        coder = first if index == 0 else SegmentCoder(encoder, shares[index])
        if coder.extradata != first.extradata:  # same settings: never expected
            raise RuntimeError("segment encoders disagree on the stream headers")
        return coder.encode(frame_at, start, stop, halt)

    t0, mux0 = time.perf_counter(), encoder.timings.mux
    with ThreadPoolExecutor(len(segments), thread_name_prefix="segment") as pool:
        futures = [
            pool.submit(encode, index, start, stop) for index, (start, stop) in enumerate(segments)
        ]
        try:
            for future, (start, stop) in zip(futures, segments, strict=True):
                encoder.mux_encoded(future.result(), stop - start)  # in order, as each ends
                progress(stop)
        except BaseException:
            failed.set()  # the others stop at their next frame
            raise
    # Conversion happens inside the segment threads: it counts as encoding here.
    encoder.timings.encode += time.perf_counter() - t0 - (encoder.timings.mux - mux0)
    return True
