"""The asyncio client: the same calls as `SidecarClient`, awaitable."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

from . import _core
from ._audio import Pcm, prepare_audio
from ._base import BaseClient, EncodeOptions
from ._errors import NotFound, SidecarError
from ._stream import AsyncVideoStream
from ._types import Attachment, EncodeResult, FrameRange, Lease, Status
from ._video import VideoSource

T = TypeVar("T")

# Host copies larger than this run on a worker thread so the event loop keeps turning.
THREAD_COPY_BYTES = 4 * 1024 * 1024


@contextlib.asynccontextmanager
async def _translated() -> AsyncIterator[None]:
    try:
        yield
    except grpc.RpcError as err:
        raise _core.error_from_rpc(err) from None


class AsyncSidecarClient(BaseClient):
    """Async twin of `SidecarClient`; see it for the arguments.

    ```python
    async with AsyncSidecarClient() as client:
        result = await client.encode(video, fps=24)
    ```
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
        if credentials is not None:  # TCP with TLS
            self._channel = grpc.aio.secure_channel(
                self.target, credentials, options=_core.CHANNEL_OPTIONS
            )
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=_core.CHANNEL_OPTIONS)
        self._stub = pb_grpc.VideoSidecarStub(self._channel)
        self._attach_lock = asyncio.Lock()

    async def __aenter__(self) -> AsyncSidecarClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        spare = self._drop_spare()
        if spare is not None:
            with contextlib.suppress(SidecarError):
                await self.release(spare)
        self._slabs.close()
        await self._channel.close()

    # -- session -------------------------------------------------------------------------

    async def attach(self, *, refresh: bool = False) -> Attachment:
        async with self._attach_lock:
            if self._attachment is None or refresh:
                async with _translated():
                    resp = await self._stub.Attach(
                        self._attach_request(), timeout=self.timeout or 10.0
                    )
                return self._attached(resp)
            return self._attachment

    async def _with_reattach(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except SidecarError as err:
            if not _core.is_not_attached(err):
                raise
            await self.attach(refresh=True)
            return await call()

    # -- leases --------------------------------------------------------------------------

    async def lease(self, nbytes: int, *, wait: float | None = None) -> Lease:
        async def call() -> Lease:
            att = await self.attach()
            async with _translated():
                resp = await self._stub.Lease(
                    self._lease_request(att, nbytes, wait), timeout=self._lease_timeout(wait)
                )
            return self._leased(resp)

        return await self._with_reattach(call)

    async def release(self, lease: Lease | str) -> None:
        lease_id = lease if isinstance(lease, str) else lease.id
        att = await self.attach()
        with contextlib.suppress(NotFound):
            async with _translated():
                await self._stub.Release(
                    pb.ReleaseRequest(client_token=att.client_token, lease_id=lease_id),
                    timeout=self.timeout or 10.0,
                )

    # -- encoding ------------------------------------------------------------------------

    async def encode(
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
        started = time.perf_counter()
        options = EncodeOptions(fps=fps, path=path, overwrite=overwrite, **codec_options)
        source = self._prepare(video, pixel_format, layout, value_range)
        pcm = prepare_audio(audio, sample_rate) if audio is not None else None
        att = await self.attach()
        plan = _core.plan_ranges(source.frames, source.frame_bytes, att)
        if self.inline or not _core.fits_in_pool(plan, source.frame_bytes, att):
            stream = AsyncVideoStream(
                self, options, **self._stream_args(pcm, None, None, on_progress, timeout=timeout)
            )
            stream.started = started
            async with stream:
                await stream.write_source(source)
            assert stream.result is not None
            return stream.result
        return await self._with_reattach(
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
    ) -> AsyncVideoStream:
        """`async with client.stream(fps=24) as s: await s.write(chunk)`; see the sync twin."""
        options = EncodeOptions(fps=fps, path=path, overwrite=overwrite, **codec_options)
        pcm = prepare_audio(audio, sample_rate) if audio is not None else None
        declared = (sample_rate, channels) if pcm is None and sample_rate and channels else None
        return AsyncVideoStream(
            self,
            options,
            **self._stream_args(
                pcm, declared, on_chunk, on_progress, pixel_format, layout, value_range
            ),
        )

    async def _encode_source(
        self,
        source: VideoSource,
        options: EncodeOptions,
        started: float,
        on_progress: Callable[[int, int], None] | None,
        timeout: float | None,
        pcm: Pcm | None = None,
    ) -> EncodeResult:
        att = await self.attach()
        plan = _core.plan_ranges(source.frames, source.frame_bytes, att)
        single = len(plan) == 1  # small requests reuse the spare lease and ask for the next
        leases: list[Lease] = []
        clock = {"lease_ms": 0.0, "copy_ms": 0.0}
        try:
            ranges = []
            for first, count in plan:
                t0 = time.perf_counter()
                lease = await self._lease_for(count * source.frame_bytes, single)
                leases.append(lease)
                t1 = time.perf_counter()
                if count * source.frame_bytes >= THREAD_COPY_BYTES:
                    await asyncio.to_thread(source.copy_into, lease.array, first, count)
                else:
                    source.copy_into(lease.array, first, count)
                clock["lease_ms"] += (t1 - t0) * 1e3
                clock["copy_ms"] += (time.perf_counter() - t1) * 1e3
                ranges.append(FrameRange(lease, count))
            t1 = time.perf_counter()
            await asyncio.to_thread(source.finish)
            clock["copy_ms"] += (time.perf_counter() - t1) * 1e3
            audio_data = None
            if pcm is not None:
                lease = await self.lease(pcm.nbytes)
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
            return await self._encode(request, clock, started, on_progress, timeout)
        except BaseException:
            for lease in leases:
                with contextlib.suppress(SidecarError):
                    await self.release(lease.id)
            raise

    async def _lease_for(self, nbytes: int, use_spare: bool) -> Lease:
        spare, stale = self._take_spare(nbytes) if use_spare else (None, None)
        if stale is not None:
            with contextlib.suppress(SidecarError):
                await self.release(stale)
        return spare if spare is not None else await self.lease(nbytes)

    async def encode_leased(
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
        started = time.perf_counter()
        att = await self.attach()
        request = EncodeOptions(**options).request(
            att.client_token, width, height, pixel_format, ranges
        )
        return await self._encode(request, {}, started, on_progress, timeout)

    async def _encode(
        self,
        request: pb.EncodeRequest,
        clock: dict[str, float],
        started: float,
        on_progress: Callable[[int, int], None] | None,
        timeout: float | None,
    ) -> EncodeResult:
        builder = _core.ResultBuilder(on_progress)
        asked_at = time.monotonic()
        async with _translated():
            async for event in self._stub.Encode(request, timeout=timeout or self.timeout):
                builder.feed(event)
        clock["total_ms"] = (time.perf_counter() - started) * 1e3
        displaced = self._keep_spare(builder.next_lease, asked_at)
        if displaced is not None:  # concurrent requests on one client: keep one spare
            with contextlib.suppress(SidecarError):
                await self.release(displaced)
        return builder.result(clock)

    # -- inspection ----------------------------------------------------------------------

    async def status(self) -> Status:
        async with _translated():
            resp = await self._stub.Status(pb.StatusRequest(), timeout=self.timeout or 10.0)
        return _core.status_from_proto(resp)

    async def health(self, service: str = "") -> str:
        stub = health_pb2_grpc.HealthStub(self._channel)
        async with _translated():
            resp = await stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.timeout or 5.0
            )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
