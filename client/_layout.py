"""Which axis of a video is which, when the caller does not say (`layout=None`).

A 4-D shape is read in each layout the client takes, THWC, TCHW and CTHW; a reading is a
candidate when its channel axis holds 1, 3 or 4 channels. Then:

- frames with a side of at most 4 pixels are taken as a misreading (an axis of
  channels or frames seen as a side), never as the layout: so (3, H, W, 3) is three RGB
  frames (THWC), not frames 3 pixels wide (CTHW), and (4, H, W, 2) (two channels) is
  refused, saying what CTHW would make of it, rather than sent as 2-pixel-wide frames.
  Only `layout=` sends such frames;
- candidates that give the same frames are one (they differ only in axes of length 1:
  (1, 1, H, W) is one gray frame either way);
- the one tie-break: one frame of 3 or 4 channels is preferred to 3 or 4 gray frames, so
  (1, 3, H, W) is one RGB frame (TCHW) and (3, 1, H, W) one RGB frame (CTHW);
- one candidate left is the layout; several are an error naming them, asking for
  `layout=`. So (3, 3, H, W) and (4, 3, H, W) (TCHW or CTHW), (4, 3, 4, 3) (all three,
  tiny frames each).

A 5-D shape is one video with a batch axis of 1: (B, C, T, H, W) as a VAE decodes it
(BCTHW), or (B, T, H, W, C) and (B, T, C, H, W) as diffusers' `pipe(...).frames` holds
it with `output_type="np"` and `"pt"` (BTHWC, BTCHW). A batch of more than one is
refused, naming `frames[0]`. The last four axes are read as above with no tie-break
but these, in order:

- RGB frames are preferred to RGBA ones: (1, 3, 4, H, W) is a VAE's 4 RGB frames
  (BCTHW), (1, 4, 3, H, W) a pipeline's 4 RGB frames (BTCHW);
- where both readings are RGB, (1, 3, 3, H, W), the VAE's BCTHW, as it decodes;
- else the one reading with real frames: (1, 16, 3, H, W) is BTCHW and (1, 3, H, W, 3)
  BTHWC, never frames 3 pixels wide. Several are an error asking for `layout=`.
"""

from __future__ import annotations

from ._errors import InvalidVideo

CHANNELS = (1, 3, 4)
READINGS = ("THWC", "TCHW", "CTHW")  # the 4-D layouts, in the order named in errors
TINY = 4  # pixels: a frame side this small is read as a misplaced axis, if it can be
_NAMES = {"THWC": "(T, H, W, C)", "TCHW": "(T, C, H, W)", "CTHW": "(C, T, H, W)"}
_KINDS = {1: "gray", 3: "RGB", 4: "RGBA"}


def thwc(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """(frames, height, width, channels) of `shape` read as `layout`."""
    return tuple(shape[layout.index(axis)] for axis in "THWC")


def _same_frames(shape: tuple[int, ...], a: str, b: str) -> bool:
    """Whether two readings put the same elements at the same places."""
    moved = [[i for i in (r.index(x) for x in "THWC") if shape[i] != 1] for r in (a, b)]
    return thwc(shape, a) == thwc(shape, b) and moved[0] == moved[1]


def readings(
    shape: tuple[int, ...],
    order: tuple[str, ...] = READINGS,
    tie_break: bool = True,
    allow_tiny: bool = False,
) -> list[str]:
    """The plausible 4-D layouts of `shape`, by the rules in this module's docstring; of
    readings that give the same frames, the first in `order`. Readings with tiny frames
    only where no other is left and `allow_tiny`."""
    found = [r for r in order if thwc(shape, r)[3] in CHANNELS]
    real = [r for r in found if min(thwc(shape, r)[1:3]) > TINY]
    found = real or (found if allow_tiny else [])
    distinct: list[str] = []
    for r in found:
        if not any(_same_frames(shape, r, kept) for kept in distinct):
            distinct.append(r)
    if len(distinct) == 2 and tie_break:
        (t0, h0, w0, c0), (t1, h1, w1, c1) = (thwc(shape, r) for r in distinct)
        # One frame of c channels, or c gray frames: the frame.
        if (h0, w0) == (h1, w1) and (t0, c0) == (c1, t1) and 1 in (t0, t1):
            return [distinct[0] if t0 == 1 else distinct[1]]
    return distinct


def _described(shape: tuple[int, ...], layout: str, name: str) -> str:
    t, h, w, c = thwc(shape, layout)
    return f"{name} ({t} frame{'s' * (t != 1)} of {w}x{h}, {c} channel{'s' * (c != 1)})"


def _frames(shape: tuple[int, ...], layout: str) -> str:
    """What `shape` read as `layout` holds, in words: "256 frames of 2x448 RGBA"."""
    t, h, w, c = thwc(shape, layout)
    return f"{t} frame{'s' * (t != 1)} of {w}x{h} {_KINDS[c]}"


def _three_d(shape: tuple[int, ...]) -> InvalidVideo:
    """The fix for a 3-D array: one image wants a time axis; gray frames a channel axis."""
    if shape[-1] in CHANNELS[1:]:
        fix = "one (H, W, C) image: add a time axis, video[None]"
    elif shape[0] in CHANNELS[1:]:
        fix = "one (C, H, W) image: add a time axis, video[None], with layout='TCHW'"
    else:
        fix = "gray (T, H, W) frames: add a channel axis, video[..., None]"
    return InvalidVideo(f"shape {shape}: a video is 4-D; for {fix}")


def _no_reading(shape: tuple[int, ...]) -> InvalidVideo:
    """No reading with real frames: say what channels must be, and what tiny frames
    the shape would be, if any, and how to ask for them."""
    tiny = readings(shape, allow_tiny=True)
    if len(tiny) > 1:
        return InvalidVideo(
            f"shape {shape} is ambiguous, with frames of at most {TINY} pixels on a side: "
            f"{' or '.join(_described(shape, r, r) for r in tiny)}; "
            f"pass layout={' or '.join(repr(r) for r in tiny)}"
        )
    if not tiny:
        return InvalidVideo(
            f"shape {shape}: no axis (first, second or last) of 1, 3 or 4 channels; "
            "frames must be gray (1 channel), RGB (3) or RGBA (4)"
        )
    last = f" (its last axis holds {shape[-1]})" if shape[-1] not in CHANNELS else ""
    return InvalidVideo(
        f"shape {shape}: frames must have 1, 3 or 4 channels{last}; read as {tiny[0]} it "
        f"would be {_frames(shape, tiny[0])}; pass layout={tiny[0]!r} if that is meant"
    )


def guess_layout(shape: tuple[int, ...]) -> str:
    """The layout of a video of `shape` given without `layout=`; InvalidVideo when the
    shape has no reading or more than one."""
    if len(shape) == 3:
        raise _three_d(shape)
    if len(shape) == 5:
        return _guess_5d(shape)
    if len(shape) != 4:
        raise InvalidVideo(f"shape {shape}: expected a 4-D or 5-D video")
    found = readings(shape)
    if len(found) == 1:
        return found[0]
    if not found:
        raise _no_reading(shape)
    raise InvalidVideo(
        f"shape {shape} is ambiguous: {' or '.join(_described(shape, r, r) for r in found)}; "
        f"pass layout={' or '.join(repr(r) for r in found)}"
    )


def batch_of(shape: tuple[int, ...]) -> str:
    """The refusal of a batch of videos: `pipe(...).frames` holds one per prompt."""
    return (
        f"shape {shape}: a batch of {shape[0]} videos; pass one, frames[0] (or video[0]), "
        "and send the others one by one"
    )


def _guess_5d(shape: tuple[int, ...]) -> str:
    if shape[0] != 1:
        raise InvalidVideo(batch_of(shape))
    inner = shape[1:]
    found = readings(inner, ("CTHW", "TCHW", "THWC"), tie_break=False, allow_tiny=True)
    if not found:
        return "BCTHW"  # a wrong channel count is refused with the reason
    rgb = [r for r in found if thwc(inner, r)[3] == 3]
    if len(found) > 1 and len(rgb) == 1:
        return "B" + rgb[0]  # RGB frames rather than RGBA ones: (1, 4, 3, H, W) is 4 RGB
    if "CTHW" in found:
        return "BCTHW"  # a VAE's (1, 3, 3, H, W): 3 frames either way, read as it decodes
    real = [r for r in found if min(thwc(inner, r)[1:3]) > TINY]
    if len(real) == 1:
        return "B" + real[0]  # diffusers' np (B, T, H, W, C) or pt (B, T, C, H, W)
    described = " or ".join(_described(inner, r, f"(B, {_NAMES[r][1:]}") for r in found)
    layouts = " or ".join(repr("B" + r) for r in found)
    raise InvalidVideo(f"shape {shape} is ambiguous: {described}; pass layout={layouts}")
