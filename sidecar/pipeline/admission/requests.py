"""Encode requests and their events, in domain terms (what the servicer builds from and
turns into protobuf)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...codec.audio_format import AudioFormat
from ...codec.catalogue import CodecSpec
from ...codec.frames import FrameRangeSpec
from ...events import Chunk, Progress
from ...pool.leases import Lease


@dataclass(frozen=True)
class AudioRangeSpec:
    """Audio bytes [offset, offset + size) of a lease."""

    lease_id: str
    offset: int
    size: int


AudioPiece = AudioRangeSpec | bytes


@dataclass(frozen=True)
class VideoRequest:
    width: int
    height: int
    pixel_format: str
    fps: tuple[int, int]
    ranges: tuple[FrameRangeSpec, ...] = ()


@dataclass(frozen=True)
class OutputRequest:
    path: str | None = None  # relative to the output root; None means bytes
    overwrite: bool = False
    container: str = "mp4"  # mp4, fmp4 or webm


@dataclass(frozen=True)
class AudioRequest:
    format: AudioFormat | None = None  # None: no audio track
    data: tuple[AudioPiece, ...] = ()  # the samples, in order; a stream may send them last


@dataclass(frozen=True)
class ThumbnailRequest:
    """One frame, picked by `pick` ("first", "middle", "last"; "": the default), `index`
    or `time_s`; the other fields as the wire's `Thumbnail` (0 or "": the default)."""

    pick: str = ""
    index: int | None = None
    time_s: float | None = None
    max_width: int = 0
    max_height: int = 0
    format: str = ""
    quality: int = 0


@dataclass(frozen=True)
class SpriteSheetRequest:
    """As the wire's `SpriteSheet` (0 or "": the default)."""

    tiles: int = 0
    interval_s: float = 0.0
    tile_width: int = 0
    columns: int = 0
    format: str = ""
    quality: int = 0


@dataclass(frozen=True)
class PreviewRequest:
    """Still images made beside the video from the same frames (see previews)."""

    thumbnail: ThumbnailRequest | None = None
    sprite_sheet: SpriteSheetRequest | None = None


@dataclass(frozen=True)
class OneReply:
    """The result is the only reply: nothing goes back before it, and the output travels
    inside it up to `data_max` bytes. The transport sets both: it knows its message limit,
    and whether a lease is the quicker way back for a large output."""

    data_max: int
    # Outputs past this go back in a lease when one has room, though the reply could carry
    # them (0: none does; all up to `data_max` travel inside).
    lease_past: int = 0

    @property
    def inline_max(self) -> int:
        """The largest output that travels inside the reply while a lease could hold it."""
        return self.lease_past or self.data_max


@dataclass(frozen=True)
class LiveRequest:
    """A live LL-HLS/CMAF package beside the output (see output/live); 0: the default."""

    folder: str
    segment_s: float = 0.0
    part_s: float = 0.0
    overwrite: bool = False


@dataclass(frozen=True)
class EncodeSpec:
    """A whole-video encode, or the header of a stream (then `video.ranges` is empty)."""

    client_token: str
    request_id: str
    video: VideoRequest
    codec: CodecSpec = field(default_factory=CodecSpec)
    output: OutputRequest = field(default_factory=OutputRequest)
    audio: AudioRequest = field(default_factory=AudioRequest)
    next_lease_bytes: int = 0  # lease this much for the client's next request when done
    # Set when the result is the only reply (see `OneReply`); None: replies may be many.
    one_reply: OneReply | None = None
    landed_count_offset: int = 0  # frames still landing, counted there (see landing)
    previews: PreviewRequest = field(default_factory=PreviewRequest)
    live: LiveRequest | None = None


@dataclass(frozen=True)
class LeaseChunk:
    """Stream chunk: frames in a lease."""

    range: FrameRangeSpec


@dataclass(frozen=True)
class InlineChunk:
    """Stream chunk: frame bytes sent inline."""

    data: bytes


@dataclass(frozen=True)
class StreamEnd:
    audio_data: tuple[AudioPiece, ...] = ()
    next_lease_bytes: int = 0


StreamMessage = LeaseChunk | InlineChunk | StreamEnd


@dataclass
class PreviewImage:
    """A preview as made: its bytes, then where they went (a file, or a place in the
    output's lease); a sprite sheet's layout too."""

    kind: str  # "thumbnail" or "sprite_sheet"
    mime_type: str
    suffix: str  # its file's extension
    data: bytes
    width: int
    height: int
    frames: tuple[int, ...]  # the frame each tile shows (the thumbnail's: one)
    times_s: tuple[float, ...]
    tile_width: int = 0
    tile_height: int = 0
    columns: int = 0
    rows: int = 0
    path: str = ""  # written here, a file output's
    lease_offset: int | None = None  # or at this offset in the output's lease

    @property
    def size_bytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class Result:
    request_id: str
    path: str
    size_bytes: int
    frames: int
    duration_s: float
    codec: str
    container: str
    width: int
    height: int
    audio_samples: int
    timings_ms: dict[str, float]
    next_lease: Lease | None = None
    data: bytes = b""  # the whole output, when it travels in the result
    data_lease: Lease | None = None  # or the lease it is in, now the client's
    previews: tuple[PreviewImage, ...] = ()
    # Work for once the client has its answer (opening the next encoder for spaced-out
    # traffic, which holds the GIL for milliseconds).
    after: Callable[[], None] | None = None


Event = Progress | Chunk | Result
