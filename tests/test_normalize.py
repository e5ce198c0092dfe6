"""Layouts, value ranges and dtypes, normalised on the client (CPU tensors and numpy)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from client._convert import Conversion, Ops  # the conversion itself, tested without a daemon
from client.patterns import moving_pattern

from .helpers import decode, psnr

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def rgb() -> np.ndarray:
    return moving_pattern(10, 96, 128)


@pytest.fixture(scope="module")
def baseline(daemon, rgb: np.ndarray) -> bytes:
    with daemon.client() as c:
        return c.encode(rgb, threads=1).data or b""


def as_layout(video: np.ndarray, layout: str) -> np.ndarray:
    thwc = video
    if layout == "TCHW":
        return np.ascontiguousarray(thwc.transpose(0, 3, 1, 2))
    if layout == "CTHW":
        return np.ascontiguousarray(thwc.transpose(3, 0, 1, 2))
    if layout == "BCTHW":
        return np.ascontiguousarray(thwc.transpose(3, 0, 1, 2))[None]
    return thwc


@pytest.mark.parametrize("layout", ["THWC", "TCHW", "CTHW", "BCTHW"])
@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_layouts_are_byte_exact(
    client: Any, rgb: np.ndarray, baseline: bytes, layout: str, kind: str
) -> None:
    data = as_layout(rgb, layout)
    video = torch.from_numpy(data) if kind == "tensor" else data
    # Every one is read from the shape: (3, 10, H, W) has one reading, CTHW.
    assert client.encode(video, threads=1).data == baseline
    assert client.encode(video, layout=layout, threads=1).data == baseline


@pytest.mark.parametrize(("low", "high"), [(0, 1), (-1, 1)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_ranges_are_byte_exact(
    client: Any, rgb: np.ndarray, baseline: bytes, low: int, high: int, dtype: str
) -> None:
    floats = (rgb.astype(dtype) / 255.0) * (high - low) + low
    assert client.encode(floats, value_range=(low, high), threads=1).data == baseline
    tensor = torch.from_numpy(floats)
    assert client.encode(tensor, value_range=(low, high), threads=1).data == baseline


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_tensors(client: Any, rgb: np.ndarray, dtype: str) -> None:
    t = (torch.from_numpy(rgb).float() / 127.5 - 1).to(getattr(torch, dtype))
    t = t.permute(3, 0, 1, 2)[None]  # (1, C, T, H, W), as a VAE returns it
    frames, _ = decode(client.encode(t, value_range=(-1, 1)).data or b"")
    assert psnr(frames, rgb) >= 40


def test_conversion_clamps_special_values() -> None:
    values = [float("nan"), float("inf"), float("-inf"), 2.0, -3.0, 0.5, 1.0, 0.0]
    expect = [0, 255, 0, 255, 0, 128, 255, 0]
    conv = Conversion("rgb24", 255.0, 0.0, integer=False)
    for dtype in ("float16", "bfloat16", "float32"):
        t = torch.tensor(values, dtype=getattr(torch, dtype))
        got = conv.apply(t, Ops(torch))
        assert got.dtype == torch.uint8 and got.tolist() == expect, dtype
    got_np = conv.apply(np.array(values, np.float32), Ops())
    assert got_np.tolist() == expect


@pytest.mark.parametrize("pixel_format", ["yuv420p", "nv12"])
def test_420_planes_agree_on_tensors_and_arrays(pixel_format: str) -> None:
    """The 4:2:0 planes from tensors and from numpy arrays: the same to one level (a
    rounding tie); uint8's extremes land on the limited range's ends; float values past
    the range, NaN and infinities are clamped, as for RGB."""
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, (3, 34, 58, 3), dtype=np.uint8)
    frames[0] = 0
    frames[1] = 255
    floats = rng.uniform(-1.2, 1.2, (3, 34, 58, 3)).astype(np.float32)
    floats[0, :2, :2] = [float("nan"), float("inf"), float("-inf")]
    floats[1, :2, :2] = 1.2  # past white
    floats[2, :2, :2] = float("nan")
    for video, conv in (
        (frames, Conversion(pixel_format, 1.0, 0.0, integer=True)),
        (floats, Conversion(pixel_format, 127.5, 127.5, integer=False)),
    ):
        on_tensor = conv.apply(torch.from_numpy(video), Ops(torch)).numpy()
        on_array = conv.apply(video, Ops())
        assert on_tensor.shape == on_array.shape == (3, 51, 58)
        assert on_tensor.dtype == on_array.dtype == np.uint8
        diff = np.abs(on_tensor.astype(int) - on_array.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() < 0.001
    assert (on_tensor[1, :2, :2] == 255).all() and (on_tensor[2, :2, :2] == 0).all()
    black, white = conv_planes(frames, pixel_format)
    assert (black[0] == 16).all() and (black[1] == 128).all()
    assert (white[0] == 235).all() and (white[1] == 128).all()


def conv_planes(frames: np.ndarray, pixel_format: str) -> tuple[tuple[Any, Any], ...]:
    """Luma and chroma of the first two frames, converted from a tensor."""
    out = Conversion(pixel_format, 1.0, 0.0, integer=True).apply(
        torch.from_numpy(frames), Ops(torch)
    )
    h = out.shape[1] * 2 // 3
    return tuple((out[i, :h].numpy(), out[i, h:].numpy()) for i in (0, 1))


def test_bf16_quantisation_is_within_one_level(rgb: np.ndarray) -> None:
    t = (torch.from_numpy(rgb).float() / 255).to(torch.bfloat16)
    got = Conversion("rgb24", 255.0, 0.0, integer=False).apply(t, Ops(torch))
    assert (got.int() - torch.from_numpy(rgb).int()).abs().max() <= 1


@pytest.mark.parametrize("pixel_format", ["yuv420p", "nv12"])
def test_client_side_420_matches_daemon_conversion(
    client: Any, rgb: np.ndarray, pixel_format: str
) -> None:
    """Converting to 4:2:0 before the copy gives the same picture as the daemon's swscale."""
    daemon_side, facts_a = decode(client.encode(rgb).data or b"")
    for video in (rgb, torch.from_numpy(rgb)):
        result = client.encode(video, pixel_format=pixel_format)
        client_side, facts_b = decode(result.data or b"")
        assert abs(psnr(client_side, rgb) - psnr(daemon_side, rgb)) <= 1.0
        assert psnr(client_side, rgb) >= 40
        keys = ("colorspace", "color_range", "color_primaries", "color_trc", "pix_fmt")
        assert {k: facts_b[k] for k in keys} == {k: facts_a[k] for k in keys}


def test_420_halves_the_bytes(client: Any, rgb: np.ndarray) -> None:
    # The spare lease each result brings is sized for the request it came with.
    before = client.status().counters
    client.encode(rgb)
    rgb_bytes = client.status().pool["leased_bytes"]
    client.encode(rgb, pixel_format="yuv420p")
    yuv_bytes = client.status().pool["leased_bytes"]
    assert rgb_bytes == rgb.nbytes and yuv_bytes * 2 == rgb_bytes
    assert client.status().counters["frames_encoded"] == before["frames_encoded"] + 20


def test_small_batches_and_many_leases_change_nothing(
    make_daemon, connect, rgb: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    import client._video as video_module

    d = make_daemon(slabs=8, slab_size="1MiB")  # 36 KiB frames: 28 a lease
    floats = torch.from_numpy(rgb.astype(np.float32) / 255)
    long_video = torch.cat([floats] * 6)  # 60 frames: 3 leases
    with connect(d) as c:
        whole = c.encode(long_video, threads=1).data
        # No public knob sets the conversion batch: patch it to 2 frames a batch.
        monkeypatch.setattr(video_module, "CPU_BATCH_BYTES", 100_000)
        batched = c.encode(long_video, threads=1).data
        assert c.status().counters["leases_granted"] == 6
    assert whole == batched


def test_gray_and_rgba_tensors(client: Any, rgb: np.ndarray) -> None:
    gray = torch.from_numpy(rgb[..., 1:2].copy())  # (T, H, W, 1)
    frames, _ = decode(client.encode(gray).data or b"")
    assert psnr(frames[..., 1], rgb[..., 1]) >= 40
    rgba = torch.from_numpy(np.concatenate([rgb, rgb[..., :1]], axis=-1))
    frames, _ = decode(client.encode(rgba.permute(0, 3, 1, 2)).data or b"")  # TCHW, 4 channels
    assert psnr(frames, rgb) >= 40
