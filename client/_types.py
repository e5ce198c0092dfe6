"""Plain result types the client hands back."""

from __future__ import annotations

import bisect
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
    framed_reply_max_bytes: int = 0  # the framed socket's largest reply (0: none served)

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
    previews_ms: float = 0.0  # scaling the previews' frames, encoding the images
    daemon_ms: float = 0.0  # everything inside the daemon
    # From the start of the first copy until every frame is in the leases, lease waits in
    # between included; for a stream, summed over its writes. 0 for `encode_leased`.
    transfer_ms: float = 0.0
    total_ms: float = 0.0  # the whole call, as the caller saw it

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Preview:
    """A still image made beside the video: a thumbnail or a sprite sheet.

    For a bytes output `data` holds the image; for a file output `path` is where it was
    written, beside the video. `frames` and `times_s` name the frames it shows (a
    thumbnail's one). A sprite sheet's tile i lies at column i % columns, row
    i // columns (`tile_box`) and shows frame `frames[i]`, at `times_s[i]` seconds.
    """

    kind: str  # "thumbnail" or "sprite_sheet"
    mime_type: str  # "image/jpeg" or "image/webp"
    size_bytes: int
    width: int
    height: int
    data: bytes | None = None
    path: str = ""
    tile_width: int = 0
    tile_height: int = 0
    columns: int = 0
    rows: int = 0
    frames: tuple[int, ...] = ()
    times_s: tuple[float, ...] = ()

    def __repr__(self) -> str:
        """Size and place; never the bytes."""
        place = f"path={self.path!r}" if self.path else f"data=<{self.size_bytes} bytes>"
        if self.kind == "sprite_sheet":
            shows = (
                f"{len(self.frames)} tiles of {self.tile_width}x{self.tile_height}, "
                f"{self.columns} by {self.rows}"
            )
        else:
            shows = f"frame {self.frames[0]}" if self.frames else "no frame"
        return (
            f"Preview({self.kind}, {self.mime_type}, {self.width}x{self.height}, {place}, "
            f"size={self.size_bytes} bytes, {shows})"
        )

    def tile_at(self, time_s: float) -> int:
        """The sprite sheet's tile showing the video at `time_s` seconds: the last one
        taken at or before it (the first, before it). ValueError for a thumbnail."""
        if self.kind != "sprite_sheet":
            raise ValueError(f"a {self.kind} has no tiles")
        return max(0, bisect.bisect_right(self.times_s, time_s) - 1)

    def tile_box(self, tile: int) -> tuple[int, int, int, int]:
        """Where tile `tile` lies in the sheet: (x, y, width, height) in pixels, as a
        WebVTT thumbnail track's `#xywh=` says it."""
        if not 0 <= tile < len(self.frames) or self.kind != "sprite_sheet":
            raise IndexError(f"no tile {tile} in this {self.kind} of {len(self.frames)}")
        row, column = divmod(tile, self.columns)
        return column * self.tile_width, row * self.tile_height, self.tile_width, self.tile_height


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
    previews: tuple[Preview, ...] = ()  # those asked for, the thumbnail first

    @property
    def thumbnail(self) -> Preview | None:
        return self._preview("thumbnail")

    @property
    def sprite_sheet(self) -> Preview | None:
        return self._preview("sprite_sheet")

    def _preview(self, kind: str) -> Preview | None:
        return next((p for p in self.previews if p.kind == kind), None)

    def __repr__(self) -> str:
        """Sizes, place and timings; never the bytes (an MP4 is megabytes of them)."""
        data = "None" if self.data is None else f"<{len(self.data)} bytes>"
        audio = f", audio_samples={self.audio_samples}" if self.audio_samples else ""
        shown = ", ".join(f"{p.kind} <{p.size_bytes} bytes>" for p in self.previews)
        previews = f", previews=[{shown}]" if shown else ""
        return (
            f"EncodeResult(path={self.path!r}, data={data}, size={self.size_bytes} bytes, "
            f"container={self.container!r}, codec={self.codec!r}, frames={self.frames}, "
            f"{self.width}x{self.height}, duration={self.duration:g}s{audio}{previews}, "
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
    # Clients holding a lease, with an encode in flight or waiting for room, or that
    # called within the last lease TTL.
    live_clients: int
    counters: dict[str, Any]
    encoder_processes: int = 0  # up and ready for work
    # Lease requests waiting for room, first served first: client, bytes, regions, waited_s.
    lease_waiters: list[dict[str, Any]] = field(default_factory=list)
    clients_attached: int = 0  # tokens the daemon knows, live or not
    output_dir: str = ""  # where the daemon writes file outputs
    shm_dir: str = ""  # where its slabs are, their names beginning with shm_prefix
    shm_prefix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
