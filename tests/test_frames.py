from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from sidecar.codec.frames import (
    FrameRangeSpec,
    Limits,
    borrow_frames,
    check_geometry,
    place_range,
    place_ranges,
)
from sidecar.errors import InvalidRequest, OutOfRange
from sidecar.pool.leases import Lease

LIMITS = Limits(max_frames=100, max_width=4096, max_height=4096, max_request_bytes=1 << 30)


def lease(size: int, offset: int = 0) -> Lease:
    return Lease("l", "c", 0, offset, size, 0.0)


def test_geometry_ok() -> None:
    g = check_geometry(64, 48, "rgb24", (24000, 1001), LIMITS)
    assert g.fps == Fraction(24000, 1001) and g.layout.frame_bytes(64, 48) == 64 * 48 * 3


@pytest.mark.parametrize(
    ("args", "error", "field"),
    [
        ((0, 48, "rgb24", (24, 1)), InvalidRequest, "width"),
        ((64, -2, "rgb24", (24, 1)), InvalidRequest, "height"),
        ((65, 48, "yuv420p", (24, 1)), InvalidRequest, "width"),
        ((64, 47, "rgb24", (24, 1)), InvalidRequest, "height"),
        ((64, 48, "yuv444p", (24, 1)), InvalidRequest, "pixel_format"),
        ((64, 48, "rgb24", (24, 0)), InvalidRequest, "fps"),
        ((64, 48, "rgb24", (-24, 1)), InvalidRequest, "fps"),
        ((64, 48, "rgb24", (100000, 1)), InvalidRequest, "fps"),
        ((8192, 48, "rgb24", (24, 1)), OutOfRange, "width"),
    ],
)
def test_geometry_rejects(args: tuple, error: type, field: str) -> None:
    with pytest.raises(error, match=field):
        check_geometry(*args, LIMITS)


def test_place_range_defaults_to_tight_packing() -> None:
    g = check_geometry(64, 48, "rgb24", (24, 1), LIMITS)
    placed = place_range(g, FrameRangeSpec("l", 0, 4), lease(4 * 9216, offset=8192), "r")
    assert (placed.start, placed.row_stride, placed.frame_stride) == (8192, 192, 9216)


def test_place_range_bounds_are_exact() -> None:
    g = check_geometry(64, 48, "rgb24", (24, 1), LIMITS)
    frame = 64 * 48 * 3
    place_range(g, FrameRangeSpec("l", 100, 2, 0, frame + 7), lease(100 + 2 * frame + 7), "r")
    with pytest.raises(InvalidRequest, match="frame_count"):
        place_range(g, FrameRangeSpec("l", 101, 2, 0, frame + 7), lease(100 + 2 * frame + 7), "r")


def test_overflowing_values_are_named() -> None:
    g = check_geometry(64, 48, "rgb24", (24, 1), LIMITS)
    for field, spec in [
        ("offset", FrameRangeSpec("l", 2**63 - 1, 1)),
        ("frame_count", FrameRangeSpec("l", 0, 2**62)),
        ("row_stride", FrameRangeSpec("l", 0, 1, 2**60)),
        ("frame_stride", FrameRangeSpec("l", 0, 2, 0, -9216)),
    ]:
        with pytest.raises(InvalidRequest, match=field):
            place_range(g, spec, lease(1 << 20), "r")


def test_limits_over_all_ranges() -> None:
    g = check_geometry(64, 48, "rgb24", (24, 1), LIMITS)
    leases = {"l": lease(1 << 30)}
    with pytest.raises(OutOfRange, match="frames"):
        place_ranges(g, [FrameRangeSpec("l", 0, 60)] * 2, leases, LIMITS)
    with pytest.raises(InvalidRequest, match="ranges"):
        place_ranges(g, [], leases, LIMITS)


def test_borrowed_views_share_memory_with_padding() -> None:
    g = check_geometry(4, 2, "rgb24", (24, 1), LIMITS)
    slab = np.zeros(4096, np.uint8)
    placed = place_range(g, FrameRangeSpec("l", 16, 3, 16, 64), lease(1024, offset=512), "r")
    view = borrow_frames(slab, g, placed)
    assert view.shape == (3, 2, 4, 3) and view.strides == (64, 16, 3, 1)
    view[1, 1, 0, 0] = 7
    assert slab[512 + 16 + 64 + 16] == 7  # same bytes, no copy
    assert np.shares_memory(view, slab)


def test_planar_420_layout() -> None:
    g = check_geometry(8, 4, "yuv420p", (24, 1), LIMITS)
    placed = place_range(g, FrameRangeSpec("l", 0, 2), lease(96), "r")
    view = borrow_frames(np.zeros(4096, np.uint8), g, placed)
    assert view.shape == (2, 6, 8)
    with pytest.raises(InvalidRequest, match="row_stride"):
        place_range(g, FrameRangeSpec("l", 0, 1, 9), lease(4096), "r")
