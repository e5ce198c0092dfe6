"""The blocking client."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

from . import _core
from ._audio import Pcm, prepare_audio
from ._base import BaseClient, EncodeOptions
from ._errors import NotFound, SidecarError
from ._stream import VideoStream
from ._types import Attachment, EncodeResult, FrameRange, Lease, Status
from ._video import VideoSource

T = TypeVar("T")


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except grpc.RpcError as err:
        raise _core.error_from_rpc(err) from None


class SidecarClient(BaseClient):
    """Talks to a video-sidecar daemon and writes frames straight into its slabs.

    ```python
    with SidecarClient() as client:
        result = client.encode(video, fps=24, path="clips/out.mp4")
    ```

    `target` is a socket path, a `unix:` URI or `host:port`; by default the daemon's
    default socket (or $VIDEO_SIDECAR_SOCKET). Slabs are mapped once, on first use, and
    again only if the daemon restarts. A client may be shared by threads, and survives a
    fork: the child opens its own channel and attaches anew.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        client_name: str = "",
        timeout: float | None = None,
        lease_wait: float = 30.0,
        transport: str = "auto",
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        super().__init__(
            target,
            client_name=client_name,
            timeout=timeout,
            lease_wait=lease_wait,
            transport=transport,
        )
        self.credentials = credentials
        self._open_channel()

    def _open_channel(self) -> None:
        if self.credentials is not None:  # TCP with TLS
            self._channel = grpc.secure_channel(
                self.target, self.credentials, options=_core.CHANNEL_OPTIONS
            )
        else:
            self._channel = grpc.insecure_channel(self.target, options=_core.CHANNEL_OPTIONS)
        self._stub = pb_grpc.VideoSidecarStub(self._channel)

    def _stub_here(self) -> Any:
        if self._forked():
            self._open_channel()  # the parent's channel is not usable after fork
        return self._stub

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        spare = self._drop_spare()
        if spare is not None and not self._forked():
            with contextlib.suppress(SidecarError):
                self.release(spare)
        self._slabs.close()
        self._channel.close()

    # -- session -------------------------------------------------------------------------

    def attach(self, *, refresh: bool = False) -> Attachment:
        """Attach (once) and map the daemon's slabs."""
        stub = self._stub_here()
        if self._attachment is None or refresh:
            with _translated():
                resp = stub.Attach(self._attach_request(), timeout=self.timeout or 10.0)
            return self._attached(resp)
        return self._attachment

    def _with_reattach(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except SidecarError as err:
            if not _core.is_not_attached(err):
                raise
            self.attach(refresh=True)
            return call()

    # -- leases --------------------------------------------------------------------------

    def lease(self, nbytes: int, *, wait: float | None = None) -> Lease:
        """Lease a region of at least `nbytes`; waits up to `wait` seconds for room."""

        def call() -> Lease:
            att = self.attach()
            with _translated():
                resp = self._stub.Lease(
                    self._lease_request(att, nbytes, wait), timeout=self._lease_timeout(wait)
                )
            return self._leased(resp)

        return self._with_reattach(call)

    def release(self, lease: Lease | str) -> None:
        """Give a lease back. Releasing one the daemon already freed is not an error."""
        lease_id = lease if isinstance(lease, str) else lease.id
        att = self.attach()
        with contextlib.suppress(NotFound), _translated():
            self._stub.Release(
                pb.ReleaseRequest(client_token=att.client_token, lease_id=lease_id),
                timeout=self.timeout or 10.0,
            )

    # -- encoding ------------------------------------------------------------------------

    def encode(
        self,
        video: Any,
        fps: float | tuple[int, int] = 24,
        *,
        path: str | None = None,
        overwrite: bool = False,
        pixel_format: str | None = None,
        layout: str | None = None,
        value_range: tuple[float, float] = (0, 1),
        audio: Any = None,
        sample_rate: int | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        timeout: float | None = None,
        **codec_options: Any,
    ) -> EncodeResult:
        """Encode `video` and return the MP4, as bytes or as a file under the output root.

        `video` is a numpy array or a torch tensor (CPU or CUDA) of uint8, float16,
        bfloat16 or float32. `layout` is "THWC" (the default for 4-D with channels last),
        "TCHW", "CTHW" or "BCTHW" (the default for 5-D); floats are read in `value_range`,
        (0, 1) or (-1, 1). Frames are copied once, straight into leased shared memory; CUDA
        tensors are converted on the GPU and copied device-to-host into the lease.

        `pixel_format` is what travels: rgb24 for RGB by default (byte-exact), or yuv420p /
        nv12 to convert RGB to 4:2:0 BT.709 before the copy (half the bytes, no CPU
        conversion in the daemon). A uint8 numpy array (T, H*3/2, W) with
        pixel_format="yuv420p" is taken as already converted.

        `path` is relative to the daemon's output root; without it the bytes come back in
        `result.data`. `codec_options`: codec ("h264", "h265", "av1"), crf, preset, gop,
        threads, extra (a dict of encoder options), request_id.
        """
        started = time.perf_counter()
        options = EncodeOptions(fps=fps, path=path, overwrite=overwrite, **codec_options)
        source = self._prepare(video, pixel_format, layout, value_range)
        pcm = prepare_audio(audio, sample_rate) if audio is not None else None
        att = self.attach()
        plan = _core.plan_ranges(source.frames, source.frame_bytes, att)
        if self.inline or not _core.fits_in_pool(plan, source.frame_bytes, att):
            # Larger than the pool lets one request hold, or no shared memory: stream it,
            # each lease freed as soon as its frames are encoded.
            stream = VideoStream(
                self, options, **self._stream_args(pcm, None, None, on_progress, timeout=timeout)
            )
            stream.started = started
            with stream:
                stream.write_source(source)
            assert stream.result is not None
            return stream.result
        return self._with_reattach(
            lambda: self._encode_source(source, options, started, on_progress, timeout, pcm)
        )

    def stream(
        self,
        fps: float | tuple[int, int] = 24,
        *,
        path: str | None = None,
        overwrite: bool = False,
        pixel_format: str | None = None,
        layout: str | None = None,
        value_range: tuple[float, float] = (0, 1),
        audio: Any = None,
        sample_rate: int | None = None,
        channels: int | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        **codec_options: Any,
    ) -> VideoStream:
        """A streaming encode: `with client.stream(fps=24) as s: s.write(chunk)`.

        Arguments as `encode`. `audio` (with `sample_rate`) goes with the first chunk; or
        declare `sample_rate` and `channels` here and pass the samples to `s.close(audio=)`.
        With `container="fmp4"` the output arrives while encoding: `on_chunk(bytes)` or
        iterate `s.chunks()` (from another thread). After the block, `s.result` holds the
        `EncodeResult`.
        """
        options = EncodeOptions(fps=fps, path=path, overwrite=overwrite, **codec_options)
        pcm = prepare_audio(audio, sample_rate) if audio is not None else None
        declared = (sample_rate, channels) if pcm is None and sample_rate and channels else None
        return VideoStream(
            self,
            options,
            **self._stream_args(
                pcm, declared, on_chunk, on_progress, pixel_format, layout, value_range
            ),
        )

    def _encode_source(
        self,
        source: VideoSource,
        options: EncodeOptions,
        started: float,
        on_progress: Callable[[int, int], None] | None,
        timeout: float | None,
        pcm: Pcm | None = None,
    ) -> EncodeResult:
        att = self.attach()
        plan = _core.plan_ranges(source.frames, source.frame_bytes, att)
        single = len(plan) == 1  # small requests reuse the spare lease and ask for the next
        leases: list[Lease] = []
        clock = {"lease_ms": 0.0, "copy_ms": 0.0}
        try:
            ranges = []
            for first, count in plan:
                t0 = time.perf_counter()
                lease = self._lease_for(count * source.frame_bytes, single)
                leases.append(lease)
                t1 = time.perf_counter()
                source.copy_into(lease.array, first, count)
                clock["lease_ms"] += (t1 - t0) * 1e3
                clock["copy_ms"] += (time.perf_counter() - t1) * 1e3
                ranges.append(FrameRange(lease, count))
            t1 = time.perf_counter()
            source.finish()
            clock["copy_ms"] += (time.perf_counter() - t1) * 1e3
            audio_data = None
            if pcm is not None:
                lease = self.lease(pcm.nbytes)
                leases.append(lease)
                audio_data = self._audio_in_lease(pcm, lease)
            request = options.request(
                att.client_token,
                source.width,
                source.height,
                source.pixel_format,
                ranges,
                next_lease_bytes=source.frames * source.frame_bytes if single else 0,
                audio=pcm.spec() if pcm is not None else None,
                audio_data=audio_data,
            )
            return self._encode(request, clock, started, on_progress, timeout)
        except BaseException:
            # The daemon frees leases it took; ones it refused go back now.
            for lease in leases:
                with contextlib.suppress(SidecarError):
                    self.release(lease.id)
            raise

    def _lease_for(self, nbytes: int, use_spare: bool) -> Lease:
        spare, stale = self._take_spare(nbytes) if use_spare else (None, None)
        if stale is not None:
            with contextlib.suppress(SidecarError):
                self.release(stale)
        return spare if spare is not None else self.lease(nbytes)

    def encode_leased(
        self,
        ranges: list[FrameRange],
        *,
        width: int,
        height: int,
        pixel_format: str = "rgb24",
        on_progress: Callable[[int, int], None] | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> EncodeResult:
        """Encode frames you wrote into leases yourself (see `lease()`); options as `encode`."""
        started = time.perf_counter()
        att = self.attach()
        request = EncodeOptions(**options).request(
            att.client_token, width, height, pixel_format, ranges
        )
        return self._encode(request, {}, started, on_progress, timeout)

    def _encode(
        self,
        request: pb.EncodeRequest,
        clock: dict[str, float],
        started: float,
        on_progress: Callable[[int, int], None] | None,
        timeout: float | None,
    ) -> EncodeResult:
        builder = _core.ResultBuilder(on_progress)
        asked_at = time.monotonic()
        with _translated():
            for event in self._stub.Encode(request, timeout=timeout or self.timeout):
                builder.feed(event)
        clock["total_ms"] = (time.perf_counter() - started) * 1e3
        displaced = self._keep_spare(builder.next_lease, asked_at)
        if displaced is not None:  # concurrent requests on one client: keep one spare
            with contextlib.suppress(SidecarError):
                self.release(displaced)
        return builder.result(clock)

    # -- inspection ----------------------------------------------------------------------

    def status(self) -> Status:
        with _translated():
            resp = self._stub_here().Status(pb.StatusRequest(), timeout=self.timeout or 10.0)
        return _core.status_from_proto(resp)

    def health(self, service: str = "") -> str:
        """The daemon's health status name, e.g. "SERVING"."""
        self._stub_here()
        stub = health_pb2_grpc.HealthStub(self._channel)
        with _translated():
            resp = stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.timeout or 5.0
            )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
