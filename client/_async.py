"""The asyncio client: the same calls as `SidecarClient`, awaitable."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

from . import _core
from ._errors import NotFound, SidecarError
from ._slabs import SlabMap
from ._types import Attachment, EncodeResult, FrameRange, Lease, Status
from ._video import VideoSource, host_video

T = TypeVar("T")

# Copies larger than this run on a worker thread so the event loop keeps turning.
THREAD_COPY_BYTES = 4 * 1024 * 1024


@asynccontextmanager
async def _translated() -> AsyncIterator[None]:
    try:
        yield
    except grpc.RpcError as err:
        raise _core.error_from_rpc(err) from None


class AsyncSidecarClient:
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
    ) -> None:
        self.target = _core.resolve_target(target)
        self.client_name = client_name or f"pid-{os.getpid()}"
        self.timeout = timeout
        self.lease_wait = lease_wait
        self._channel = grpc.aio.insecure_channel(self.target, options=_core.CHANNEL_OPTIONS)
        self._stub = pb_grpc.VideoSidecarStub(self._channel)
        self._slabs = SlabMap()
        self._attachment: Attachment | None = None
        self._attach_lock = asyncio.Lock()

    async def __aenter__(self) -> AsyncSidecarClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._slabs.close()
        await self._channel.close()

    # -- session -------------------------------------------------------------------------

    async def attach(self, *, refresh: bool = False) -> Attachment:
        async with self._attach_lock:
            if self._attachment is None or refresh:
                async with _translated():
                    resp = await self._stub.Attach(
                        pb.AttachRequest(client_name=self.client_name, pid=os.getpid()),
                        timeout=self.timeout or 10.0,
                    )
                attachment = _core.attachment_from_proto(resp)
                self._slabs.map(attachment.instance_id, attachment.shm_dir, list(attachment.slabs))
                self._attachment = attachment
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
            wait_s = self.lease_wait if wait is None else wait
            async with _translated():
                resp = await self._stub.Lease(
                    pb.LeaseRequest(
                        client_token=att.client_token, size=nbytes, wait_ms=int(wait_s * 1e3)
                    ),
                    timeout=wait_s + (self.timeout or 10.0),
                )
            region = self._slabs.region(resp.slab_id, resp.offset, resp.size)
            return Lease(resp.lease_id, resp.slab_id, resp.offset, resp.size, region)

        return await self._with_reattach(call)

    async def release(self, lease: Lease | str) -> None:
        lease_id = lease if isinstance(lease, str) else lease.id
        att = await self.attach()
        try:
            async with _translated():
                await self._stub.Release(
                    pb.ReleaseRequest(client_token=att.client_token, lease_id=lease_id),
                    timeout=self.timeout or 10.0,
                )
        except NotFound:
            pass

    # -- encoding ------------------------------------------------------------------------

    async def encode(
        self,
        video: Any,
        fps: float | tuple[int, int] = 24,
        *,
        path: str | None = None,
        overwrite: bool = False,
        pixel_format: str = "rgb24",
        codec: str = "h264",
        crf: int | None = None,
        preset: str | None = None,
        gop: int | None = None,
        threads: int = 0,
        extra: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        timeout: float | None = None,
    ) -> EncodeResult:
        started = time.perf_counter()
        source = host_video(video, pixel_format)
        request_id = request_id or _core.new_request_id()

        async def attempt() -> EncodeResult:
            att = await self.attach()
            plan = _core.plan_ranges(source.frames, source.frame_bytes, att)
            leases: list[Lease] = []
            clock = {"lease_ms": 0.0, "copy_ms": 0.0}
            try:
                ranges = []
                for start, count in plan:
                    t0 = time.perf_counter()
                    lease = await self.lease(count * source.frame_bytes)
                    leases.append(lease)
                    t1 = time.perf_counter()
                    await _copy(source, lease, start, count)
                    clock["lease_ms"] += (t1 - t0) * 1e3
                    clock["copy_ms"] += (time.perf_counter() - t1) * 1e3
                    ranges.append(FrameRange(lease, count))
                request = _core.encode_request(
                    token=att.client_token,
                    request_id=request_id,
                    width=source.width,
                    height=source.height,
                    pixel_format=source.pixel_format,
                    fps=fps,
                    ranges=ranges,
                    path=path,
                    overwrite=overwrite,
                    codec=codec,
                    crf=crf,
                    preset=preset,
                    gop=gop,
                    threads=threads,
                    extra=extra,
                )
                result = await self._encode(request, clock, started, on_progress, timeout)
            except BaseException:
                for lease in leases:
                    await self._release_quietly(lease.id)
                raise
            return result

        return await self._with_reattach(attempt)

    async def encode_leased(
        self,
        ranges: list[FrameRange],
        *,
        width: int,
        height: int,
        pixel_format: str = "rgb24",
        fps: float | tuple[int, int] = 24,
        path: str | None = None,
        overwrite: bool = False,
        codec: str = "h264",
        crf: int | None = None,
        preset: str | None = None,
        gop: int | None = None,
        threads: int = 0,
        extra: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        timeout: float | None = None,
    ) -> EncodeResult:
        started = time.perf_counter()
        att = await self.attach()
        request = _core.encode_request(
            token=att.client_token,
            request_id=request_id or _core.new_request_id(),
            width=width,
            height=height,
            pixel_format=pixel_format,
            fps=fps,
            ranges=ranges,
            path=path,
            overwrite=overwrite,
            codec=codec,
            crf=crf,
            preset=preset,
            gop=gop,
            threads=threads,
            extra=extra,
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
        async with _translated():
            async for event in self._stub.Encode(request, timeout=timeout or self.timeout):
                builder.feed(event)
        clock["total_ms"] = (time.perf_counter() - started) * 1e3
        return builder.result(clock)

    async def _release_quietly(self, lease_id: str) -> None:
        with suppress(SidecarError):
            await self.release(lease_id)

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


async def _copy(source: VideoSource, lease: Lease, start: int, count: int) -> None:
    if count * source.frame_bytes >= THREAD_COPY_BYTES:
        await asyncio.to_thread(source.copy_into, lease.array, start, count)
    else:
        source.copy_into(lease.array, start, count)
