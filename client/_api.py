"""The public surface both clients share, written once.

Design: one I/O-free core under two thin drivers. Everything a call decides (planning
ranges, leases and the spare lease, re-attaching after a daemon restart, error mapping,
stream state, fork awareness, the way each encode goes) lives in the core (`_core`,
`_send`, `_ways`, `_stream`) as generators of steps (`_steps`). `SidecarClient` performs
each step blocking and `AsyncSidecarClient` awaits it; a driver holds nothing but its
channel, how it performs each kind of step, and its lock.

Why not the async client as the source of a generated sync one (unasync, as httpcore
does)? That keeps two copies of the logic in the tree, generated or not, with a generator
script and a staleness test to maintain; here there is one copy, and a unit test can run
the core without a network. The price is that operations are written as generators
(`yield from` where a call would be), which the core's modules do throughout.

The public methods with many parameters (`encode`, `stream`, `encode_leased`) are defined
here once, with explicit parameters and documentation (in `_api_docs`), and typed through the twin's
result types: `SidecarClient.encode` returns an `EncodeResult`, `AsyncSidecarClient.encode`
a coroutine of one. Each twin gets its own copy of them (`__init_subclass__`), so that
`help()` and Python's own errors (an unknown keyword, say) name the twin's method.
"""

from __future__ import annotations

import abc
import os
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import grpc

from ._api_docs import ENCODE_DOC, ENCODE_LEASED_DOC, STREAM_DOC, documented
from ._audio import prepare_audio
from ._core import ClientCore
from ._errors import SidecarClosed
from ._live import Live
from ._options import (
    EncodeOptions,
    Fps,
    VideoFormat,
    VideoGeometry,
    check_callbacks,
    check_leased,
    check_timeout,
)
from ._previews import SpriteSheet, Thumbnail, check_for_stream
from ._send import encode, encode_leased
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

    def __init__(
        self,
        target: str | None = None,
        *,
        client_name: str = "",
        timeout: float | None = None,
        lease_wait: float | None = None,
        transport: str = "auto",
        credentials: grpc.ChannelCredentials | None = None,
        prepare: bool = True,
    ) -> None:
        """`target`: a socket path, a `unix:` URI or `host:port`; by default
        $VIDEO_SIDECAR_SOCKET, else the daemon's default socket. `timeout`: seconds for
        calls without their own (None: unary calls 10 s, encodes none). `lease_wait`:
        seconds a request may wait in the daemon's queue for room in the pool; None: as
        long as the pool keeps moving (within the call's timeout). `transport`: "auto"
        (shared memory, else inline), "shm" or "inline". `credentials`:
        `grpc.ssl_channel_credentials(...)` for a TCP target with TLS. `prepare`: attach
        now, in the background (on a thread; the async client on the running loop, if
        any), so that the first request finds the slabs mapped and, on a GPU worker,
        registered; a failure there is left for the first request to meet and raise.
        False: attach on first use."""
        check_timeout(timeout)
        self._core = ClientCore(
            target,
            client_name=client_name,
            timeout=timeout,
            lease_wait=lease_wait,
            transport=transport,
        )
        self.credentials = credentials
        self._closed = False  # set by close(): every later call raises SidecarClosed
        self._connect()
        if prepare:
            self._attach_in_background()

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

    def _check_open(self, steps: Steps[Any]) -> None:
        """SidecarClosed, before anything is sent, once the client is closed."""
        if self._closed:
            steps.close()
            raise SidecarClosed(f"this {type(self).__name__} is closed; make a new one")

    @abc.abstractmethod
    def _connect(self) -> None:
        """Open the channel (again, in a child after fork)."""

    @abc.abstractmethod
    def _attach_in_background(self) -> None:
        """Start attaching in the background (see `prepare`)."""

    @abc.abstractmethod
    def _result(self, steps: Steps[EncodeResult]) -> ResultT:
        """Run `steps`: to the result (blocking), or as a coroutine."""

    @abc.abstractmethod
    def _stream(self, core: StreamCore) -> StreamT:
        """The twin's stream around `core`."""

    # -- encoding -------------------------------------------------------------------------

    @documented(ENCODE_DOC)
    def encode(
        self,
        video: Any,
        fps: Fps = 24,
        *,
        path: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        pixel_format: str | None = None,
        layout: str | None = None,
        value_range: tuple[float, float] = (0, 1),
        audio: Any = None,
        sample_rate: int | None = None,
        container: str = "",
        codec: str = "",
        crf: int | None = None,
        preset: str | None = None,
        profile: str | None = None,
        bitrate: int | None = None,
        gop: int | None = None,
        threads: int = 0,
        extra: Mapping[str, Any] | None = None,
        request_id: str = "",
        thumbnail: Thumbnail | bool | None = None,
        sprite_sheet: SpriteSheet | bool | None = None,
        live: Live | str | os.PathLike[str] | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> ResultT:
        options = EncodeOptions.of(locals())
        check_callbacks(timeout=timeout, on_progress=on_progress, on_chunk=on_chunk)
        fmt = VideoFormat(pixel_format, layout, value_range)
        steps = encode(
            self._core, video, options, fmt, audio, sample_rate, on_progress, timeout, on_chunk
        )
        return self._result(steps)

    @documented(STREAM_DOC)
    def stream(
        self,
        fps: Fps = 24,
        *,
        path: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        pixel_format: str | None = None,
        layout: str | None = None,
        value_range: tuple[float, float] = (0, 1),
        audio: Any = None,
        sample_rate: int | None = None,
        channels: int | None = None,
        container: str = "",
        codec: str = "",
        crf: int | None = None,
        preset: str | None = None,
        profile: str | None = None,
        bitrate: int | None = None,
        gop: int | None = None,
        threads: int = 0,
        extra: Mapping[str, Any] | None = None,
        request_id: str = "",
        thumbnail: Thumbnail | bool | None = None,
        sprite_sheet: SpriteSheet | bool | None = None,
        live: Live | str | os.PathLike[str] | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> StreamT:
        options = EncodeOptions.of(locals())
        check_callbacks(timeout=timeout, on_progress=on_progress, on_chunk=on_chunk)
        check_for_stream(thumbnail, sprite_sheet)
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

    @documented(ENCODE_LEASED_DOC)
    def encode_leased(
        self,
        ranges: Sequence[FrameRange],
        *,
        width: int,
        height: int,
        pixel_format: str = "rgb24",
        fps: Fps = 24,
        path: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        container: str = "",
        codec: str = "",
        crf: int | None = None,
        preset: str | None = None,
        profile: str | None = None,
        bitrate: int | None = None,
        gop: int | None = None,
        threads: int = 0,
        extra: Mapping[str, Any] | None = None,
        request_id: str = "",
        thumbnail: Thumbnail | bool | None = None,
        sprite_sheet: SpriteSheet | bool | None = None,
        live: Live | str | os.PathLike[str] | None = None,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> ResultT:
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
