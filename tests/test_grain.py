"""Grainy videos get the profile's grain settings: the measure, and the daemon's choice as
x264 itself reports it in the stream it wrote."""

from __future__ import annotations

import re

import av
import numpy as np
import pytest

from client.patterns import moving_pattern
from sidecar.codec.catalogue import CodecSpec
from sidecar.codec.grain import GRAINY_SIGMA, detail_plane, is_grainy, noise_sigma
from sidecar.vocabulary import PIXEL_FORMATS

from .helpers import Daemon

H, W = 96, 128


def grainy(frames: int, sigma: float = 4.0) -> np.ndarray:
    return moving_pattern(frames, H, W, noise=sigma)


def settings(data: bytes) -> str:
    """x264 writes the settings it encoded with into the stream as an SEI message."""
    found = re.search(rb"options: ([ -~]+)", data)
    assert found is not None
    return found.group(1).decode()


@pytest.mark.parametrize("sigma", [2.5, 4.0, 8.0])
def test_the_measure_reads_the_grain_it_was_given(sigma: float) -> None:
    frame = grainy(1, sigma)[0]
    measured = noise_sigma(detail_plane(frame, PIXEL_FORMATS["rgb24"], H))
    assert measured == pytest.approx(sigma, rel=0.25)


def test_smooth_frames_and_edges_are_not_grain() -> None:
    assert not is_grainy(moving_pattern(1, H, W)[0], PIXEL_FORMATS["rgb24"], H)
    # Hard edges all over (a checkerboard of 8-pixel squares): detail, not grain.
    rows, cols = np.indices((H, W)) // 8
    board = ((rows + cols) % 2 * 255).astype(np.uint8)
    checks = np.repeat(board[..., None], 3, axis=2)
    assert noise_sigma(detail_plane(checks, PIXEL_FORMATS["rgb24"], H)) < GRAINY_SIGMA
    assert noise_sigma(np.zeros((2, 2), np.uint8)) == 0.0  # too small to tell


@pytest.mark.parametrize(("height", "width"), [(256, 448), (768, 1344), (1080, 1920)])
def test_the_measure_reads_a_bounded_sample_at_any_size(
    height: int, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It runs in line before every encode: a large frame is read on fewer rows, and
    still tells grain from a smooth picture."""
    from sidecar.codec import grain

    sampled: list[int] = []
    median = np.median
    monkeypatch.setattr(grain.np, "median", lambda a: sampled.append(a.size) or median(a))
    noisy, smooth = (
        moving_pattern(1, height, width, noise=4.0)[0],
        moving_pattern(1, height, width)[0],
    )
    rgb = PIXEL_FORMATS["rgb24"]
    assert noise_sigma(detail_plane(noisy, rgb, height)) == pytest.approx(4.0, rel=0.25)
    assert not is_grainy(smooth, rgb, height)
    assert all(grain.SAMPLE_PIXELS * 0.8 <= n <= grain.SAMPLE_PIXELS * 1.4 for n in sampled)


@pytest.mark.parametrize("name", ["yuv420p", "nv12", "gray", "bgr24", "rgba"])
def test_every_pixel_format_is_measured(name: str) -> None:
    frame = grainy(1)[0]
    fmt = PIXEL_FORMATS[name]
    if fmt.planar420 or name == "gray":
        target = {"nv12": "nv12", "gray": "gray"}.get(name, "yuv420p")
        held = av.VideoFrame.from_ndarray(frame, format="rgb24").reformat(format=target)
        frame = held.to_ndarray()
    elif name == "bgr24":
        frame = np.ascontiguousarray(frame[..., ::-1])
    elif name == "rgba":
        frame = np.dstack([frame, np.full((H, W), 255, np.uint8)])
    assert is_grainy(frame, fmt, H)


def test_grain_settings_fill_in_only_what_the_request_left() -> None:
    profile = CodecSpec().resolve()
    assert profile.options["aq-strength"] == "0.7"
    assert profile.measured(True).options["aq-strength"] == "1.0"
    assert "subme=6" in profile.measured(True).options["x264-params"]
    own = CodecSpec(extra=(("aq-strength", "0.5"), ("x264-params", "subme=3:ref=2")))
    mine = own.resolve().measured(True).options
    assert mine["aq-strength"] == "0.5"
    assert mine["x264-params"] == "subme=3:ref=2"
    # A preset named brings its own motion search; other profiles and codecs have none.
    for spec in (CodecSpec(preset="slow"), CodecSpec(profile="fast"), CodecSpec("vp9")):
        resolved = spec.resolve("webm" if spec.codec == "vp9" else "mp4")
        assert resolved.measured(True) == resolved


def test_the_daemon_encodes_grain_with_the_grain_settings(daemon: Daemon) -> None:
    with daemon.client() as client:
        smooth = settings(client.encode(moving_pattern(8, H, W), fps=16).data)
        grain = settings(client.encode(grainy(8), fps=16).data)
        named = settings(client.encode(grainy(8), fps=16, extra={"aq-strength": "0.6"}).data)
        fast = settings(client.encode(grainy(8), fps=16, profile="fast").data)
    assert "subme=2" in smooth and "aq=1:0.70" in smooth
    assert "subme=6" in grain and "aq=1:1.00" in grain
    assert "subme=6" in named and "aq=1:0.60" in named
    assert "subme=0" in fast and "aq=0" in fast


def test_a_stream_is_measured_on_its_first_chunk(daemon: Daemon) -> None:
    with daemon.client() as client:
        made = []
        for video in (grainy(12), moving_pattern(12, H, W)):
            with client.stream(fps=16) as stream:
                for chunk in (video[:6], video[6:]):
                    stream.write(chunk)
            assert stream.result is not None and stream.result.frames == 12
            made.append(settings(stream.result.data or b""))
    assert "subme=6" in made[0] and "aq=1:1.00" in made[0]
    assert "subme=2" in made[1] and "aq=1:0.70" in made[1]
