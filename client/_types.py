"""Plain result types the client hands back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ._slabs import SlabInfo


@dataclass(frozen=True)
class Attachment:
    """What Attach returned: the slabs this client has mapped and the daemon's limits."""

    client_token: str
    instance_id: str
    shm_dir: str
    slabs: tuple[SlabInfo, ...]
    max_lease_bytes: int
    alignment: int
    max_frames: int
    max_width: int
    max_height: int
    lease_ttl: float
    max_lease_wait: float
    server_version: str

    @property
    def pool_bytes(self) -> int:
        return sum(s.size for s in self.slabs)


@dataclass
class Lease:
    """A region of a slab this client may write; `array` is a flat writable uint8 view."""

    id: str
    slab_id: int
    offset: int
    size: int
    array: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class FrameRange:
    """Frames you wrote into a lease yourself, for `encode_leased`.

    Strides are in bytes; 0 means tightly packed. `offset` is from the start of the lease.
    """

    lease: Lease | str
    frame_count: int
    offset: int = 0
    row_stride: int = 0
    frame_stride: int = 0

    @property
    def lease_id(self) -> str:
        return self.lease if isinstance(self.lease, str) else self.lease.id


@dataclass(frozen=True)
class Timings:
    """Milliseconds per stage. Client stages first, then the daemon's."""

    lease_ms: float = 0.0  # waiting for and granting leases
    copy_ms: float = 0.0  # writing frames into the leases (converting on the way)
    queue_ms: float = 0.0  # waiting for an encoder slot in the daemon
    validate_ms: float = 0.0  # the daemon checking the request against its leases
    open_ms: float = 0.0  # opening the encoder, or waiting for one opened ahead of time
    convert_ms: float = 0.0  # colour conversion to the codec's pixel format
    encode_ms: float = 0.0  # the encoder itself
    mux_ms: float = 0.0  # writing packets into the container
    finalize_ms: float = 0.0  # finishing the container, placing the file
    daemon_ms: float = 0.0  # everything inside the daemon
    # From the start of the first copy until every frame is in the leases, lease waits in
    # between included; for a stream, summed over its writes. 0 for `encode_leased`.
    transfer_ms: float = 0.0
    total_ms: float = 0.0  # the whole call, as the caller saw it

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class EncodeResult:
    """The encoded video: `data` for bytes outputs, `path` for file outputs."""

    data: bytes | None
    path: str | None
    frames: int
    duration: float
    width: int
    height: int
    codec: str
    container: str
    size_bytes: int
    request_id: str
    timings: Timings
    audio_samples: int = 0  # audio samples muxed, after trimming or padding to the video

    def __repr__(self) -> str:
        """Sizes, place and timings; never the bytes (an MP4 is megabytes of them)."""
        data = "None" if self.data is None else f"<{len(self.data)} bytes>"
        audio = f", audio_samples={self.audio_samples}" if self.audio_samples else ""
        return (
            f"EncodeResult(path={self.path!r}, data={data}, size={self.size_bytes} bytes, "
            f"container={self.container!r}, codec={self.codec!r}, frames={self.frames}, "
            f"{self.width}x{self.height}, duration={self.duration:g}s{audio}, "
            f"request_id={self.request_id!r}, total_ms={self.timings.total_ms:.1f}, "
            f"daemon_ms={self.timings.daemon_ms:.1f})"
        )


@dataclass(frozen=True)
class Status:
    """A snapshot of the daemon: pool occupancy, encodes and counters."""

    server_version: str
    instance_id: str
    uptime_s: float
    pool: dict[str, int]
    active_encodes: int
    queued_encodes: int
    max_concurrent_encodes: int
    clients: int
    counters: dict[str, Any]
    encoder_processes: int = 0  # up and ready for work
    # Lease requests waiting for room, first served first: client, bytes, regions, waited_s.
    lease_waiters: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
