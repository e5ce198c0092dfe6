"""The wire vocabulary has a row for every value the proto's enums name: a value added to
the proto and forgotten here fails this, not a request."""

from __future__ import annotations

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import (
    CONTAINER_BY_PROTO,
    PIXEL_FORMAT_BY_PROTO,
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


def test_every_error_reason_has_a_member() -> None:
    assert {r.proto for r in Reason} == _values(pb.ErrorReason, False)
