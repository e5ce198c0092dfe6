"""The public surface both clients share, written once.

Design: one I/O-free core under two thin drivers. Everything a call decides (planning
ranges, leases and the spare lease, re-attaching after a daemon restart, error mapping,
stream state, fork awareness) lives in the core (`_core`, `_encode`, `_stream`) as
generators of steps (`_steps`). `SidecarClient` performs each step blocking and
`AsyncSidecarClient` awaits it; a driver holds nothing but its channel, how it performs
each kind of step, and its lock.

Why not the async client as the source of a generated sync one (unasync, as httpcore
does)? That keeps two copies of the logic in the tree, generated or not, with a generator
script and a staleness test to maintain; here there is one copy, and a unit test can run
the core without a network. The price is that operations are written as generators
(`yield from` where a call would be), which the core's modules do throughout.

The public methods with many parameters (`encode`, `stream`, `encode_leased`) are defined
here once, with explicit parameters and documentation, and typed through the twin's
result types: `SidecarClient.encode` returns an `EncodeResult`, `AsyncSidecarClient.encode`
a coroutine of one. Each twin gets its own copy of them (`__init_subclass__`), so that
`help()` and Python's own errors (an unknown keyword, say) name the twin's method.
"""

from __future__ import annotations

import abc
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import grpc

from ._audio import prepare_audio
from ._core import ClientCore
from ._encode import encode, encode_leased
from ._options import (
    EncodeOptions,
    Fps,
    VideoFormat,
    VideoGeometry,
    check_callbacks,
    check_leased,
    check_timeout,
)
from ._steps import Steps
from ._stream import StreamCore
from ._types import EncodeResult, FrameRange
from ._video import VideoSource

ResultT = TypeVar("ResultT")  # an EncodeResult, or a coroutine of one
StreamT = TypeVar("StreamT")  # VideoStream, AsyncVideoStream
ProgressCallback = Callable[[int, int], None]
SHARED_METHODS = ("encode", "stream", "encode_leased")


class ClientApi(abc.ABC, Generic[ResultT, StreamT]):
    """What `SidecarClient` and `AsyncSidecarClient` share; see `SidecarClient`."""

    _KEEPS_SESSIONS = True  # whether one-reply encodes go on kept EncodeSession calls
    # (without a framed socket: both clients keep framed connections)

    def __init__(
        self,
        target: str | None = None,
        *,
        client_name: str = "",
        timeout: float | None = None,
        lease_wait: float | None = None,
        transport: str = "auto",
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        """`target`: a socket path, a `unix:` URI or `host:port`; by default
        $VIDEO_SIDECAR_SOCKET, else the daemon's default socket. `timeout`: seconds for
        calls without their own (None: unary calls 10 s, encodes none). `lease_wait`:
        seconds a request may wait in the daemon's queue for room in the pool; None: as
        long as the pool keeps moving (within the call's timeout). `transport`: "auto"
        (shared memory, else inline), "shm" or "inline". `credentials`:
        `grpc.ssl_channel_credentials(...)` for a TCP target with TLS."""
        check_timeout(timeout)
        self._core = ClientCore(
            target,
            client_name=client_name,
            timeout=timeout,
            lease_wait=lease_wait,
            transport=transport,
            sessions=self._KEEPS_SESSIONS,
        )
        self.credentials = credentials
        self._connect()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in SHARED_METHODS:
            shared = ClientApi.__dict__[name]
            own = types.FunctionType(
                shared.__code__, shared.__globals__, name, shared.__defaults__, shared.__closure__
            )
            own.__kwdefaults__ = shared.__kwdefaults__
            own.__annotations__ = shared.__annotations__
            own.__doc__ = shared.__doc__
            own.__module__ = cls.__module__
            own.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, own)

    # -- what a twin provides -------------------------------------------------------------

    @abc.abstractmethod
    def _connect(self) -> None:
        """Open the channel (again, in a child after fork)."""

    @abc.abstractmethod
    def _result(self, steps: Steps[EncodeResult]) -> ResultT:
        """Run `steps`: to the result (blocking), or as a coroutine."""

    @abc.abstractmethod
    def _stream(self, core: StreamCore) -> StreamT:
        """The twin's stream around `core`."""

    # -- encoding -------------------------------------------------------------------------

    def encode(
        self,
        video: Any,
        fps: Fps = 24,
        *,
        path: str | None = None,
        overwrite: bool = False,
        pixel_format: str | None = None,
        layout: str | None = None,
        value_range: tuple[float, float] = (0, 1),
        audio: Any = None,
        sample_rate: int | None = None,
        container: str = "mp4",
        codec: str = "",
        crf: int | None = None,
        preset: str | None = None,
        gop: int | None = None,
        threads: int = 0,
        extra: Mapping[str, Any] | None = None,
        request_id: str = "",
        on_chunk: Callable[[bytes], None] | None = None,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> ResultT:
        """Encode `video`; the MP4 (or WebM) as bytes, or as a file under the output root.

        `AsyncSidecarClient.encode` is the same, awaited.

        Args:
            video: a numpy array or torch tensor (CPU or CUDA) of uint8, float16, bfloat16,
                float32 or float64. Frames are copied once, straight into leased shared memory;
                CUDA tensors are converted on the GPU and copied device-to-host into the
                lease. A video larger than half the pool goes as a stream, by itself.
            fps: frames per second, a number or (numerator, denominator).
            path: the output file, relative to the daemon's output root; without it the
                bytes come back in `result.data`.
            overwrite: replace an existing file at `path` (else `AlreadyExists`).
            pixel_format: what travels. None: RGB in a CUDA tensor is converted to
                yuv420p on the GPU, other RGB goes as rgb24. "rgb24" sends RGB as it is,
                for the daemon to convert (byte-exact with its swscale, the choice when
                outputs must match a CPU encode bit for bit); "yuv420p" or "nv12"
                convert RGB to 4:2:0 BT.709 before the copy (half the bytes, no
                conversion in the daemon); "bgr24", "rgba" and "gray" are taken as they
                are. A uint8 numpy array (T, H*3/2, W) with "yuv420p" or "nv12" is taken
                as already converted.
            layout: "THWC", "TCHW", "CTHW" or "BCTHW" with B=1. None reads it from the
                shape: the one layout that puts 1, 3 or 4 channels on its channel axis
                (frames 4 pixels wide or high count only if no reading has larger
                ones). Tie-breaks: one frame of C channels beats C gray frames, so
                (1, 3, H, W) is one RGB frame; 5-D is BCTHW wherever that fits, as VAEs
                return it, so (1, 3, 4, H, W) is 4 frames. Any other shape with two
                readings, e.g. (3, 3, H, W), is InvalidVideo naming them: pass `layout=`.
            value_range: the range of float input, (0, 1) or (-1, 1); values outside are
                clipped. When more than 1% of a sample of the video (a few frames, a
                strided grid of each) lies outside it by more than 5% of its width, a
                `UserWarning` at the caller's line says so and how to fix it (usually
                value_range=(-1, 1)); the video is still encoded. Checked on the device
                for CUDA tensors: one small reduction, one wait for it.
            audio: PCM, (samples, channels) or (samples,), float32 in [-1, 1] or int16;
                muxed as AAC (MP4) or Opus (WebM), trimmed or padded to the video.
            sample_rate: the audio's rate in Hz; required with `audio`.
            container: "mp4" (index first), "fmp4" (fragmented MP4) or "webm" (VP9, Opus).
            codec: "h264", "h265" or "av1"; empty for the container's default.
            crf: the encoder's quality (lower is better); None for the codec's default.
            preset: the encoder's speed preset, e.g. "veryfast"; None for the default.
            gop: frames between keyframes; None for the default.
            threads: encoder threads; 0 lets the daemon share its cores among encodes.
            extra: more encoder options, e.g. {"tune": "film"}.
            request_id: the id the daemon logs this request under and returns in
                `result.request_id`; empty for a generated one.
            on_chunk: called with each piece of the output, in order, as it arrives:
                while encoding with container="fmp4", at the end otherwise; never with
                `path`. `result.data` still holds the whole file.
            on_progress: called with (frames done, frames in all) while encoding; the
                total is the video's length from the first call.
            timeout: seconds for the whole call (a gRPC deadline); None for the client's.

        Without `on_chunk` and `on_progress`, a video is answered in one reply with its
        output inside (or in a lease): a request on a connection to the daemon's framed
        socket that the client keeps open for the next one (one per encode in flight; a
        `timeout` closes it, which stops the encode). Without that socket (TCP, or a
        daemon that serves none), a clip of at most 4 MiB as 4:2:0 pictures (or one
        written to `path`): a request on an `EncodeSession` call that `SidecarClient`
        keeps open, or an `EncodeOnce` call (with a `timeout`, and from
        `AsyncSidecarClient`). Anything else is `Encode`, a reply stream. On the framed
        socket a CUDA video of 32 MiB or more is sent while its GPU copy still runs,
        and the daemon starts on each frame as it lands (`sidecar.codec.landing`).

        Returns:
            An `EncodeResult`: `data` or `path`, frames, duration, size and timings.

        Raises:
            InvalidVideo: the video cannot be used as given (shape, dtype, layout, range).
            SidecarError: the subclass says why (see the exception tree in `client`).
        """
        options = EncodeOptions.of(locals())
        check_callbacks(timeout=timeout, on_progress=on_progress, on_chunk=on_chunk)
        fmt = VideoFormat(pixel_format, layout, value_range)
        steps = encode(
            self._core, video, options, fmt, audio, sample_rate, on_progress, timeout, on_chunk
        )
        return self._result(steps)

    def stream(
        self,
        fps: Fps = 24,
        *,
        path: str | None = None,
        overwrite: bool = False,
        pixel_format: str | None = None,
        layout: str | None = None,
        value_range: tuple[float, float] = (0, 1),
        audio: Any = None,
        sample_rate: int | None = None,
        channels: int | None = None,
        container: str = "mp4",
        codec: str = "",
        crf: int | None = None,
        preset: str | None = None,
        gop: int | None = None,
        threads: int = 0,
        extra: Mapping[str, Any] | None = None,
        request_id: str = "",
        on_chunk: Callable[[bytes], None] | None = None,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> StreamT:
        """A streaming encode: `with client.stream(fps=24) as s: s.write(chunk)`.

        On `AsyncSidecarClient`: `async with client.stream(...) as s: await s.write(chunk)`.
        Each chunk goes into its own lease, freed once its frames are encoded; `write`
        waits for a lease while the pool is full. Leaving the block with an exception
        cancels the stream and frees its leases; after the block, `s.result` holds the
        `EncodeResult`.

        Args:
            fps, path, overwrite, pixel_format, layout, value_range, container, codec,
            crf, preset, gop, threads, extra, request_id: as for `encode` (a float range
                warning is given once a stream).
            on_progress: as for `encode`, but the total is 0 until the last call: a
                stream's length is known only when it is closed.
            audio: a PCM track sent with the first chunk (with `sample_rate`).
            sample_rate: the audio's rate in Hz.
            channels: with `sample_rate` and no `audio`: declares the track now, and the
                samples follow in `s.close(audio=...)`.
            on_chunk: called with each piece of output as it arrives; with
                container="fmp4" and no `path` that is while encoding. Or iterate
                `s.chunks()` (from another thread, or task).
            timeout: seconds for the whole stream, from the first `write` to the result
                (its call's gRPC deadline; a `write` waiting for a lease waits no longer);
                None for the client's. Past it, `write` or `close` raises
                `DeadlineExceeded` and the daemon stops the encode and frees its leases.
        """
        options = EncodeOptions.of(locals())
        check_callbacks(timeout=timeout, on_progress=on_progress, on_chunk=on_chunk)
        pcm = prepare_audio(audio, sample_rate) if audio is not None else None
        declared = (sample_rate, channels) if pcm is None and sample_rate and channels else None
        core = StreamCore(
            self._core,
            options,
            VideoFormat(pixel_format, layout, value_range),
            audio=pcm,
            audio_format=declared,
            on_chunk=on_chunk,
            on_progress=on_progress,
            timeout=timeout,
        )
        return self._stream(core)

    def encode_leased(
        self,
        ranges: Sequence[FrameRange],
        *,
        width: int,
        height: int,
        pixel_format: str = "rgb24",
        fps: Fps = 24,
        path: str | None = None,
        overwrite: bool = False,
        container: str = "mp4",
        codec: str = "",
        crf: int | None = None,
        preset: str | None = None,
        gop: int | None = None,
        threads: int = 0,
        extra: Mapping[str, Any] | None = None,
        request_id: str = "",
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> ResultT:
        """Encode frames you wrote into leases yourself (see `lease()`).

        `AsyncSidecarClient.encode_leased` is the same, awaited.

        Args:
            ranges: the frames, in order: `FrameRange(lease, frame_count, offset=0,
                row_stride=0, frame_stride=0)`, strides in bytes, 0 for tightly packed.
            width, height: the frame size in pixels.
            pixel_format: the frames' format in the leases: "rgb24", "bgr24", "rgba",
                "gray", "yuv420p" or "nv12".
            fps, path, overwrite, container, codec, crf, preset, gop, threads, extra,
            request_id, on_progress, timeout: as for `encode`.

        The daemon frees each lease once its frames are encoded; a refused request leaves
        them with you.
        """
        options = EncodeOptions.of(locals())
        check_callbacks(timeout=timeout, on_progress=on_progress)
        check_leased(ranges, width, height)
        frames = VideoGeometry(width, height, pixel_format)
        steps = encode_leased(self._core, ranges, frames, options, on_progress, timeout)
        return self._result(steps)

    # -- state ----------------------------------------------------------------------------

    @property
    def target(self) -> str:
        """The gRPC target, e.g. "unix:/run/user/1000/video-sidecar/sidecar.sock"."""
        return self._core.target

    @property
    def transport(self) -> str:
        return self._core.transport

    @property
    def inline(self) -> bool:
        """Whether frames travel inside gRPC messages (no shared memory in reach)."""
        return self._core.inline

    @property
    def timeout(self) -> float | None:
        return self._core.timeout

    @property
    def lease_wait(self) -> float:
        return self._core.lease_wait

    @property
    def client_name(self) -> str:
        return self._core.client_name

    @property
    def cuda_registrations(self) -> int:
        """Slabs this process has registered with CUDA (each at most once)."""
        return self._core.cuda_registrations

    def _prepare(
        self,
        video: Any,
        pixel_format: str | None = None,
        layout: str | None = None,
        value_range: tuple[float, float] = (0, 1),
    ) -> VideoSource:
        """The checked video, ready to copy into a lease (for the benchmark and tests)."""
        return self._core.prepare(video, VideoFormat(pixel_format, layout, value_range))
