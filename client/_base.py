"""State and logic the blocking and the async client share; no network calls here."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sidecar.api.v1 import sidecar_pb2 as pb

from . import _core
from ._audio import Pcm
from ._convert import Conversion
from ._cuda import CudaHost, CudaVideo
from ._errors import SidecarUnavailable
from ._slabs import SlabMap
from ._types import Attachment, FrameRange, Lease
from ._video import VideoSource, prepare_video

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncodeOptions:
    """Everything about an encode except the frames; see `SidecarClient.encode`."""

    fps: float | tuple[int, int] = 24
    path: str | None = None
    overwrite: bool = False
    container: str = "mp4"  # mp4, fmp4 (fragmented, streamed back) or webm
    codec: str = ""  # empty: the container's default (h264, or vp9 in WebM)
    crf: int | None = None
    preset: str | None = None
    gop: int | None = None
    threads: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    request_id: str = field(default_factory=_core.new_request_id)

    def request(
        self,
        token: str,
        width: int,
        height: int,
        pixel_format: str,
        ranges: list[FrameRange],
        next_lease_bytes: int = 0,
        audio: pb.AudioSpec | None = None,
        audio_data: list[pb.AudioData] | None = None,
    ) -> pb.EncodeRequest:
        return _core.encode_request(
            token=token,
            request_id=self.request_id,
            width=width,
            height=height,
            pixel_format=pixel_format,
            fps=self.fps,
            ranges=ranges,
            path=self.path,
            overwrite=self.overwrite,
            codec=self.codec,
            crf=self.crf,
            preset=self.preset,
            gop=self.gop,
            threads=self.threads,
            extra=self.extra,
            next_lease_bytes=next_lease_bytes,
            container=self.container,
            audio=audio,
            audio_data=audio_data,
        )

    def header(
        self,
        token: str,
        width: int,
        height: int,
        pixel_format: str,
        audio: pb.AudioSpec | None = None,
        audio_data: list[pb.AudioData] | None = None,
    ) -> pb.StreamRequest:
        """The first message of a stream."""
        return pb.StreamRequest(
            header=pb.StreamHeader(
                client_token=token,
                request_id=self.request_id,
                width=width,
                height=height,
                pixel_format=_core.PIXEL_FORMAT_ENUM.get(pixel_format, 0),  # type: ignore[arg-type]
                fps=_core.fps_rational(self.fps),
                codec=_core.codec_options(
                    self.codec, self.crf, self.preset, self.gop, self.threads, self.extra
                ),
                output=_core.output_spec(self.path, self.overwrite, self.container),
                audio=audio,
                audio_data=audio_data or [],
            )
        )


class BaseClient:
    """Target, slab mappings, CUDA state and fork detection."""

    def __init__(
        self,
        target: str | None,
        *,
        client_name: str,
        timeout: float | None,
        lease_wait: float,
        transport: str = "auto",
    ) -> None:
        if transport not in ("auto", "shm", "inline"):
            raise ValueError(f"transport {transport!r}: use auto, shm or inline")
        self.transport = transport
        self.inline = transport == "inline"  # frames travel inside gRPC messages
        self.target = _core.resolve_target(target)
        self.client_name = client_name or f"pid-{os.getpid()}"
        self.timeout = timeout
        self.lease_wait = lease_wait
        self._pid = os.getpid()
        self._slabs = SlabMap()
        self._cuda: CudaHost | None = None
        self._attachment: Attachment | None = None
        # A lease the daemon granted with the last result, for the next request: in the
        # steady state a request then costs one round trip instead of two.
        self._spare: tuple[Lease, float] | None = None
        self._spare_lock = threading.Lock()

    # -- fork awareness ------------------------------------------------------------------

    def _forked(self) -> bool:
        """True once in a child after fork: it must open its own channel and re-attach.

        The child keeps the inherited slab mappings (they stay valid) but not the CUDA
        registrations, which `CudaHost` forgets on its own.
        """
        if os.getpid() == self._pid:
            return False
        self._pid = os.getpid()
        self._attachment = None
        self._spare = None  # it belongs to the parent's token
        return True

    # -- attach and leases ---------------------------------------------------------------

    def _attach_request(self) -> pb.AttachRequest:
        return pb.AttachRequest(client_name=self.client_name, pid=os.getpid())

    def _attached(self, resp: pb.AttachResponse) -> Attachment:
        attachment = _core.attachment_from_proto(resp)
        if self.transport != "inline":
            try:
                self._slabs.map(attachment.instance_id, attachment.shm_dir, list(attachment.slabs))
            except SidecarUnavailable:
                if self.transport == "shm":
                    raise
                # Not on the daemon's host (or not in its IPC namespace): send frames inline.
                log.info("shared memory out of reach, sending frames inline: %s", self.target)
                self.inline = True
        self._attachment = attachment
        self._spare = None  # leases belong to the old token
        return attachment

    def _lease_request(self, att: Attachment, nbytes: int, wait: float | None) -> pb.LeaseRequest:
        wait_s = self.lease_wait if wait is None else wait
        return pb.LeaseRequest(
            client_token=att.client_token, size=nbytes, wait_ms=int(wait_s * 1e3)
        )

    def _lease_timeout(self, wait: float | None) -> float:
        return (self.lease_wait if wait is None else wait) + (self.timeout or 10.0)

    def _leased(self, resp: pb.LeaseResponse) -> Lease:
        region = self._slabs.region(resp.slab_id, resp.offset, resp.size)
        return Lease(resp.lease_id, resp.slab_id, resp.offset, resp.size, region)

    # -- the spare lease ------------------------------------------------------------------

    def _take_spare(self, nbytes: int) -> tuple[Lease | None, Lease | None]:
        """(a spare lease to use for `nbytes`, or None; a spare to give back, or None).

        A spare is used only while it is surely alive: well within its TTL, counted from
        before it was granted. Writing into an expired lease could overwrite frames that
        another client now owns.
        """
        with self._spare_lock:
            spare, self._spare = self._spare, None
        if spare is None:
            return None, None
        lease, granted_before = spare
        att = self._attachment
        fresh = att is not None and time.monotonic() - granted_before < att.lease_ttl / 2
        if fresh and lease.size >= nbytes:
            return lease, None
        return None, lease if fresh else None

    def _keep_spare(self, lease: pb.LeaseResponse | None, asked_at: float) -> Lease | None:
        """Keep the newest spare; returns one it displaced, which the caller gives back."""
        if lease is None or not lease.lease_id:
            return None
        with self._spare_lock:
            displaced, self._spare = self._spare, (self._leased(lease), asked_at)
        return displaced[0] if displaced else None

    def _drop_spare(self) -> Lease | None:
        with self._spare_lock:
            spare, self._spare = self._spare, None
        return spare[0] if spare else None

    # -- videos --------------------------------------------------------------------------

    def _prepare(
        self,
        video: Any,
        pixel_format: str | None,
        layout: str | None,
        value_range: tuple[float, float],
    ) -> VideoSource:
        return prepare_video(
            video,
            pixel_format=pixel_format,
            layout=layout,
            value_range=value_range,
            cuda=self._cuda_video,
        )

    def _cuda_video(self, view: Any, conversion: Conversion) -> CudaVideo:
        if self._cuda is None:
            self._cuda = CudaHost(self._slabs)
            self._slabs.before_unmap = self._cuda.unregister
        return self._cuda.video(view, conversion)

    def _stream_args(
        self,
        pcm: Pcm | None,
        declared: tuple[int, int] | None,
        on_chunk: Callable[[bytes], None] | None,
        on_progress: Callable[[int, int], None] | None,
        pixel_format: str | None = None,
        layout: str | None = None,
        value_range: tuple[float, float] = (0, 1),
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Keyword arguments for a stream; `encode` streams an already prepared video."""
        return {
            "pixel_format": pixel_format,
            "layout": layout,
            "value_range": value_range,
            "audio": pcm,
            "audio_format": declared,
            "on_chunk": on_chunk,
            "on_progress": on_progress,
            "timeout": timeout,
        }

    @staticmethod
    def _audio_in_lease(pcm: Pcm, lease: Lease) -> list[pb.AudioData]:
        lease.array[: pcm.nbytes] = pcm.data.reshape(-1).view("u1")
        return [pb.AudioData(range=pb.AudioRange(lease_id=lease.id, offset=0, size=pcm.nbytes))]

    @property
    def cuda_registrations(self) -> int:
        """Slabs this process has registered with CUDA (each at most once)."""
        return self._cuda.registered_slabs() if self._cuda is not None else 0
