"""What a cut that costs a keyframe buys and costs: one encoder against K at once.

    python -m bench.cuts [--shapes 832x480x81,1344x768x122] [--content natural,smooth,noisy]
                         [--segments 1,2,3] [--crf-offset 0.5] [--samples 3] [--json FILE]

The daemon cuts a whole video into parallel segments only where a single pass starts a
GOP anyway, on multiples of the keyframe interval (`sidecar/pipeline/encoding/segments.py`),
so a cut costs no bytes. A cut anywhere else starts its segment on a keyframe that one
pass would not have made. This tool measures both sides of that trade at the `balanced`
profile, on frames already in yuv420p (no transfer, no daemon): for each count K, the
video in K even segments, each encoded by its own libx264 set up as the daemon sets up a
segment encoder (`configure_context`, frame threads, this machine's `frame_threads` divided
by `thread_shares`), all at once in threads, as `encode_segments` runs them. It records
the wall time (the median of `--samples`), the bytes of all the segments' packets, and
the PSNR of their decoded frames against the input (every plane). K=1 is the daemon's
single pass. Bytes and PSNR do not depend on the machine; times do (run it on the host
whose cores the question is about). `--crf-offset D` encodes every count but the first at
the profile's CRF plus D (x264 takes fractions): whether a cut's bytes can be bought back.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import av
import numpy as np

from sidecar.codec.catalogue import ResolvedCodec
from sidecar.codec.encoder import configure_context
from sidecar.codec.frames import Geometry, check_geometry
from sidecar.codec.threads import frame_threads
from sidecar.pipeline.encoding.segments import thread_shares

from .common import Row, git_commit, machine, parse_shape, summarise, write_json
from .floor import LIMITS, yuv_frames
from .rdt import CONTENTS, FPS, content, profile_codec
from .rdt_report import psnr


def encode_range(
    frames: list[av.VideoFrame], start: int, stop: int, geometry: Geometry, codec: ResolvedCodec,
    threads: int,
) -> list[bytes]:  # fmt: skip
    """Frames [start, stop) through one encoder of their own: the packets' bytes."""
    ctx = av.CodecContext.create(codec.choice.encoder, "w")
    assert isinstance(ctx, av.VideoCodecContext)
    configure_context(ctx, geometry, codec, threads, "FRAME")
    ctx.open()
    packets: list[bytes] = []
    for index in range(start, stop):
        frame = frames[index]
        frame.pts = index
        packets += [bytes(p) for p in ctx.encode(frame)]
    packets += [bytes(p) for p in ctx.encode(None)]
    return packets


def decoded(segments: list[list[bytes]]) -> np.ndarray:
    """The segments' frames as yuv420p arrays, each segment decoded on its own, in order."""
    frames: list[np.ndarray] = []
    for packets in segments:
        decoder = av.CodecContext.create("h264", "r")
        for data in [*packets, None]:
            got = decoder.decode(None if data is None else av.Packet(data))
            frames += [frame.to_ndarray() for frame in got]
    return np.stack(frames)


def with_crf_offset(codec: ResolvedCodec, offset: float) -> ResolvedCodec:
    """`codec` at its CRF plus `offset` (unchanged for 0 or without a CRF)."""
    crf = codec.options.get("crf")
    if not offset or crf is None:
        return codec
    return dataclasses.replace(codec, options={**codec.options, "crf": f"{float(crf) + offset:g}"})


def measure(
    shape: str, name: str, counts: list[int], samples: int, crf_offset: float = 0.0
) -> list[Row]:
    width, height, total = parse_shape(shape)
    rgb = content(name, shape)
    frames = yuv_frames(rgb)
    codec = profile_codec("balanced", rgb)
    given = np.stack([frame.to_ndarray() for frame in frames])
    geometry = check_geometry(width, height, "yuv420p", Fraction(FPS), LIMITS)
    threads = frame_threads(len(os.sched_getaffinity(0)))
    rows: list[Row] = []
    for index, count in enumerate(counts):
        settings = with_crf_offset(codec, crf_offset) if index else codec
        edges = [round(total * k / count) for k in range(count + 1)]
        ranges = list(itertools.pairwise(edges))
        shares = thread_shares(threads, [stop - start for start, stop in ranges])
        times: list[float] = []
        made: list[list[bytes]] = []
        with ThreadPoolExecutor(count) as pool:
            for _ in range(samples):
                t0 = time.perf_counter()
                made = list(
                    pool.map(
                        lambda r, n, c=settings: encode_range(frames, r[0], r[1], geometry, c, n),
                        ranges,
                        shares,
                    )
                )
                times.append((time.perf_counter() - t0) * 1e3)
        back = decoded(made)
        if len(back) != total:
            raise RuntimeError(f"{shape} in {count} segments decoded to {len(back)} frames")
        row = summarise(f"segments_{count}", shape, times)
        row.suite, row.content = "cuts", name
        row.extra = {
            "bytes": sum(len(p) for packets in made for p in packets),
            "psnr_db": round(psnr(back, given), 3),
            "threads": shares,
            "options": settings.options,
        }
        rows.append(row)
    base = rows[0]
    for row in rows:
        row.ratio_to_upstream_a = None
        row.note = (
            f"{row.median_ms / base.median_ms:.2f}x the time, "
            f"{row.extra['bytes'] / base.extra['bytes']:.3f}x the bytes, "
            f"{row.extra['psnr_db'] - base.extra['psnr_db']:+.2f} dB of one pass"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cuts", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="832x480x81,1280x720x81,1344x768x122")
    p.add_argument("--content", default="natural,smooth,noisy")
    p.add_argument("--segments", default="1,2,3", help="segment counts; the first is the base")
    p.add_argument(
        "--crf-offset", type=float, default=0.0, help="CRF added to every count but the first"
    )
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    names = args.content.split(",")
    for name in names:
        if name not in CONTENTS:
            raise SystemExit(f"--content: {name!r} is not one of {', '.join(CONTENTS)}")
    try:
        counts = [int(n) for n in args.segments.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or args.samples < 1:
        raise SystemExit("--segments takes counts of 1 or more; --samples 1 or more")
    rows: list[Row] = []
    print("| content | shape | segments | threads | median ms | bytes | PSNR dB | of one pass |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | --- |")
    for shape in args.shapes.split(","):
        for name in names:
            for row in measure(shape, name, counts, args.samples, args.crf_offset):
                rows.append(row)
                x: dict[str, Any] = row.extra
                print(
                    f"| {name} | {shape} | {row.variant.split('_')[1]} | {x['threads']} | "
                    f"{row.median_ms:.1f} | {x['bytes']} | {x['psnr_db']:.2f} | {row.note} |",
                    flush=True,
                )
    if args.json:
        meta: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "command": " ".join(
                ["python -m bench.cuts", *(sys.argv[1:] if argv is None else argv)]
            ),
            "machine": machine(),
            "commit": git_commit(),
        }
        write_json(args.json, meta, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
