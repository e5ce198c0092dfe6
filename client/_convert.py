"""Turning what a model produced into frames the daemon takes, in bounded batches.

A generation worker holds video as (T,H,W,C), (T,C,H,W), (C,T,H,W) or (B,C,T,H,W) with
B=1, in uint8, float16, bfloat16, float32 or float64, with values in [0, 1] or [-1, 1]. Here it is
brought to the wire format: uint8 RGB (T,H,W,3), or 4:2:0 YUV (T,H*3/2,W) in BT.709
limited range. The same code runs on numpy arrays and on torch tensors (CPU or CUDA), one
batch of frames at a time, so a large bf16 video never has a full float32 copy.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from sidecar.vocabulary import PIXEL_FORMATS

from ._errors import InvalidArgument, InvalidVideo
from ._layout import batch_of, guess_layout

# The 4-D layouts, and the 5-D ones of one video: (B, C, T, H, W) as a VAE decodes it;
# (B, T, H, W, C) and (B, T, C, H, W) as diffusers' `pipe(...).frames` holds it (np, pt).
LAYOUTS = ("THWC", "TCHW", "CTHW", "BCTHW", "BTHWC", "BTCHW")
VALUE_RANGES = {(0, 1): (255.0, 0.0), (-1, 1): (127.5, 127.5)}
FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64"}

# BT.709 limited range, from R, G, B in 0..255.
_KR, _KB = 0.2126, 0.0722
_KG = 1 - _KR - _KB
Y_ROW = (219 / 255 * _KR, 219 / 255 * _KG, 219 / 255 * _KB)
U_ROW = tuple(224 / 255 * c for c in (-_KR / (2 - 2 * _KB), -_KG / (2 - 2 * _KB), 0.5))
V_ROW = tuple(224 / 255 * c for c in (0.5, -_KG / (2 - 2 * _KR), -_KB / (2 - 2 * _KR)))


def dtype_name(array: Any) -> str:
    return str(array.dtype).removeprefix("torch.")


def frames_view(array: Any, layout: str | None) -> Any:
    """A (T, H, W, C) view of `array` (no copy)."""
    shape = tuple(array.shape)
    if layout is None:
        layout = guess_layout(shape)
    if not isinstance(layout, str):
        raise InvalidArgument(f"layout must be a string such as 'THWC', got {layout!r}")
    layout = layout.upper()
    if layout not in LAYOUTS:
        raise InvalidVideo(f"layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    if len(shape) != len(layout):
        raise InvalidVideo(f"shape {shape} does not match layout {layout}")
    if layout.startswith("B"):
        if shape[0] != 1:
            raise InvalidVideo(batch_of(shape))
        array = array[0]
        layout = layout[1:]
    order = [layout.index(axis) for axis in "THWC"]
    view = array.permute(*order) if hasattr(array, "permute") else array.transpose(order)
    if view.shape[3] not in (1, 3, 4):
        raise InvalidVideo(
            f"shape {shape} as {layout}: {view.shape[3]} channels, expected 1, 3 or 4"
        )
    if min(view.shape) < 1:
        raise InvalidVideo(f"shape {shape}: empty video")
    return view


def check_value_range(value_range: Any) -> tuple[float, float]:
    """The scale and offset that take `value_range`, (0, 1) or (-1, 1), to 0..255."""
    pair = tuple(value_range) if isinstance(value_range, (tuple, list)) else ()
    if len(pair) != 2 or not all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))
        for v in pair
    ):
        raise InvalidArgument(f"value_range must be (0, 1) or (-1, 1), got {value_range!r}"[:200])
    key = (int(pair[0]), int(pair[1]))
    if key not in VALUE_RANGES or pair != key:
        hint = ""
        if key[1] == 255:
            hint = "; values in 0..255 go as uint8 (video.astype(np.uint8)), which takes no range"
        # Each range as `value_range=(a, b)`, which the command line words as its flag.
        given = f"value_range=({pair[0]!r}, {pair[1]!r})"
        raise InvalidVideo(f"{given}: use value_range=(0, 1) or value_range=(-1, 1){hint}")
    return VALUE_RANGES[key]


# Float values outside the declared range are clipped to it. When many are, the range is
# wrong ([-1, 1] sent as the default [0, 1] loses the whole lower half) and the video is
# refused: never encoded with only a warning. A sample of the video is checked, never all
# of it (a long GPU video would cost a pass over it).
RANGE_SAMPLE_FRAMES = 4  # frames spread over the video (or over each chunk of a stream)
RANGE_SAMPLE_PIXELS = 4096  # about this many pixels of each, on a strided grid
RANGE_SLACK = 0.05  # of the range's width: overshoot this small is the model's own
RANGE_SHARE = 0.01  # of the sampled values beyond the slack: more, and the video is refused


@dataclass(frozen=True)
class RangeSample:
    """What the strided sample of a float video says about its values."""

    values: int  # sampled
    beyond: int  # outside the declared range by more than the slack
    clipped: int  # outside the declared range at all: clipped to it
    lowest: float  # NaN aside
    highest: float

    @property
    def share(self) -> float:
        return self.beyond / max(1, self.values)


def sample_range(view: Any, value_range: tuple[float, float], torch: Any) -> RangeSample:
    """A strided sample of `view` (T, H, W, C floats), reduced in one go: on a CUDA tensor
    one small reduction and one wait for it (on the caller's stream), whatever the
    video's length."""
    t, h, w, _ = view.shape
    step = max(1, math.isqrt(h * w // RANGE_SAMPLE_PIXELS))
    sample = view[:: -(-t // RANGE_SAMPLE_FRAMES), ::step, ::step]
    low, high = (float(v) for v in value_range)
    slack = RANGE_SLACK * (high - low)
    if torch is not None:
        x = sample.float()
        finite = x.nan_to_num(nan=low)
        beyond, clipped, lowest, highest = torch.stack(
            [
                ((x < low - slack) | (x > high + slack)).sum(),
                ((x < low) | (x > high)).sum(),
                finite.min(),
                finite.max(),
            ]
        ).tolist()
        values = x.numel()
    else:
        x = sample.astype(np.float32)
        finite = np.nan_to_num(x, nan=low)
        beyond = np.count_nonzero((x < low - slack) | (x > high + slack))
        clipped = np.count_nonzero((x < low) | (x > high))
        lowest, highest, values = float(finite.min()), float(finite.max()), x.size
    return RangeSample(int(values), int(beyond), int(clipped), float(lowest), float(highest))


def check_range(view: Any, value_range: tuple[float, float], torch: Any) -> RangeSample:
    """The sample of `view`, once it shows the video is read in its own range; else
    InvalidVideo naming the values seen and the fix. A few values beyond the range (at
    most `RANGE_SHARE` of the sample) are the model's noise: they are clipped."""
    seen = sample_range(view, value_range, torch)
    if seen.share <= RANGE_SHARE:
        return seen
    low, high = (float(v) for v in value_range)
    slack = RANGE_SLACK * (high - low)
    declared = f"value_range=({low:g}, {high:g})"
    if low == 0 and seen.lowest >= -1 - slack and seen.highest <= 1 + slack:
        fix = "it looks like [-1, 1] (a VAE's output): pass value_range=(-1, 1)"
    elif seen.highest > 2:
        fix = "for 0..255 levels send uint8, or divide by 255"
    else:
        fix = "pass the range the video is in, value_range=(0, 1) or (-1, 1), or clamp it"
    raise InvalidVideo(
        f"this float video was read in {declared}, but {seen.share:.0%} of its sampled "
        f"values lie outside it (they range from {seen.lowest:.3g} to {seen.highest:.3g}); "
        f"{fix}"
    )


@dataclass(frozen=True)
class Ops:
    """The handful of array operations conversion needs, for numpy or torch."""

    torch: Any = None  # the torch module, when converting tensors

    def float32(self, x: Any) -> Any:
        """A float32 copy (never the caller's own array: later steps work in place)."""
        if self.torch:
            return x.to(dtype=self.torch.float32, copy=True)
        return x.astype(np.float32)

    def to_uint8(self, x: Any, in_range: bool = False) -> Any:
        """Clamp to 0..255 (NaN to 0, +inf to 255), round half to even, cast. `in_range`:
        `x` is known finite and within 0..255, and is only rounded."""
        if self.torch:
            if not in_range:
                x = self.torch.nan_to_num_(x, nan=0.0, posinf=255.0, neginf=0.0).clamp_(0, 255)
            return x.round_().to(self.torch.uint8)
        if not in_range:
            # fmax and fmin take the number over a NaN: NaN becomes 0, in two passes where
            # nan_to_num and clip take six.
            np.fmax(x, 0, out=x)
            np.fmin(x, 255, out=x)
        np.rint(x, out=x)
        return x.astype(np.uint8)

    def scaled(self, x: Any, scale: float) -> Any:
        """`x * scale` as a new float32 array (one pass, never the caller's own)."""
        if self.torch:
            return x.to(dtype=self.torch.float32) * scale
        return np.multiply(x, np.float32(scale), dtype=np.float32)

    def mean(self, x: Any, axes: tuple[int, ...]) -> Any:
        return x.mean(dim=axes) if self.torch else x.mean(axis=axes)

    def cat(self, xs: list[Any], axis: int) -> Any:
        return self.torch.cat(xs, dim=axis) if self.torch else np.concatenate(xs, axis=axis)

    def stack(self, xs: list[Any], axis: int) -> Any:
        return self.torch.stack(xs, dim=axis) if self.torch else np.stack(xs, axis=axis)


def to_rgb_levels(batch: Any, ops: Ops, scale: float, offset: float, integer: bool) -> Any:
    """A float32 batch in 0..255 levels (not yet rounded)."""
    if integer:
        return ops.float32(batch)
    x = ops.scaled(batch, scale)
    if offset:
        x += offset
    return x


def rgb_to_yuv420(rgb: Any, ops: Ops, nv12: bool, in_range: bool = False) -> Any:
    """(k,H,W,3) float levels -> (k,H*3/2,W) uint8, BT.709 limited, chroma averaged 2x2.
    `in_range`: the levels are finite and within 0..255 (uint8 frames), so every plane
    is too (Y in 16..235, U and V in 16..240), and nothing is clamped.

    Elementwise on purpose: on a GPU, tiny (3x3) matrix products are slower than a few
    fused-friendly multiply-adds over the planes.
    """
    if ops.torch:
        return _rgb_to_yuv420_torch(rgb, ops.torch, nv12, in_range)
    k, h, w, _ = rgb.shape
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    y8 = ops.to_uint8(Y_ROW[0] * r + Y_ROW[1] * g + Y_ROW[2] * b + 16, in_range)
    half = ops.mean(rgb.reshape(k, h // 2, 2, w // 2, 2, 3), (2, 4))
    hr, hg, hb = half[..., 0], half[..., 1], half[..., 2]
    u8 = ops.to_uint8(U_ROW[0] * hr + U_ROW[1] * hg + U_ROW[2] * hb + 128, in_range)
    v8 = ops.to_uint8(V_ROW[0] * hr + V_ROW[1] * hg + V_ROW[2] * hb + 128, in_range)
    if nv12:
        chroma = ops.stack([u8, v8], axis=3).reshape(k, -1)
    else:
        chroma = ops.cat([u8.reshape(k, -1), v8.reshape(k, -1)], axis=1)
    # Planes end to end, seen as one (H*3/2, W) array: the layout PyAV borrows.
    return ops.cat([y8.reshape(k, -1), chroma], axis=1).reshape(k, h * 3 // 2, w)


def _rgb_to_yuv420_torch(rgb: Any, torch: Any, nv12: bool, in_range: bool) -> Any:
    """`rgb_to_yuv420` on tensors, each plane written straight into the output, in as few
    calls as the arithmetic allows. Each torch call lets go of the GIL and takes it back:
    with eight clients' threads in one worker, a short clip's conversion waited for the
    GIL at every call, so the calls, not the kernels, set its cost."""
    k, h, w, _ = rgb.shape
    out = torch.empty((k, h * 3 // 2, w), dtype=torch.uint8, device=rgb.device)
    flat = out.view(k, -1)
    area = h * w
    _plane(torch, rgb.unbind(-1), Y_ROW, 16, flat[:, :area].view(k, h, w), in_range)
    half = rgb.reshape(k, h // 2, 2, w // 2, 2, 3).mean((2, 4)).unbind(-1)
    if nv12:
        uv = flat[:, area:].view(k, h // 2, w // 2, 2).unbind(-1)
    else:
        uv = flat[:, area:].view(k, 2, h // 2, w // 2).unbind(1)
    _plane(torch, half, U_ROW, 128, uv[0], in_range)
    _plane(torch, half, V_ROW, 128, uv[1], in_range)
    return out


def _plane(
    torch: Any, rgb: tuple[Any, ...], row: tuple[float, ...], offset: int, out: Any, in_range: bool
) -> None:
    """`out` (uint8) = round(row . rgb + offset), clamped to 0..255 unless `in_range`."""
    r, g, b = rgb
    x = torch.mul(r, row[0])
    x.add_(g, alpha=row[1]).add_(b, alpha=row[2]).add_(offset)
    if not in_range:
        torch.nan_to_num_(x, nan=0.0, posinf=255.0, neginf=0.0).clamp_(0, 255)
    out.copy_(x.round_())  # whole numbers in 0..255: the cast is exact


@dataclass(frozen=True)
class Conversion:
    """How one (k, H, W, C) batch of the caller's frames becomes wire frames."""

    pixel_format: str  # the wire format
    scale: float
    offset: float
    integer: bool  # uint8 input: already in 0..255

    @property
    def yuv(self) -> bool:
        return is_planar420(self.pixel_format)

    def apply(self, batch: Any, ops: Ops) -> Any:
        if self.yuv:
            rgb = to_rgb_levels(batch, ops, self.scale, self.offset, self.integer)
            nv12 = self.pixel_format == "nv12"
            return rgb_to_yuv420(rgb, ops, nv12, in_range=self.integer)
        if self.integer:
            return batch
        return ops.to_uint8(to_rgb_levels(batch, ops, self.scale, self.offset, False))


def is_planar420(pixel_format: str | None) -> TypeGuard[str]:
    known = PIXEL_FORMATS.get(pixel_format or "")
    return known is not None and known.planar420


def wire_format(channels: int, pixel_format: str | None) -> str:
    """The wire pixel format for frames with `channels` channels: the format given, if
    such frames can be sent as it (3 channels also as bgr24, or converted to 4:2:0), else
    the one they are (gray, rgb24 or rgba)."""
    natural = {1: "gray", 3: "rgb24", 4: "rgba"}[channels]
    if pixel_format is None or pixel_format == natural:
        return natural
    fmt = PIXEL_FORMATS[pixel_format]
    if channels == 3 and (fmt.planar420 or fmt.channels == 3):
        return pixel_format
    raise InvalidVideo(f"{channels}-channel frames cannot be sent as {pixel_format!r}")
