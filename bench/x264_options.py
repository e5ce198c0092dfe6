"""x264 options against `balanced`: what each set would save, and what it would cost.

    python -m bench.x264_options                          # the sets below, on this machine
    python -m bench.x264_options --cores 16 --rounds 1    # another host's threads (bytes)
    python -m bench.x264_options --sets "dia=me=dia;sf=preset=superfast:mbtree=1"

Long clips at `balanced` are x264-bound on the GPU host, so a faster default has to be a
cheaper x264. This times libx264 alone (no daemon, no transfer): the frames converted
to yuv420p first (BT.709, limited range, bicubic chroma, as the daemon converts them),
each set opened as the daemon opens an encoder (`configure_context`, threads from
`threading_for` for `--cores`), and beside them export_to_video's settings (libx264
`medium`, CRF 25, x264's own frame threads for those cores). Each row: the median wall
and CPU time of `--rounds` encodes (rounds interleaved), the bytes, and PSNR (RGB, every
frame). `ok` says whether a set keeps `balanced`'s bounds against export_to_video: at
most 1.25x its bytes, at its PSNR within 0.3 dB.

A set is `balanced` with x264 options as a request gives them (`extra={"x264-params":
...}`, a `preset=` among them as its `preset`), checked as the daemon checks a request's:
anything chosen here can be tried through the daemon as it is. `--cores N` on a
smaller machine reproduces the bytes of a host with N cores (frame threads change what
x264 makes), not its times.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import sys
import time
from fractions import Fraction

import av
import numpy as np

from sidecar.codec.catalogue import CodecSpec, ResolvedCodec
from sidecar.codec.colour import FrameConverter
from sidecar.codec.encoder import configure_context
from sidecar.codec.frames import check_geometry
from sidecar.codec.threads import threading_for
from sidecar.errors import InvalidRequest

from .common import Row, parse_shape, run_meta, write_json
from .floor import LIMITS
from .rdt import ANCHOR, CONTENTS, FPS, SHAPES, content
from .rdt_report import decoded, psnr

# What was tried on 2026-12-07 (bench/results/2026-12-07-h100-x264-options.md).
DEFAULT_SETS = (
    "dia=me=dia",
    "dia_wp0=me=dia:weightp=0",
    "subme1=subme=1",
    "lookahead5=rc-lookahead=5",
    "badapt0=b-adapt=0",
    "no_mbtree=mbtree=0",
    "cavlc=cabac=0",
    "superfast_mbtree=preset=superfast:mbtree=1:rc-lookahead=10",
)
MAX_BYTES, MAX_PSNR_LOSS_DB = 1.25, 0.3  # balanced's bounds against export_to_video


def parse_sets(spec: str) -> dict[str, str]:
    """`name=key=value:key=value;...` -> {name: x264-params}, `balanced` first."""
    sets = {"balanced": ""}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, params = part.partition("=")
        if not name.isidentifier() or not params:
            raise SystemExit(f"--sets: {part!r} is not name=key=value:key=value")
        sets[name] = params
    return sets


def resolved(params: str, shape: str) -> ResolvedCodec:
    """`balanced` for this clip with `params` as a request's `x264-params` (a `preset=`
    among them as its preset), checked as the daemon checks a request's."""
    pairs = [p.partition("=") for p in params.split(":") if p]
    preset = next((v for k, _, v in pairs if k == "preset"), "")
    rest = ":".join(f"{k}={v}" for k, _, v in pairs if k != "preset")
    extra = (("x264-params", rest),) if rest else ()
    w, h, t = parse_shape(shape)
    return CodecSpec(profile="balanced", preset=preset, extra=extra).resolve(video=(w, h, t))


def yuv(frames: np.ndarray) -> list[np.ndarray]:
    """The frames in yuv420p, converted as the daemon converts them (`FrameConverter`)."""
    _, h, w, _ = frames.shape
    converter = FrameConverter(check_geometry(w, h, "rgb24", Fraction(FPS), LIMITS), 1)
    return [converter.frame(image).to_ndarray() for image in frames]


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def encode(
    planes: list[np.ndarray], shape: str, codec: ResolvedCodec | None, cores: int
) -> tuple[bytes, float, float]:
    """(MP4, wall s, CPU s) of one encode; `codec` None: export_to_video's settings."""
    w, h, t = parse_shape(shape)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as output:
        stream = output.add_stream("libx264", rate=Fraction(FPS))
        ctx = stream.codec_context
        if codec is None:
            stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
            ctx.thread_type, ctx.thread_count = "FRAME", cores * 3 // 2  # x264's own count
            ctx.colorspace = ctx.color_primaries = ctx.color_trc = ctx.color_range = 1  # BT.709
            ctx.options = dict(ANCHOR)
        else:
            geometry = check_geometry(w, h, "yuv420p", Fraction(FPS), LIMITS)
            threads, thread_type = threading_for(t, h, cores)
            configure_context(ctx, geometry, codec, threads, thread_type)
        frames = []
        for index, plane in enumerate(planes):
            frame = av.VideoFrame.from_ndarray(plane, format="yuv420p")
            frame.pts, frame.colorspace, frame.color_range = index, 1, 1
            frames.append(frame)
        cpu, wall = _cpu_s(), time.perf_counter()
        for frame in frames:
            output.mux(stream.encode(frame))
        output.mux(stream.encode(None))
        wall, cpu = time.perf_counter() - wall, _cpu_s() - cpu
    return buf.getvalue(), wall, cpu


def measure(shape: str, name: str, sets: dict[str, str], cores: int, rounds: int) -> list[Row]:
    """Every set and the anchor on the same frames, rounds interleaved."""
    frames = content(name, shape)
    planes = yuv(frames)
    codecs: dict[str, ResolvedCodec | None] = {"export_to_video": None}
    codecs |= {label: resolved(params, shape) for label, params in sets.items()}
    made: dict[str, tuple[int, float]] = {}
    walls: dict[str, list[float]] = {label: [] for label in codecs}
    cpus: dict[str, list[float]] = {label: [] for label in codecs}
    labels = list(codecs)
    for round_ in range(rounds + 1):  # round 0 warms each set up and keeps what it made
        for label in labels[round_ % len(labels) :] + labels[: round_ % len(labels)]:
            data, wall, cpu = encode(planes, shape, codecs[label], cores)
            if not round_:
                made[label] = (len(data), psnr(decoded(data), frames))
            else:
                walls[label].append(wall * 1e3)
                cpus[label].append(cpu * 1e3)
    rows = []
    for label in labels:
        size, quality = made[label]
        codec = codecs[label]
        rows.append(
            Row(
                variant=label,
                shape=shape,
                median_ms=round(statistics.median(walls[label]), 2),
                min_ms=round(min(walls[label]), 2),
                max_ms=round(max(walls[label]), 2),
                samples=rounds,
                suite="x264_options",
                content=name,
                extra={
                    "bytes": size,
                    "psnr_db": round(quality, 3),
                    "cpu_ms": round(statistics.median(cpus[label]), 1),
                    "options": dict(ANCHOR) if codec is None else dict(codec.options),
                },
            )
        )
    return rows


def table(rows: list[Row]) -> str:
    """Each set's wall and CPU time against `balanced`'s, bytes and PSNR against the anchor."""
    anchor = next(r for r in rows if r.variant == "export_to_video")
    base = next(r for r in rows if r.variant == "balanced")
    lines = [
        f"{rows[0].content} {rows[0].shape}: export_to_video {anchor.median_ms:.0f} ms, "
        f"{anchor.extra['bytes']:,} bytes, {anchor.extra['psnr_db']:.2f} dB",
        "| set | wall ms | x balanced | CPU x balanced | bytes x e2v | dB - e2v | ok |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        if row is anchor:
            continue
        size = row.extra["bytes"] / anchor.extra["bytes"]
        loss = row.extra["psnr_db"] - anchor.extra["psnr_db"]
        ok = size <= MAX_BYTES and loss >= -MAX_PSNR_LOSS_DB
        lines.append(
            f"| {row.variant} | {row.median_ms:.1f} | {row.median_ms / base.median_ms:.2f} | "
            f"{row.extra['cpu_ms'] / base.extra['cpu_ms']:.2f} | {size:.3f} | {loss:+.2f} | "
            f"{'yes' if ok else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.x264_options", description=__doc__.splitlines()[0]
    )
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--contents", default="natural,smooth")
    p.add_argument("--sets", default=";".join(DEFAULT_SETS), help="name=key=value:...;...")
    p.add_argument("--cores", type=int, default=0, help="thread as on a host of N cores")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    for name in args.contents.split(","):
        if name not in CONTENTS:
            raise SystemExit(f"--contents: {name!r} is not one of {', '.join(CONTENTS)}")
    if args.rounds < 1 or args.cores < 0:
        raise SystemExit("--rounds must be 1 or more and --cores 0 or more")
    sets = parse_sets(args.sets)
    for name, params in sets.items():  # refused before any work, as the daemon refuses them
        try:
            resolved(params, args.shapes.split(",")[0])
        except InvalidRequest as exc:
            raise SystemExit(f"--sets: {name}: {exc}") from None
    cores = args.cores or len(os.sched_getaffinity(0))
    rows: list[Row] = []
    for shape in args.shapes.split(","):
        for name in args.contents.split(","):
            rows += (some := measure(shape, name, sets, cores, args.rounds))
            print(table(some) + "\n", flush=True)
    if args.json:
        given = sys.argv[1:] if argv is None else argv
        meta = run_meta("bench.x264_options", given, "cpu") | {"cores": cores}
        write_json(args.json, meta, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
