"""`python -m bench`: side-by-side benchmarks, written down with date, machine and command.

python -m bench --device cpu --json out.json              # the end-to-end table
python -m bench --device cuda --content smooth,noisy --json out.json
python -m bench --device cuda --concurrency 8 --json out.json  # 8 threads per variant
python -m bench --device cuda --suite node --json node.json    # a worker process per GPU
python -m bench --device cuda --suite traffic --json traffic.json  # contention; what fails
python -m bench --device cuda --suite all --json out.json # everything, on a GPU host
python -m bench --shapes 448x256x4,1344x768x122 --samples 5 --plot table.png
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from sidecar.vocabulary import PROFILES

from . import node, suites, traffic
from .common import (
    CONTENTS,
    PATTERNS,
    PROFILE_ENV,
    SHAPES,
    Device,
    Row,
    encode_settings,
    git_commit,
    machine,
    read_json,
    write_json,
)
from .report import markdown, plot


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    _what_flags(p)
    _load_flags(p)
    _traffic_flags(p)
    _shape_and_output_flags(p)
    return p


def _what_flags(p: argparse.ArgumentParser) -> None:
    """What runs, where the frames start, and how the e2e requests are sent."""
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where frames start: host memory, or a CUDA tensor (timed from GPU-ready)",
    )
    p.add_argument(
        "--suite",
        default="e2e",
        help="comma list of e2e, transfer, throughput, stream, memory, node, traffic, or 'all'",
    )
    p.add_argument(
        "--profile",
        choices=PROFILES,
        default=None,
        help="the daemon's profile, and every variant's x264 settings with it (default: "
        "$VIDEO_SIDECAR_PROFILE, else the daemon's default, balanced)",
    )
    p.add_argument(
        "--pattern",
        choices=list(PATTERNS),
        default="steady",
        help="e2e: 'steady' sends each variant's samples back to back (a busy server); "
        "'spaced' interleaves the variants per sample, leaving the daemon idle between them",
    )
    p.add_argument(
        "--content",
        default="smooth",
        help="comma list of "
        + ", ".join(f"{k} (noise {v})" for k, v in CONTENTS.items())
        + "; each encoding suite runs once per content",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="e2e: threads running each variant at once, each request back to back "
        "(each its own client for the sidecar)",
    )


def _load_flags(p: argparse.ArgumentParser) -> None:
    """How much each suite sends, and with how many workers and clients."""
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="node: worker processes (default: one per visible GPU; 2 with --device cpu); "
        "traffic: worker processes the clients are spread over (default 2)",
    )
    p.add_argument(
        "--max-concurrent-encodes",
        type=int,
        default=0,
        help="e2e, node: the daemon's limit (default: the daemon's own default)",
    )
    p.add_argument("--shapes", default=",".join(SHAPES), help="WxHxT list for e2e")
    p.add_argument(
        "--variants",
        default="",
        help="e2e variants (default all but the last two): upstream_a, upstream_d, "
        "ffmpeg_pipe, sidecar, sidecar_yuv, sidecar_default, sidecar_previews (the default "
        "path without and with a thumbnail and a sprite sheet)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=0,
        help="samples per variant and shape (per thread with --concurrency)",
    )
    p.add_argument(
        "--clients",
        type=int,
        default=None,
        help="throughput: concurrent clients; node: client threads per worker (8 for both); "
        "traffic: clients in all (default 8 with --device cuda, 4 with cpu)",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help="throughput, node: requests per client (default 3); traffic: per client, of "
        "the mix (default 8: each kind once)",
    )
    p.add_argument(
        "--idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="node: then let the daemon idle this long and record its memory (RssAnon of "
        "the daemon and its encoder processes, sampled every 5 s); traffic: how long the "
        "clients and daemon idle before the bursts (default 60)",
    )


def _traffic_flags(p: argparse.ArgumentParser) -> None:
    """The traffic suite's own."""
    p.add_argument(
        "--waves", type=int, default=traffic.WAVES, help="traffic: waves of requests after the idle"
    )
    p.add_argument(
        "--small-pool",
        default="",
        metavar="SLABSxSIZE",
        help="traffic: the small pool (default 4x8MiB with --device cpu, 4x64MiB with cuda)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=traffic.REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help="traffic: each request's deadline",
    )
    p.add_argument(
        "--patterns",
        default="",
        metavar="LIST",
        help="traffic: a comma list of its patterns (default all: "
        + ", ".join(traffic.PATTERNS)
        + ")",
    )


def _shape_and_output_flags(p: argparse.ArgumentParser) -> None:
    """The throughput, node and stream shapes; what is read and written."""
    p.add_argument("--throughput-shape", default="1344x768x122", help="throughput, node: WxHxT")
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


SUITES = {"e2e", "transfer", "throughput", "stream", "memory", "node", "traffic"}


@dataclass(frozen=True)
class TrafficLoad:
    """The traffic suite's clients, requests and idle: its own defaults where a flag was
    left out (the other suites' differ)."""

    clients: int
    requests: int
    idle_s: float


@dataclass(frozen=True)
class Asked:
    """What the flags come to: the suites and contents asked for, the traffic suite's
    load, and the daemon's options."""

    suites: set[str]
    contents: list[str]
    load: TrafficLoad
    daemon_options: dict[str, Any]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.from_json:
        meta, recorded = read_json(args.from_json)
        print(_tables(meta, recorded))
        if args.plot:
            plot(recorded, args.plot, meta)
        return 0
    device = Device(args.device)
    wanted, contents = _check(args)
    if args.profile:  # the daemons the bench starts read it too: one setting for all
        os.environ[PROFILE_ENV] = args.profile
    # What a flag left out means depends on the suite.
    load = TrafficLoad(
        clients=args.clients or traffic.default_clients(args.device),
        requests=args.requests or len(traffic.kinds_for(args.device)),
        idle_s=60.0 if args.idle is None else args.idle,
    )
    args.clients, args.requests, args.idle = args.clients or 8, args.requests or 3, args.idle or 0.0
    daemon_options: dict[str, Any] = {}
    if args.max_concurrent_encodes:
        daemon_options["max_concurrent_encodes"] = args.max_concurrent_encodes
    asked = Asked(wanted, contents, load, daemon_options)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = _run(args, device, asked)
    meta = _meta(args, argv, started, asked)
    text = _tables(meta, rows)
    print("\n" + text)
    if args.json:
        write_json(args.json, meta, rows)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text)
    if args.plot:
        plot(rows, args.plot, meta)
    return 0


def _check(args: argparse.Namespace) -> tuple[set[str], list[str]]:
    """The suites and contents asked for; exits with a message on a flag out of range."""
    wanted = SUITES if args.suite == "all" else set(args.suite.split(","))
    contents = [c for c in args.content.split(",") if c]
    if wanted - SUITES:
        raise SystemExit(f"--suite: unknown {', '.join(sorted(wanted - SUITES))}")
    if not contents or set(contents) - set(CONTENTS):
        raise SystemExit(f"--content: a comma list of {', '.join(CONTENTS)}")
    given = [v for v in (args.clients, args.requests) if v is not None]
    if (
        args.concurrency < 1
        or args.workers < 0
        or min(given, default=1) < 1
        or args.waves < 1
        or args.request_timeout <= 0
    ):
        raise SystemExit(
            "--concurrency, --clients, --requests, --waves: 1 or more; "
            "--workers: 0 or more; --request-timeout: seconds"
        )
    if (args.idle or 0) < 0 or (args.idle and not wanted & {"node", "traffic"}):
        raise SystemExit("--idle: seconds, 0 or more, with --suite node or traffic")
    unknown = set(filter(None, args.patterns.split(","))) - set(traffic.PATTERNS)
    if unknown:
        raise SystemExit(f"--patterns: unknown {', '.join(sorted(unknown))}")
    return wanted, contents


def _run(args: argparse.Namespace, device: Device, asked: Asked) -> list[Row]:
    """Each suite asked for, in a fixed order; their rows, each with its suite and content."""
    wanted, contents, load = asked.suites, asked.contents, asked.load
    daemon_options = asked.daemon_options
    sidecar_options: dict[str, Any] = {}
    rows: list[Row] = []

    def add(suite: str, new: list[Row], content: str = "") -> None:
        for r in new:
            r.suite = r.suite or suite
            r.content = r.content or content
        rows.extend(new)

    if "e2e" in wanted:
        add("e2e", suites.e2e(
            device,
            [s for s in args.shapes.split(",") if s],
            [v for v in args.variants.split(",") if v] or None,
            args.samples or None,
            sidecar_options,
            pattern=args.pattern,
            contents=contents,
            concurrency=args.concurrency,
            daemon_options=daemon_options,
        ))  # fmt: skip
    if "transfer" in wanted:
        add("transfer", suites.transfer(device, args.samples or None, contents[0]), contents[0])
    for content in contents:
        if "throughput" in wanted:
            add("throughput", suites.throughput(device, args.clients, args.requests,
                args.throughput_shape, sidecar_options, content), content)  # fmt: skip
        if "stream" in wanted:
            add("stream", suites.streaming(device, args.stream_shape, args.chunk, args.pace_ms,
                args.samples or None, content), content)  # fmt: skip
    if "node" in wanted:
        add("node", node.node(args.device, args.workers, args.clients, args.requests,
            args.throughput_shape, contents, sidecar_options, daemon_options,
            args.idle))  # fmt: skip
    if "memory" in wanted:
        add("memory", suites.memory())
    if "traffic" in wanted:
        add("traffic", traffic.traffic(args.device, load.clients, args.workers or 2,
            load.requests, contents, load.idle_s, args.waves, args.small_pool,
            args.request_timeout, daemon_options,
            only=tuple(filter(None, args.patterns.split(",")))))  # fmt: skip
    return rows


def _meta(
    args: argparse.Namespace, argv: list[str] | None, started: datetime.datetime, asked: Asked
) -> dict[str, Any]:
    """What the run was: date, command, machine, commit, and each suite's settings."""
    wanted, load = asked.suites, asked.load
    meta = {
        "date": started.isoformat(timespec="seconds"),
        "command": "python -m bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "device": args.device,
        "machine": machine(),
        "commit": git_commit(),
        "content": asked.contents,
        "encoding": encode_settings(),  # every variant's, the sidecar's profile included
    }
    if "e2e" in wanted:
        meta["pattern"] = args.pattern
        meta["concurrency"] = args.concurrency
    if "node" in wanted:
        workers, _ = node.worker_count(args.device, args.workers)
        meta["node"] = {"workers": workers, "clients": args.clients, "requests": args.requests,
                        "shape": args.throughput_shape}  # fmt: skip
    if "traffic" in wanted:
        meta["traffic"] = {"clients": load.clients, "workers": min(args.workers or 2,
                           load.clients), "requests": load.requests,
                           "kinds": [f"{s} {m}" for s, m in traffic.kinds_for(args.device)],
                           "chunk_frames": traffic.CHUNK, "burst_clients": traffic.BURST_CLIENTS,
                           "steady_requests": traffic.STEADY_REQUESTS, "idle_s": load.idle_s,
                           "waves": args.waves, "request_timeout_s": args.request_timeout,
                           "log_fields": traffic.LOG_FIELDS}  # fmt: skip
    if asked.daemon_options:
        meta["daemon_options"] = asked.daemon_options
    return meta


def _tables(meta: dict[str, Any], rows: list[Row]) -> str:
    """The tables: the traffic suite's own, the other suites' as `report.markdown` has them."""
    text = markdown(meta, [r for r in rows if r.suite != "traffic"])
    return "\n".join([text, *traffic.markdown(rows)])


if __name__ == "__main__":
    sys.exit(main())
