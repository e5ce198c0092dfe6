"""The encoder's floor: how close to upstream_a any single-stream sidecar could come.

    python -m bench.floor [--device cuda] [--shapes 1344x768x122] [--content smooth,noisy]
                          [--samples 5] [--json FILE]

For each shape and content it times, in one run, side by side:

- `upstream_a`, the bench's own variant (copies and encode in the caller's process);
- `x264_alone`: libx264 with the daemon's settings and threads (`threading_for` on this
  machine's cores) encoding yuv420p frames already in memory: no transfer, no colour
  conversion, no container, no daemon. Nothing that encodes the video as one stream with
  these settings can be faster; the rest of the sidecar's time is what it adds.

The ratio column is the floor's share of upstream_a. A sidecar target below it can only
be met by changing what is encoded (another preset, or cuts that cost keyframes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from fractions import Fraction
from typing import Any

import av
import numpy as np

from sidecar.encoder import CodecSpec, configure, threading_for
from sidecar.frames import Limits, check_geometry

from .common import (
    CONTENTS,
    Device,
    Row,
    as_host,
    git_commit,
    machine,
    parse_shape,
    summarise,
    write_json,
)
from .variants import UpstreamA

LIMITS = Limits(100_000, 8192, 8192, 1 << 40)


def yuv_frames(rgb: np.ndarray) -> list[av.VideoFrame]:
    """The frames as the encoder takes them: yuv420p, made before any timer starts."""
    return [
        av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        for image in rgb
    ]


def x264_alone(frames: list[av.VideoFrame], width: int, height: int) -> tuple[float, int]:
    """(ms, output bytes) for one encode of `frames` by a codec context, opened untimed."""
    codec = CodecSpec().resolve("mp4")
    threads, thread_type = threading_for(len(frames), height, len(os.sched_getaffinity(0)))
    geometry = check_geometry(width, height, "yuv420p", Fraction(24), LIMITS)
    ctx = av.CodecContext.create(codec.choice.encoder, "w")
    assert isinstance(ctx, av.VideoCodecContext)
    configure(ctx, geometry, codec, threads, thread_type)  # as the daemon sets it up
    ctx.open()
    size = 0
    t0 = time.perf_counter()
    for index, frame in enumerate(frames):
        frame.pts = index
        size += sum(packet.size for packet in ctx.encode(frame))
    size += sum(packet.size for packet in ctx.encode(None))
    return (time.perf_counter() - t0) * 1e3, size


def measure(device: Device, shape: str, content: str, samples: int) -> list[Row]:
    width, height, _ = parse_shape(shape)
    video = device.video(shape, content)
    frames = yuv_frames(as_host(video))
    upstream = UpstreamA(device)
    up_ms: list[float] = []
    floor_ms: list[float] = []
    size = 0
    for _ in range(samples):  # interleaved, so that both see the same machine
        device.ready()
        t0 = time.perf_counter()
        upstream.run(video, shape)
        up_ms.append((time.perf_counter() - t0) * 1e3)
        ms, size = x264_alone(frames, width, height)
        floor_ms.append(ms)
    rows = [summarise("upstream_a", shape, up_ms), summarise("x264_alone", shape, floor_ms)]
    base = statistics.median(up_ms)
    for row in rows:
        row.suite, row.content = "floor", content
        row.ratio_to_upstream_a = round(row.median_ms / base, 3)
    rows[1].extra = {"output_bytes": size}
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--shapes", default="1344x768x122")
    p.add_argument("--content", default="smooth,noisy")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    device = Device(args.device)
    rows: list[Row] = []
    print("| content | shape | variant | median ms | min-max ms | x upstream_a |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for content in args.content.split(","):
        if content not in CONTENTS:
            raise SystemExit(f"--content: {content!r} is not one of {', '.join(CONTENTS)}")
        for shape in args.shapes.split(","):
            for row in measure(device, shape, content, args.samples):
                rows.append(row)
                print(
                    f"| {content} | {shape} | {row.variant} | {row.median_ms:.1f} | "
                    f"{row.min_ms:.1f}-{row.max_ms:.1f} | {row.ratio_to_upstream_a:.3f} |",
                    flush=True,
                )
    if args.json:
        meta: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "command": " ".join(
                ["python -m bench.floor", *(sys.argv[1:] if argv is None else argv)]
            ),
            "device": args.device,
            "machine": machine(),
            "commit": git_commit(),
            "content": args.content.split(","),
        }
        write_json(args.json, meta, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
