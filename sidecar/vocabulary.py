"""The wire vocabulary: the names both ends use, and the tables that tie them to the proto.

Imported by the daemon and by the client, so it imports neither av nor torch. Every table
is keyed off the proto's enums; `tests/test_vocabulary.py` fails when the proto grows a
value that is missing here. Adding a pixel format means one row in `PIXEL_FORMATS` (and
teaching the encoder to read it), nothing else.
"""

from __future__ import annotations

import enum
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .api.v1 import sidecar_pb2 as pb

# Trailing-metadata key carrying an error's reason (see `Reason`), and the domain of the
# google.rpc.ErrorInfo that carries the same reason in the standard rich error model.
ERROR_KEY = "video-sidecar-error"
ERROR_DOMAIN = "video-sidecar"
ERROR_DETAILS_KEY = "grpc-status-details-bin"
# Request-metadata key of an encode RPC's deadline as the client set it, in decimal Unix
# seconds. gRPC sends only the time left, which the daemon counts from the call's arrival:
# on a loaded host that falls after the client's own deadline, and the client's cancel at
# its deadline would read as a cancel. Both ends read one host's clock.
DEADLINE_KEY = "video-sidecar-deadline"

# Said in a POOL_EXHAUSTED refusal that came because nothing in the pool moved, not
# because the request's own wait ran out (the client tells its deadline by this).
STALL_TEXT = "nothing in the pool moved"
# The largest message either end sends or accepts; frames sent inline are split below it.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# The framed socket's preamble and framing: `sidecar.api.framing`.
# `EncodeRequest.landed_count_offset`: the landed-frame count is a little-endian uint32,
# at an offset that is a multiple of its size.
LANDED_COUNT_BYTES = 4


class Reason(str, enum.Enum):
    """Why a call failed: `ErrorReason` in the proto, without its prefix."""

    INVALID_REQUEST = "INVALID_REQUEST"
    NOT_ATTACHED = "NOT_ATTACHED"
    LEASE_NOT_FOUND = "LEASE_NOT_FOUND"
    LEASE_BUSY = "LEASE_BUSY"
    POOL_EXHAUSTED = "POOL_EXHAUSTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    OUTPUT_EXISTS = "OUTPUT_EXISTS"
    OUTPUT_ERROR = "OUTPUT_ERROR"
    DISK_FULL = "DISK_FULL"
    ENCODE_FAILED = "ENCODE_FAILED"
    CANCELLED = "CANCELLED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"

    @property
    def proto(self) -> pb.ErrorReason:
        return pb.ErrorReason.Value("ERROR_REASON_" + self.value)  # type: ignore[return-value]


@dataclass(frozen=True)
class PixelFormat:
    """A pixel format as it lies in shared memory.

    `channels` is bytes per pixel of the packed formats, 1 for gray and for the 4:2:0
    formats, which travel as one (H*3/2, W) array: Y, then chroma.
    """

    name: str
    proto: int
    channels: int
    planar420: bool = False

    # The one rule for a frame's shape, kept by the client when it fills a lease and by
    # the daemon when it reads one: 4:2:0 planes as one (H*3/2, W) array, gray as (H, W),
    # the other packed formats as (H, W, C). It is also the shape PyAV reads a frame in.

    def rows(self, height: int) -> int:
        """Rows of the frame array: 4:2:0 formats are one (H*3/2, W) array."""
        return height * 3 // 2 if self.planar420 else height

    def row_bytes(self, width: int) -> int:
        return width * self.channels

    def frame_bytes(self, width: int, height: int, row_stride: int = 0) -> int:
        return self.rows(height) * (row_stride or self.row_bytes(width))

    def frame_shape(self, width: int, height: int) -> tuple[int, ...]:
        if self.channels == 1:  # gray and 4:2:0: one byte a sample, no channel axis
            return (self.rows(height), width)
        return (height, width, self.channels)

    def frame_strides(self, row_stride: int) -> tuple[int, ...]:
        if self.channels == 1:
            return (row_stride, 1)
        return (row_stride, self.channels, 1)


PIXEL_FORMATS: dict[str, PixelFormat] = {
    f.name: f
    for f in (
        PixelFormat("rgb24", pb.PIXEL_FORMAT_RGB24, 3),
        PixelFormat("bgr24", pb.PIXEL_FORMAT_BGR24, 3),
        PixelFormat("rgba", pb.PIXEL_FORMAT_RGBA, 4),
        PixelFormat("gray", pb.PIXEL_FORMAT_GRAY, 1),
        PixelFormat("yuv420p", pb.PIXEL_FORMAT_YUV420P, 1, planar420=True),
        PixelFormat("nv12", pb.PIXEL_FORMAT_NV12, 1, planar420=True),
    )
}
PIXEL_FORMAT_BY_PROTO: dict[int, PixelFormat] = {f.proto: f for f in PIXEL_FORMATS.values()}

# Containers by their wire name. The unspecified value is "" here, none named: a file
# output is written in the container its name's extension says (`file_container`), bytes
# in MP4.
DEFAULT_CONTAINER = "mp4"
CONTAINERS: dict[str, int] = {
    "mp4": pb.CONTAINER_MP4,
    "fmp4": pb.CONTAINER_FRAGMENTED_MP4,
    "webm": pb.CONTAINER_WEBM,
}
CONTAINER_BY_PROTO: dict[int, str] = {
    pb.CONTAINER_UNSPECIFIED: "",
    **{value: name for name, value in CONTAINERS.items()},
}

# Previews' image formats and frame picks by their wire names ("": the default).
IMAGE_FORMAT_BY_PROTO: dict[int, str] = {
    pb.IMAGE_FORMAT_UNSPECIFIED: "",
    pb.IMAGE_FORMAT_JPEG: "jpeg",
    pb.IMAGE_FORMAT_WEBP: "webp",
}
IMAGE_FORMATS: dict[str, int] = {
    name: value for value, name in IMAGE_FORMAT_BY_PROTO.items() if name
}
FRAME_PICK_BY_PROTO: dict[int, str] = {
    pb.FRAME_PICK_UNSPECIFIED: "",
    pb.FRAME_PICK_FIRST: "first",
    pb.FRAME_PICK_MIDDLE: "middle",
    pb.FRAME_PICK_LAST: "last",
}
FRAME_PICKS: dict[str, int] = {name: value for value, name in FRAME_PICK_BY_PROTO.items() if name}
# A preview's file beside a video `NAME.EXT`: NAME, its kind's infix, its format's suffix
# (`jobs/42.thumbnail.jpg`): the daemon's rule for a file output, and the CLI's for -o.
# The encoder profiles, fastest first (the daemon's `--profile`, a request's
# `codec.profile`); `sidecar/codec/catalogue.py` holds each codec's settings under them.
PROFILES = ("fast", "balanced", "small")
DEFAULT_PROFILE = "balanced"
# Each profile's H.264 CRF. x264's presets spend bits differently at one CRF, so a CRF
# means a size and quality only with its preset: "balanced" at 22 makes what `medium`
# makes at 25, diffusers' export_to_video at its default quality (bench/rdt.py). The
# client's `export_to_video` maps `quality` to a CRF as imageio-ffmpeg does for `medium`,
# then moves it by the profile's own (`H264_PROFILE_CRF[p] - IMAGEIO_MEDIUM_CRF`).
H264_PROFILE_CRF = {"fast": 18, "balanced": 22, "small": 25}
IMAGEIO_MEDIUM_CRF = 25  # imageio-ffmpeg's CRF at quality 5, with libx264's medium preset
# `veryfast` falls behind `medium` less on small frames and short clips (fewer references
# and motion to find), so "balanced" makes medium's size and PSNR there at a higher CRF:
# one more for frames of at most this many pixels (448x256 and 672x384, not 832x480), and
# one more for a clip of at most this many frames (a stream's length is not known: none).
SMALL_FRAME_PIXELS = 320_000
SHORT_CLIP_FRAMES = 24


def h264_profile_crf(profile: str, width: int = 0, height: int = 0, frames: int = 0) -> int:
    """The CRF `profile` encodes H.264 at, for frames of this size and a clip this long
    (0: not known)."""
    crf = H264_PROFILE_CRF[profile]
    if profile == "balanced":
        crf += 0 < width * height <= SMALL_FRAME_PIXELS
        crf += 0 < frames <= SHORT_CLIP_FRAMES
    return crf


PREVIEW_FILE_INFIX = {"thumbnail": ".thumbnail", "sprite_sheet": ".sprites"}
IMAGE_SUFFIX = {"jpeg": ".jpg", "webp": ".webp"}

# A file's extension says its container: the one a file output is written in when none is
# named (the first of its row), and those that may be named for it. One table for the
# client, the command line and the daemon; any other extension, or none, is refused.
FILE_EXTENSIONS: dict[str, tuple[str, ...]] = {
    ".mp4": ("mp4", "fmp4"),
    ".webm": ("webm",),
}
EXTENSION_OF: dict[str, str] = {
    name: ext for ext, names in FILE_EXTENSIONS.items() for name in names
}


@dataclass(frozen=True)
class Wording:
    """How a caller spells a file output and its container, for the refusals to say."""

    path: str  # the file output: "path", "-o"
    container: str  # its container: "container", "--container"
    drop: str  # how to name none: "drop container="
    overwrite: str = "overwrite=True"  # how to replace an existing file: "--overwrite"


CLIENT_WORDS = Wording("path", "container", "drop container=")
WIRE_WORDS = Wording(
    "the path", "output.container", "leave output.container unset", "output.file.overwrite"
)
CLI_WORDS = Wording("-o", "--container", "drop --container", "--overwrite")


class FileNameError(ValueError):
    """A file output whose name does not say its container, or says another one."""


def extension(path: str) -> str:
    """The extension of the file `path` names, lower case; "" for none (`jobs/x`,
    `jobs/.mp4`, `x.`)."""
    return PurePosixPath(path).suffix.lower()


def file_container(path: str, container: str = "", words: Wording = CLIENT_WORDS) -> str:
    """The container a file output at `path` is written in: the one its extension picks
    when `container` is "" (none named), else `container` once the extension agrees.

    Raises FileNameError, naming both and the fix, for a path with no extension, an
    extension no container writes, and an extension of another container than the one
    named. An unknown `container` is the caller's to refuse."""
    shown = repr(path if len(path) <= 80 else path[:77] + "...")
    ext = extension(path)
    if not ext:
        add = EXTENSION_OF.get(container, EXTENSION_OF[DEFAULT_CONTAINER])
        raise FileNameError(
            f"{words.path} {shown} has no extension, which says what plays it: "
            f"name it {path[:80] + add!r}"
        )
    suffix = PurePosixPath(path).suffix
    fits = FILE_EXTENSIONS.get(ext)
    if fits is None:
        known = " or ".join(f"{e} ({', '.join(names)})" for e, names in FILE_EXTENSIONS.items())
        raise FileNameError(
            f"{words.path} {shown} ends in {suffix}, which no container writes: name it {known}"
        )
    if not container:
        return fits[0]
    if container in CONTAINERS and container not in fits:
        raise FileNameError(
            f"{words.path} {shown} ends in {suffix}, but {words.container} is {container}: "
            f"name it {EXTENSION_OF[container]} or {words.drop}"
        )
    return container


SAMPLE_FORMATS: dict[str, int] = {"f32": pb.SAMPLE_FORMAT_F32, "s16": pb.SAMPLE_FORMAT_S16}
SAMPLE_FORMAT_BY_PROTO: dict[int, str] = {value: name for name, value in SAMPLE_FORMATS.items()}


def runtime_dir() -> Path:
    """Where a user's sockets live: $XDG_RUNTIME_DIR, else a private dir in the temp dir.
    The daemon listens there, and a client looks there, by default."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "video-sidecar"
    return Path(tempfile.gettempdir()) / f"video-sidecar-{os.getuid()}"


def default_socket() -> str:
    return str(runtime_dir() / "sidecar.sock")


__all__ = [
    "CLIENT_WORDS",
    "CONTAINERS",
    "CONTAINER_BY_PROTO",
    "DEFAULT_CONTAINER",
    "ERROR_DETAILS_KEY",
    "ERROR_DOMAIN",
    "ERROR_KEY",
    "EXTENSION_OF",
    "FILE_EXTENSIONS",
    "MAX_MESSAGE_BYTES",
    "PIXEL_FORMATS",
    "PIXEL_FORMAT_BY_PROTO",
    "SAMPLE_FORMATS",
    "SAMPLE_FORMAT_BY_PROTO",
    "STALL_TEXT",
    "WIRE_WORDS",
    "FileNameError",
    "PixelFormat",
    "Reason",
    "Wording",
    "default_socket",
    "extension",
    "file_container",
    "runtime_dir",
]
