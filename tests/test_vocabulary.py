"""The wire vocabulary has a row for every value the proto's enums name: a value added to
the proto and forgotten here fails this, not a request."""

from __future__ import annotations

import av
import numpy as np
import pytest

from client._video import frame_bytes, frame_shape
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.codec.frames import PIXEL_FORMATS as daemon_formats
from sidecar.vocabulary import (
    CONTAINER_BY_PROTO,
    FRAME_PICK_BY_PROTO,
    IMAGE_FORMAT_BY_PROTO,
    PIXEL_FORMAT_BY_PROTO,
    PIXEL_FORMATS,
    SAMPLE_FORMAT_BY_PROTO,
    Reason,
)


def _values(enum: object, unspecified_means_default: bool) -> set[int]:
    values = set(enum.values())  # type: ignore[attr-defined]
    return values if unspecified_means_default else values - {0}


def test_every_pixel_format_has_a_row() -> None:
    assert set(PIXEL_FORMAT_BY_PROTO) == _values(pb.PixelFormat, False)


def test_every_container_has_a_row() -> None:
    # CONTAINER_UNSPECIFIED is MP4, as the proto says.
    assert set(CONTAINER_BY_PROTO) == _values(pb.Container, True)


def test_every_sample_format_has_a_row() -> None:
    assert set(SAMPLE_FORMAT_BY_PROTO) == _values(pb.SampleFormat, False)


def test_every_image_format_and_frame_pick_has_a_row() -> None:
    # Their unspecified values are the defaults (JPEG; the middle frame).
    assert set(IMAGE_FORMAT_BY_PROTO) == _values(pb.ImageFormat, True)
    assert set(FRAME_PICK_BY_PROTO) == _values(pb.FramePick, True)


def test_the_daemon_encodes_every_image_format_the_wire_names() -> None:
    from sidecar.codec.images import IMAGE_FORMATS as encoders

    assert set(encoders) == {name for name in IMAGE_FORMAT_BY_PROTO.values() if name}


def test_every_error_reason_has_a_member() -> None:
    assert {r.proto for r in Reason} == _values(pb.ErrorReason, False)


@pytest.mark.parametrize("name", sorted(PIXEL_FORMATS))
def test_one_frame_shape_rule_fills_a_lease_and_reads_in_pyav(name: str) -> None:
    """The client fills a lease by the rule and the daemon hands PyAV the same array:
    the shape must be one PyAV reads as a frame of that size, with no copy."""
    fmt = PIXEL_FORMATS[name]
    width, height = 48, 32
    shape = frame_shape(name, width, height)
    assert shape == fmt.frame_shape(width, height)
    assert shape == daemon_formats[name].frame_shape(width, height)
    assert int(np.prod(shape)) == frame_bytes(name, width, height) == fmt.frame_bytes(width, height)
    frame = av.VideoFrame.from_numpy_buffer(np.zeros(shape, np.uint8), format=name)
    assert (frame.width, frame.height) == (width, height)
