"""The blocking client."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

from . import _core
from ._errors import NotFound, SidecarError
from ._slabs import SlabMap
from ._types import Attachment, EncodeResult, FrameRange, Lease, Status
from ._video import host_video


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except grpc.RpcError as err:
        raise _core.error_from_rpc(err) from None


class SidecarClient:
    """Talks to a video-sidecar daemon and writes frames straight into its slabs.

    ```python
    with SidecarClient() as client:
        result = client.encode(video, fps=24, path="clips/out.mp4")
    ```

    `target` is a socket path, a `unix:` URI or `host:port`; by default the daemon's
    default socket (or $VIDEO_SIDECAR_SOCKET). Slabs are mapped once, on first use, and
    mapped again only if the daemon restarts. One client may be shared by threads.
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
        self._channel = grpc.insecure_channel(self.target, options=_core.CHANNEL_OPTIONS)
        self._stub = pb_grpc.VideoSidecarStub(self._channel)
        self._slabs = SlabMap()
        self._attachment: Attachment | None = None

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._slabs.close()
        self._channel.close()

    # -- session -------------------------------------------------------------------------

    def attach(self, *, refresh: bool = False) -> Attachment:
        """Attach (once) and map the daemon's slabs."""
        if self._attachment is None or refresh:
            with _translated():
                resp = self._stub.Attach(
                    pb.AttachRequest(client_name=self.client_name, pid=os.getpid()),
                    timeout=self.timeout or 10.0,
                )
            attachment = _core.attachment_from_proto(resp)
            self._slabs.map(attachment.instance_id, attachment.shm_dir, list(attachment.slabs))
            self._attachment = attachment
        return self._attachment

    def _with_reattach(self, call: Callable[[], Any]) -> Any:
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
            wait_s = self.lease_wait if wait is None else wait
            with _translated():
                resp = self._stub.Lease(
                    pb.LeaseRequest(
                        client_token=att.client_token, size=nbytes, wait_ms=int(wait_s * 1e3)
                    ),
                    timeout=wait_s + (self.timeout or 10.0),
                )
            region = self._slabs.region(resp.slab_id, resp.offset, resp.size)
            return Lease(resp.lease_id, resp.slab_id, resp.offset, resp.size, region)

        result: Lease = self._with_reattach(call)
        return result

    def release(self, lease: Lease | str) -> None:
        """Give a lease back. Releasing one the daemon already freed is not an error."""
        lease_id = lease if isinstance(lease, str) else lease.id
        att = self.attach()
        try:
            with _translated():
                self._stub.Release(
                    pb.ReleaseRequest(client_token=att.client_token, lease_id=lease_id),
                    timeout=self.timeout or 10.0,
                )
        except NotFound:
            pass

    # -- encoding ------------------------------------------------------------------------

    def encode(
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
        """Encode `video` and return the MP4, as bytes or as a file under the output root.

        `video` is a uint8 array or CPU tensor: (T, H, W, 3) for rgb24/bgr24, (T, H, W, 4)
        for rgba, (T, H, W) for gray, (T, H*3/2, W) for yuv420p/nv12. Its frames are
        copied once, straight into leased shared memory. `path` is relative to the daemon's
        output root; without it the bytes come back in `result.data`.
        """
        started = time.perf_counter()
        source = host_video(video, pixel_format)
        request_id = request_id or _core.new_request_id()

        def attempt() -> EncodeResult:
            att = self.attach()
            plan = _core.plan_ranges(source.frames, source.frame_bytes, att)
            leases: list[Lease] = []
            clock = {"lease_ms": 0.0, "copy_ms": 0.0}
            try:
                ranges = []
                for start, count in plan:
                    t0 = time.perf_counter()
                    lease = self.lease(count * source.frame_bytes)
                    leases.append(lease)
                    t1 = time.perf_counter()
                    source.copy_into(lease.array, start, count)
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
                result = self._encode(request, clock, started, on_progress, timeout)
            except BaseException:
                # The daemon frees leases it took; ones it refused go back now.
                for lease in leases:
                    self._release_quietly(lease.id)
                raise
            return result

        result: EncodeResult = self._with_reattach(attempt)
        return result

    def encode_leased(
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
        """Encode frames you already wrote into leases yourself (see `lease()`)."""
        started = time.perf_counter()
        att = self.attach()
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
        with _translated():
            for event in self._stub.Encode(request, timeout=timeout or self.timeout):
                builder.feed(event)
        clock["total_ms"] = (time.perf_counter() - started) * 1e3
        return builder.result(clock)

    def _release_quietly(self, lease_id: str) -> None:
        with contextlib.suppress(SidecarError):  # expired or daemon gone: the TTL reclaims it
            self.release(lease_id)

    # -- inspection ----------------------------------------------------------------------

    def status(self) -> Status:
        with _translated():
            resp = self._stub.Status(pb.StatusRequest(), timeout=self.timeout or 10.0)
        return _core.status_from_proto(resp)

    def health(self, service: str = "") -> str:
        """The daemon's health status name, e.g. "SERVING"."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        with _translated():
            resp = stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.timeout or 5.0
            )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
