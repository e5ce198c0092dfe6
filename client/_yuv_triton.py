"""RGB to 4:2:0 on the GPU in one Triton kernel: read each frame once, write Y and chroma
once.

The elementwise path (`_convert.rgb_to_yuv420`) makes a float32 copy of the batch and
runs a dozen passes over it, about 10 GB/s on an H200. This kernel reads the caller's
frames in place (any layout's strides, uint8 or float) and writes the wire frames, so the
conversion runs near memory speed and the device-to-host copy of half the bytes
dominates. The arithmetic is the elementwise path's: BT.709 limited range from 0..255
levels, chroma the mean of each 2x2 block, round half to even, NaN to 0.

Importing this module imports Triton, and the kernel compiles on its first launch for each
specialisation: `_yuv_kernel` does both off the request's path. The integer arguments are
not specialised on, so one compiled kernel serves every size and layout of a dtype; what
remains is the dtype, whether the source pointer is 16-byte aligned, and NV12.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ._convert import U_ROW, V_ROW, Y_ROW

BLOCK = 128  # chroma columns per program: 256 luma columns of two rows
UNSPECIALISED = ("height", "width", "s_t", "s_h", "s_w", "s_c")


@triton.jit
def _levels(src, offset, mask, scale, shift):
    value = tl.load(src + offset, mask=mask, other=0).to(tl.float32)
    return value * scale + shift


@triton.jit
def _to_byte(x):
    x = tl.where(x != x, 0.0, x)  # noqa: PLR0124 - NaN is the value unequal to itself
    x = tl.minimum(tl.maximum(x, 0.0), 255.0)
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    return tl.where(tie & odd, r - 1.0, r).to(tl.uint8)


@triton.jit(do_not_specialize=UNSPECIALISED)
def _rgb_to_420(
    src,
    dst,
    height,
    width,
    s_t,
    s_h,
    s_w,
    s_c,
    scale,
    shift,
    NV12: tl.constexpr,
    BLOCK: tl.constexpr,
    YR: tl.constexpr,
    YG: tl.constexpr,
    YB: tl.constexpr,
    UR: tl.constexpr,
    UG: tl.constexpr,
    UB: tl.constexpr,
    VR: tl.constexpr,
    VG: tl.constexpr,
    VB: tl.constexpr,
):
    pair = tl.program_id(0)  # frame * (height // 2) + chroma row
    half_h = height // 2
    frame = pair // half_h
    row = pair % half_h
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # chroma columns
    mask = j < width // 2
    base = frame.to(tl.int64) * s_t
    y_plane = frame.to(tl.int64) * (height * width * 3 // 2)
    r_sum = tl.zeros((BLOCK,), tl.float32)
    g_sum = tl.zeros((BLOCK,), tl.float32)
    b_sum = tl.zeros((BLOCK,), tl.float32)
    for dy in tl.static_range(2):
        for dx in tl.static_range(2):
            at = base + (2 * row + dy) * s_h + (2 * j + dx) * s_w
            r = _levels(src, at, mask, scale, shift)
            g = _levels(src, at + s_c, mask, scale, shift)
            b = _levels(src, at + 2 * s_c, mask, scale, shift)
            y = _to_byte(YR * r + YG * g + YB * b + 16.0)
            tl.store(dst + y_plane + (2 * row + dy) * width + 2 * j + dx, y, mask=mask)
            r_sum += r
            g_sum += g
            b_sum += b
    r_mean, g_mean, b_mean = r_sum * 0.25, g_sum * 0.25, b_sum * 0.25
    u = _to_byte(UR * r_mean + UG * g_mean + UB * b_mean + 128.0)
    v = _to_byte(VR * r_mean + VG * g_mean + VB * b_mean + 128.0)
    chroma = y_plane + height * width
    if NV12:
        tl.store(dst + chroma + row * width + 2 * j, u, mask=mask)
        tl.store(dst + chroma + row * width + 2 * j + 1, v, mask=mask)
    else:
        quarter = half_h * (width // 2)
        tl.store(dst + chroma + row * (width // 2) + j, u, mask=mask)
        tl.store(dst + chroma + quarter + row * (width // 2) + j, v, mask=mask)


def rgb_to_yuv420(frames: Any, out: Any, scale: float, shift: float, nv12: bool) -> None:
    """Convert `frames`, a (k, H, W, 3) tensor view of any strides and dtype, into `out`,
    a contiguous uint8 (k, H*3/2, W) tensor on the same device. `scale` and `shift` map
    the values to 0..255 levels (1 and 0 for uint8)."""
    k, height, width, _ = frames.shape
    s_t, s_h, s_w, s_c = frames.stride()
    grid = (k * (height // 2), triton.cdiv(width // 2, BLOCK))
    _rgb_to_420[grid](
        frames, out, height, width, s_t, s_h, s_w, s_c, float(scale), float(shift),
        NV12=nv12, BLOCK=BLOCK,
        YR=Y_ROW[0], YG=Y_ROW[1], YB=Y_ROW[2],
        UR=U_ROW[0], UG=U_ROW[1], UB=U_ROW[2],
        VR=V_ROW[0], VG=V_ROW[1], VB=V_ROW[2],
    )  # fmt: skip
