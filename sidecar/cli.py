"""Command line: `video-sidecar serve | demo | status`."""

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
    Config.add_arguments(serve)

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


COMMANDS = {"serve": serve, "demo": demo, "status": status}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command](args)
