"""Command line: `video-sidecar serve | demo | status | health | config | encode | bench`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from . import __version__, logs
from .config import Config, default_socket, format_size
from .errors import StartupError

log = logging.getLogger("sidecar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="video-sidecar",
        description="Video-output daemon for GPU generation servers.",
    )
    parser.add_argument("--version", action="version", version=f"video-sidecar {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the daemon")
    Config.add_config_argument(serve)
    Config.add_arguments(serve)

    config = commands.add_parser(
        "config", help="print the effective configuration, and where each value comes from"
    )
    Config.add_config_argument(config)
    Config.add_arguments(config)
    config.add_argument("--json", action="store_true", help="print JSON")

    socket_help = "daemon socket [env VIDEO_SIDECAR_SOCKET]"
    demo = commands.add_parser(
        "demo", help="encode a generated video end to end (starts a daemon if needed)"
    )
    demo.add_argument("--socket", help=socket_help)
    demo.add_argument("--frames", type=int, default=122)
    demo.add_argument("--width", type=int, default=1344)
    demo.add_argument("--height", type=int, default=768)
    demo.add_argument("--fps", type=float, default=24.0)
    demo.add_argument("--output", default="", help="path under the output root")

    status = commands.add_parser("status", help="show pool occupancy, encodes and counters")
    status.add_argument("--socket", help=socket_help)
    status.add_argument("--json", action="store_true", help="print JSON")

    health = commands.add_parser(
        "health", help="exit 0 if the daemon answers SERVING (for probes and HEALTHCHECK)"
    )
    health.add_argument("--socket", help=socket_help)
    health.add_argument("--timeout", type=float, default=5.0)

    encode = commands.add_parser("encode", help="encode a .npy video (frames as uint8 or float)")
    encode.add_argument("source", metavar="FILE.npy")
    encode.add_argument("-o", "--output", default="", help="local file to write (FILE.mp4)")
    encode.add_argument("--socket", help=socket_help)
    encode.add_argument("--fps", type=float, default=24.0)
    encode.add_argument("--codec", default="", help="h264 (default), h265, av1, vp9 (webm)")
    encode.add_argument("--crf", type=int)
    encode.add_argument("--preset")
    encode.add_argument("--pixel-format", help="rgb24 (default), yuv420p, nv12, ...")
    encode.add_argument("--layout", help="THWC, TCHW, CTHW or BCTHW")
    encode.add_argument("--value-range", default="0,1", help="for floats: 0,1 or -1,1")
    encode.add_argument("--container", default="mp4", choices=["mp4", "fmp4", "webm"])
    encode.add_argument("--audio", default="", metavar="PCM.npy", help="(samples, channels)")
    encode.add_argument("--sample-rate", type=int)

    bench = commands.add_parser(
        "bench", help="run the benchmark (python -m bench) from a source checkout"
    )
    bench.add_argument("args", nargs="*", help="arguments for python -m bench (see its --help)")
    return parser


def _socket(arg: str | None) -> str:
    return arg or os.environ.get("VIDEO_SIDECAR_SOCKET") or default_socket()


def serve(args: argparse.Namespace) -> int:
    from .server import Server

    try:
        config = Config.load(args)
    except ValueError as exc:
        print(f"video-sidecar: bad configuration: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_level, config.log_json)
    try:
        Server(config).run()
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0


def demo(args: argparse.Namespace) -> int:
    from .demo import DemoOptions, run

    logs.configure("warning")
    return run(
        DemoOptions(
            socket=_socket(args.socket),
            frames=args.frames,
            width=args.width,
            height=args.height,
            fps=args.fps,
            output=args.output,
        )
    )


def status(args: argparse.Namespace) -> int:
    from client import SidecarClient, SidecarError

    try:
        with SidecarClient(_socket(args.socket)) as client:
            report = client.status()
    except SidecarError as exc:
        print(f"video-sidecar: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
        return 0
    pool = report.pool
    print(
        f"video-sidecar {report.server_version}, instance {report.instance_id}, "
        f"up {report.uptime_s:.0f}s, {report.clients} clients"
    )
    print(
        f"pool     {format_size(pool.get('leased_bytes', 0))} of "
        f"{format_size(pool.get('total_bytes', 0))} leased in {pool.get('active_leases', 0)} "
        f"leases ({pool.get('slabs', 0)} slabs of {format_size(pool.get('slab_size', 0))})"
    )
    print(
        f"encodes  {report.active_encodes} running, {report.queued_encodes} queued, "
        f"limit {report.max_concurrent_encodes}"
    )
    c = report.counters
    print(
        f"totals   {c.get('requests', 0)} requests, {c.get('encodes_ok', 0)} ok, "
        f"{c.get('encodes_failed', 0)} failed, {c.get('frames_encoded', 0)} frames, "
        f"{c.get('leases_expired', 0)} leases expired"
    )
    if c.get("errors"):
        print("errors   " + ", ".join(f"{k}={v}" for k, v in sorted(c["errors"].items())))
    return 0


def config(args: argparse.Namespace) -> int:
    try:
        effective, sources = Config.load_with_sources(args)
    except ValueError as exc:
        print(f"video-sidecar: bad configuration: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"config": effective.as_dict(), "sources": sources}, indent=2))
    else:
        print(effective.to_toml(sources), end="")
    return 0


def health(args: argparse.Namespace) -> int:
    from client import SidecarClient, SidecarError

    try:
        with SidecarClient(_socket(args.socket), timeout=args.timeout) as client:
            state = client.health()
    except SidecarError as exc:
        print(f"unreachable: {exc}", file=sys.stderr)
        return 1
    print(state)
    return 0 if state == "SERVING" else 1


def encode(args: argparse.Namespace) -> int:
    from .tool import EncodeCommand, run

    logs.configure("warning")
    try:
        low, high = (float(v) for v in args.value_range.split(","))
    except ValueError:
        print("video-sidecar: --value-range takes LOW,HIGH, e.g. -1,1", file=sys.stderr)
        return 2
    return run(
        EncodeCommand(
            source=args.source,
            output=args.output,
            socket=_socket(args.socket),
            fps=args.fps,
            codec=args.codec,
            crf=args.crf,
            preset=args.preset,
            pixel_format=args.pixel_format,
            layout=args.layout,
            value_range=(low, high),
            container=args.container,
            audio=args.audio,
            sample_rate=args.sample_rate,
        )
    )


def bench(args: argparse.Namespace) -> int:
    if os.path.exists(os.path.join("bench", "__main__.py")) and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a source checkout: its bench/ is not installed
    try:
        from bench.__main__ import main as bench_main
    except ImportError:
        print(
            "video-sidecar bench runs the benchmark of a source checkout: run it from the "
            "repository's root (it holds bench/), or use `python -m bench` there",
            file=sys.stderr,
        )
        return 2
    return bench_main(args.args)


COMMANDS = {
    "serve": serve,
    "demo": demo,
    "status": status,
    "health": health,
    "config": config,
    "encode": encode,
    "bench": bench,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # everything after it belongs to the benchmark
        return bench(argparse.Namespace(args=argv[1:]))
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command](args)
