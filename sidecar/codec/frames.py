"""Raw frame layouts in shared memory: pixel formats, descriptor checks, borrowed views.

Every descriptor is checked against its lease here before any memory is touched. All
arithmetic is on Python ints, so nothing overflows; each field is also bounded so a
hostile value is reported by name instead of producing a huge number.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .. import vocabulary
from ..errors import InvalidRequest, OutOfRange
from ..pool.leases import Lease

# No byte count in a request can be larger than this (256 TiB).
MAX_BYTES = 1 << 48


# How a frame lies in memory, as PyAV's `from_numpy_buffer` wants it: the wire
# vocabulary's formats, whose shape rule the client keeps too.
PixelLayout = vocabulary.PixelFormat
PIXEL_FORMATS: dict[str, PixelLayout] = vocabulary.PIXEL_FORMATS


@dataclass(frozen=True)
class Geometry:
    width: int
    height: int
    layout: PixelLayout
    fps: Fraction


@dataclass(frozen=True)
class FrameRangeSpec:
    """A client's claim: `frame_count` frames in lease `lease_id`, as sent on the wire."""

    lease_id: str
    offset: int
    frame_count: int
    row_stride: int = 0
    frame_stride: int = 0


@dataclass(frozen=True)
class PlacedRange:
    """A range checked against its lease; `start` is the byte offset inside the slab."""

    lease: Lease
    start: int
    frame_count: int
    row_stride: int
    frame_stride: int

    def end(self, geometry: Geometry) -> int:
        """The byte past the last frame's last row, inside the slab."""
        frame_bytes = geometry.layout.rows(geometry.height) * self.row_stride
        return self.start + (self.frame_count - 1) * self.frame_stride + frame_bytes


@dataclass(frozen=True)
class Limits:
    max_frames: int
    max_width: int
    max_height: int
    max_request_bytes: int


def check_geometry(
    width: int,
    height: int,
    pixel_format: str,
    fps: Fraction | tuple[int, int],
    limits: Limits,
) -> Geometry:
    """Validate frame size, pixel format and rate. Every output is 4:2:0: even sizes."""
    layout = PIXEL_FORMATS.get(pixel_format)
    if layout is None:
        raise InvalidRequest(
            "video.pixel_format",
            f"unknown pixel format {pixel_format[:32]!r}; use one of {', '.join(PIXEL_FORMATS)}",
        )
    for name, value, limit in (
        ("video.width", width, limits.max_width),
        ("video.height", height, limits.max_height),
    ):
        if value <= 0:
            raise InvalidRequest(name, f"must be positive, got {value}")
        if value > limit:
            raise OutOfRange(f"{name}: {value} exceeds the daemon's limit of {limit}")
    if width % 2 or height % 2:
        raise InvalidRequest(
            "video.width" if width % 2 else "video.height",
            f"{width}x{height}: 4:2:0 video needs an even width and height",
        )
    num, den = (fps.numerator, fps.denominator) if isinstance(fps, Fraction) else fps
    if num <= 0 or den <= 0 or num >= 1 << 31 or den >= 1 << 31:
        raise InvalidRequest("video.fps", f"must be a positive rational, got {num}/{den}")
    rate = Fraction(num, den)
    if rate > 1000 or rate < Fraction(1, 1000):
        raise InvalidRequest("video.fps", f"{float(rate):g} fps is outside 0.001..1000")
    return Geometry(width, height, layout, rate)


def place_ranges(
    geometry: Geometry,
    specs: list[FrameRangeSpec],
    leases: dict[str, Lease],
    limits: Limits,
) -> list[PlacedRange]:
    """Check every range against its lease; returns where each range's frames lie."""
    if not specs:
        raise InvalidRequest("video.ranges", "at least one frame range is required")
    placed = []
    total_frames = 0
    total_bytes = 0
    for index, spec in enumerate(specs):
        item = place_range(geometry, spec, leases[spec.lease_id], f"video.ranges[{index}]")
        total_frames += item.frame_count
        total_bytes += item.frame_count * geometry.layout.frame_bytes(
            geometry.width, geometry.height
        )
        placed.append(item)
    if total_frames > limits.max_frames:
        raise OutOfRange(f"{total_frames} frames exceed the daemon's limit of {limits.max_frames}")
    if total_bytes > limits.max_request_bytes:
        raise OutOfRange(
            f"{total_bytes} raw bytes exceed the daemon's limit of {limits.max_request_bytes}"
        )
    return placed


def place_range(geometry: Geometry, spec: FrameRangeSpec, lease: Lease, where: str) -> PlacedRange:
    layout, width, height = geometry.layout, geometry.width, geometry.height
    for name in ("offset", "frame_count", "row_stride", "frame_stride"):
        value = getattr(spec, name)
        if value < 0:
            raise InvalidRequest(f"{where}.{name}", f"must not be negative, got {value}")
        if value > MAX_BYTES:
            raise InvalidRequest(f"{where}.{name}", f"{value} is implausibly large")
    if spec.frame_count == 0:
        raise InvalidRequest(f"{where}.frame_count", "must be at least 1")

    min_row = layout.row_bytes(width)
    row_stride = spec.row_stride or min_row
    if row_stride < min_row:
        raise InvalidRequest(
            f"{where}.row_stride",
            f"{row_stride} is less than a {layout.name} row of width {width} ({min_row} bytes)",
        )
    if layout.planar420 and row_stride % 2:
        raise InvalidRequest(f"{where}.row_stride", f"{layout.name} needs an even row stride")
    frame_bytes = layout.rows(height) * row_stride
    frame_stride = spec.frame_stride or frame_bytes
    if frame_stride < frame_bytes:
        raise InvalidRequest(
            f"{where}.frame_stride",
            f"{frame_stride} is less than one frame ({frame_bytes} bytes); frames would overlap",
        )
    placed = PlacedRange(
        lease, lease.offset + spec.offset, spec.frame_count, row_stride, frame_stride
    )
    end = placed.end(geometry) - lease.offset
    if end > lease.size:
        raise InvalidRequest(
            f"{where}.frame_count",
            f"{spec.frame_count} frames of {frame_bytes} bytes at offset {spec.offset} with "
            f"stride {frame_stride} end at byte {end}, past the lease's {lease.size} bytes",
        )
    return placed


def borrow_frames(slab: np.ndarray, geometry: Geometry, placed: PlacedRange) -> np.ndarray:
    """A (frames, ...) view of a range inside a slab; no bytes are copied.

    numpy re-checks that the view lies inside the slab buffer, a second line of defence
    behind `place_range`.
    """
    layout = geometry.layout
    shape = (placed.frame_count, *layout.frame_shape(geometry.width, geometry.height))
    strides = (placed.frame_stride, *layout.frame_strides(placed.row_stride))
    view: np.ndarray = np.ndarray(
        shape, dtype=np.uint8, buffer=slab, offset=placed.start, strides=strides
    )
    return view
