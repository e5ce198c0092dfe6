"""`python -m bench`: side-by-side benchmarks, written down with date, machine and command.

python -m bench --device cpu --json out.json              # the end-to-end table
python -m bench --device cuda --suite all --json out.json # everything, on a GPU host
python -m bench --shapes 448x256x4,1344x768x122 --samples 5 --plot table.png
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
from typing import Any

from . import suites
from .common import SHAPES, Device, Row, git_commit, machine, read_json, write_json
from .report import markdown, plot


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where frames start: host memory, or a CUDA tensor (timed from GPU-ready)",
    )
    p.add_argument(
        "--suite",
        default="e2e",
        help="comma list of e2e, transfer, throughput, stream, memory, or 'all'",
    )
    p.add_argument("--shapes", default=",".join(SHAPES), help="WxHxT list for e2e")
    p.add_argument(
        "--variants",
        default="",
        help="e2e variants (default all): upstream_a, upstream_d, ffmpeg_pipe, "
        "sidecar, sidecar_yuv",
    )
    p.add_argument("--samples", type=int, default=0, help="samples per variant and shape")
    p.add_argument("--clients", type=int, default=8, help="throughput: concurrent clients")
    p.add_argument("--requests", type=int, default=3, help="throughput: requests per client")
    p.add_argument("--throughput-shape", default="1344x768x122")
    p.add_argument("--stream-shape", default="1344x768x362")
    p.add_argument("--chunk", type=int, default=24, help="stream: frames per chunk")
    p.add_argument("--pace-ms", type=float, default=100.0, help="stream: ms between chunks")
    p.add_argument(
        "--from-json",
        metavar="FILE",
        help="print (and --plot) a recorded run instead of running anything",
    )
    p.add_argument("--json", metavar="FILE", help="write rows and metadata as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as Markdown")
    p.add_argument("--plot", metavar="FILE.png", help="draw the e2e table (needs matplotlib)")
    return p  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.from_json:
        meta, recorded = read_json(args.from_json)
        print(markdown(meta, recorded))
        if args.plot:
            plot(recorded, args.plot, meta)
        return 0
    device = Device(args.device)
    wanted = (
        {"e2e", "transfer", "throughput", "stream", "memory"}
        if args.suite == "all"
        else set(args.suite.split(","))
    )
    sidecar_options: dict[str, Any] = {}
    rows: list[Row] = []
    started = datetime.datetime.now(datetime.timezone.utc)
    if "e2e" in wanted:
        rows += suites.e2e(
            device,
            [s for s in args.shapes.split(",") if s],
            [v for v in args.variants.split(",") if v] or None,
            args.samples or None,
            sidecar_options,
        )
    if "transfer" in wanted:
        rows += suites.transfer(device, args.samples or None)
    if "throughput" in wanted:
        rows += suites.throughput(
            device, args.clients, args.requests, args.throughput_shape, sidecar_options
        )
    if "stream" in wanted:
        rows += suites.streaming(
            device, args.stream_shape, args.chunk, args.pace_ms, args.samples or None
        )
    if "memory" in wanted:
        rows += suites.memory()
    meta = {
        "date": started.isoformat(timespec="seconds"),
        "command": "python -m bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "device": args.device,
        "machine": machine(),
        "commit": git_commit(),
    }
    text = markdown(meta, rows)
    print("\n" + text)
    if args.json:
        write_json(args.json, meta, rows)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text)
    if args.plot:
        plot(rows, args.plot, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
