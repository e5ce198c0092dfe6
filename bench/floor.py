"""The encoder's floor: how close to upstream_a any single-stream sidecar could come.

    python -m bench.floor [--device cuda] [--shapes 1344x768x122] [--content smooth,noisy]
                          [--samples 5] [--json FILE]
    python -m bench.floor --processes 8 [--seconds 15] [--shapes ...] [--content ...]

For each shape and content it times, in one run, side by side:

- `upstream_a`, the bench's own variant (copies and encode in the caller's process);
- `x264_alone`: libx264 with the daemon's settings and threads (`threading_for` on this
  machine's cores) encoding yuv420p frames already in memory: no transfer, no colour
  conversion, no container, no daemon. Nothing that encodes the video as one stream with
  these settings can be faster; the rest of the sidecar's time is what it adds.

The ratio column is the floor's share of upstream_a. A sidecar target below it can only
be met by changing what is encoded (another preset, or cuts that cost keyframes).

With `--processes N` it times the node's floor instead: N processes, each encoding the
video with x264 alone back to back for `--seconds`, with the share of this machine's
cores that the daemon gives each of N concurrent encodes (cores // N). Their frames/s
added up is the most any daemon feeding N encodes at once could reach here; run it beside
`--suite node` (N = its clients), and under `taskset` for fewer cores, to tell what the
cores give from what the sidecar adds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from fractions import Fraction
from typing import Any

import av
import numpy as np

from sidecar.codec.catalogue import CodecSpec
from sidecar.codec.encoder import configure_context
from sidecar.codec.frames import Limits, check_geometry
from sidecar.codec.threads import threading_for

from .common import (
    CONTENTS,
    Device,
    Row,
    as_host,
    encode_settings,
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


def x264_alone(
    frames: list[av.VideoFrame], width: int, height: int, cores: int = 0
) -> tuple[float, int]:
    """(ms, output bytes) for one encode of `frames` by a codec context, opened untimed,
    threaded as the daemon threads an encode given `cores` (default: all of them)."""
    profile = encode_settings()["profile"]
    codec = CodecSpec(profile=profile).resolve("mp4", video=(width, height, len(frames)))
    cores = cores or len(os.sched_getaffinity(0))
    threads, thread_type = threading_for(len(frames), height, cores)
    geometry = check_geometry(width, height, "yuv420p", Fraction(24), LIMITS)
    ctx = av.CodecContext.create(codec.choice.encoder, "w")
    assert isinstance(ctx, av.VideoCodecContext)
    configure_context(ctx, geometry, codec, threads, thread_type)  # as the daemon sets it up
    ctx.open()
    size = 0
    t0 = time.perf_counter()
    for index, frame in enumerate(frames):
        frame.pts = index
        size += sum(packet.size for packet in ctx.encode(frame))
    size += sum(packet.size for packet in ctx.encode(None))
    return (time.perf_counter() - t0) * 1e3, size


def encode_for(
    shape: str, content: str, seconds: float, cores: int, start: Any, results: Any
) -> None:
    """One process of the parallel floor (spawned): encodes until `seconds` have passed
    from the shared `start`, then reports (frames, seconds, per-encode ms)."""
    width, height, _ = parse_shape(shape)
    frames = yuv_frames(as_host(Device("cpu").video(shape, content)))
    x264_alone(frames, width, height, cores)  # warm: pages, code, x264's tables
    start.wait()
    t0 = time.monotonic()
    times: list[float] = []
    while time.monotonic() - t0 < seconds:
        times.append(x264_alone(frames, width, height, cores)[0])
    results.put((len(times) * len(frames), time.monotonic() - t0, times))


def measure_parallel(shape: str, content: str, processes: int, seconds: float) -> Row:
    """The node's floor: `processes` x264-alone encoders at once, each with its share."""
    share = max(1, len(os.sched_getaffinity(0)) // processes)
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(processes, timeout=600), ctx.Queue()
    args = (shape, content, seconds, share, start, results)
    workers = [ctx.Process(target=encode_for, args=args) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        done = [results.get(timeout=seconds + 600) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    times = [ms for _, _, each in done for ms in each]
    row = summarise("x264_alone", shape, times)
    row.suite, row.content = "floor", content
    threads, _ = threading_for(parse_shape(shape)[2], parse_shape(shape)[1], share)
    row.extra = {
        "processes": processes,
        "threads": threads,
        "frames_per_s": round(sum(frames / secs for frames, secs, _ in done), 1),
    }
    return row


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


def single(args: argparse.Namespace) -> list[Row]:
    """One stream: upstream_a and x264 alone, side by side."""
    device = Device(args.device)
    rows: list[Row] = []
    print("| content | shape | variant | median ms | min-max ms | x upstream_a |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for content in args.content.split(","):
        for shape in args.shapes.split(","):
            for row in measure(device, shape, content, args.samples):
                rows.append(row)
                print(
                    f"| {content} | {shape} | {row.variant} | {row.median_ms:.1f} | "
                    f"{row.min_ms:.1f}-{row.max_ms:.1f} | {row.ratio_to_upstream_a:.3f} |",
                    flush=True,
                )
    return rows


def parallel(args: argparse.Namespace) -> list[Row]:
    """The node's floor: `args.processes` x264-alone encoders at once."""
    rows: list[Row] = []
    print("| content | shape | processes x threads | median ms an encode | frames/s |")
    print("| --- | --- | --- | ---: | ---: |")
    for content in args.content.split(","):
        for shape in args.shapes.split(","):
            row = measure_parallel(shape, content, args.processes, args.seconds)
            rows.append(row)
            print(
                f"| {content} | {shape} | {args.processes} x {row.extra['threads']} | "
                f"{row.median_ms:.1f} | {row.extra['frames_per_s']:.0f} |",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--shapes", default="1344x768x122")
    p.add_argument("--content", default="smooth,noisy")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument(
        "--processes",
        type=int,
        default=0,
        help="time N x264-alone encoders at once (the node's floor) instead of upstream_a",
    )
    p.add_argument("--seconds", type=float, default=15.0, help="with --processes")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    for content in args.content.split(","):
        if content not in CONTENTS:
            raise SystemExit(f"--content: {content!r} is not one of {', '.join(CONTENTS)}")
    if args.processes < 0 or args.seconds <= 0:
        raise SystemExit("--processes must be 0 or more and --seconds more than 0")
    rows = parallel(args) if args.processes else single(args)
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
