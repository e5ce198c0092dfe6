"""What the fuzz soak's requests are made of: sizes, hostile values, full-size requests."""

from __future__ import annotations

import random
from typing import Any

from sidecar.api.v1 import sidecar_pb2 as pb

LEASE = 64 * 1024
FRAME = 64 * 64 * 3  # valid requests send rgb24 64x64
SMALL: dict[str, Any] = {"width": 64, "height": 64, "pixel_format": pb.PIXEL_FORMAT_RGB24}
CONTAINERS = {"mp4": 1, "fmp4": 2, "webm": 3}  # pb.Container values
PATHS = ["../x.mp4", "/etc/passwd", "a/../../x.mp4", "..", "", "a/", "a\x00b.mp4", "ok.mp4"]
PATHS += ["./ok.mp4", "x" * 5000, "deep/" * 50 + "x.mp4"]
SPECIAL = [-(2**63), -(2**31), 2**31 - 1, 2**31, 2**32, 2**48, 2**62, 2**63 - 1]
EXTRA = [  # (codec, options, values): real x264/x265 options; {s} is outside the output root
    ("h264", "tune", "film zerolatency psnr grain bogus"),
    ("h264", "profile", "baseline main high high444 nope"),
    ("h264", "flags", "+cgop +global_header +bitexact bogus"),
    ("h264", "stats,pass", "{s}/x264.stats,1 relative.stats,1 relative.stats,2 x.stats,3"),
    ("h264", "x264-params", "dump-yuv=dump.yuv dump-yuv={s}/abs.yuv keyint=2:bframes=0 nonsense"),
    ("h264", "x264opts", "psy-rd=1.0:trellis=2 ref=16:me=tesa"),
    ("h264", "threads", "auto 16 -1"),
    ("h265", "x265-params", "csv=x265.csv:csv-log-level=2 analysis-save={s}/a.dat"),
    ("h265", "tune,profile", "psnr,main grain,main10"),
]
FULL_RANGES = 4_000_000  # empty ranges: about 8 MB on the wire
FULL_OPTIONS = 500_000  # encoder options: about 7 MB
SLOW_SIZE = (320, 240)  # abandoned encodes: frames x264 takes a while over at veryslow
SLOW_FRAME = SLOW_SIZE[0] * SLOW_SIZE[1] * 3
SLOW_FRAMES = 48


def full_size_requests(token: str) -> dict[str, tuple[bytes, bytes]]:
    """The full-size requests as EncodeRequest bytes, and as FramedRequest bytes."""
    ranges = pb.EncodeRequest(client_token=token, request_id="full-ranges")
    ranges.video.ranges.add()
    ranges.video.ranges.extend([ranges.video.ranges[0]] * (FULL_RANGES - 1))
    options = pb.EncodeRequest(client_token=token, request_id="full-options")
    options.codec.extra.update({f"k{i}": "v" for i in range(FULL_OPTIONS)})
    return {
        kind: (request.SerializeToString(), pb.FramedRequest(encode=request).SerializeToString())
        for kind, request in (("full-ranges", ranges), ("full-options", options))
    }


def i64(r: random.Random) -> int:
    pick = r.random()
    if pick < 0.5:
        return r.randint(-3, 300)
    return r.choice(SPECIAL) if pick < 0.8 else r.randint(-(2**63), 2**63 - 1)


def text(r: random.Random, n: int = 40) -> str:
    chars = (r.choice([r.randrange(32, 127), r.randrange(0x80, 0xD800)]) for _ in range(n))
    return "".join(map(chr, chars))[: r.randrange(n)]


def fps(r: random.Random | None = None) -> pb.Rational:
    return pb.Rational(num=i64(r), den=i64(r)) if r else pb.Rational(num=24, den=1)


def previews(r: random.Random, hostile: bool = False, stream: bool = False) -> pb.Previews:
    """A thumbnail, a sprite sheet or both; `hostile`: any field may be out of range;
    `stream`: valid for a stream, whose length comes last (no middle pick, no tile count)."""
    p = pb.Previews()

    def n(ok: int) -> int:  # a uint32 field: `ok`, or (hostile) anything it can hold
        return i64(r) % 2**32 if hostile and r.random() < 0.4 else ok

    kinds = r.choice([("thumbnail",), ("sprite_sheet",), ("thumbnail", "sprite_sheet")])
    formats = [0, 1, 2, r.randint(-3, 9)] if hostile else [0, 1, 2]
    if "thumbnail" in kinds:
        t = p.thumbnail
        t.SetInParent()
        at = r.choice(["", "pick", "index", "time_s"])
        if at == "pick":
            picks = [1, 3] if stream else [1, 2, 3]
            t.pick = r.choice([*picks, i64(r) % 2**31] if hostile else picks)  # type: ignore[assignment]
        elif at == "index":
            t.index = i64(r) % 2**64 if hostile else r.randint(0, 10)
        elif at == "time_s":
            t.time_s = r.choice([float("nan"), -1.0, 1e300, 0.1]) if hostile else r.uniform(0, 1)
        t.max_width, t.max_height = n(r.choice([0, 32, 48])), n(r.choice([0, 32]))
        t.format, t.quality = r.choice(formats), n(r.choice([0, 50, 90]))  # type: ignore[assignment]
    if "sprite_sheet" in kinds:
        sheet = p.sprite_sheet
        sheet.SetInParent()
        sheet.tiles = n(0 if stream else r.choice([0, 1, 4, 9]))
        sheet.tile_width = n(r.choice([0, 16, 32]))
        sheet.columns, sheet.quality = n(r.choice([0, 2, 3])), n(r.choice([0, 70]))
        sheet.format = r.choice(formats)  # type: ignore[assignment]
        if r.random() < 0.3:
            sheet.interval_s = r.choice([float("inf"), -2.0, 0.05]) if hostile else 0.05
    return p


def chunk(**fields: Any) -> pb.StreamRequest:
    return pb.StreamRequest(chunk=pb.StreamChunk(**fields))
