"""Command line: `video-sidecar serve | demo | status | health | config | encode`.

The benchmark is not part of the package: `python -m bench` in a source checkout.

Every command answers a problem with one line on stderr and a non-zero status (`exits`): 2
for a usage or input problem, 1 for a failure, 128 + the signal's number when stopped by
Ctrl-C, SIGTERM or SIGHUP. Only `__main__` exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from .. import logs
from ..config import Config
from ..config_values import format_size, socket_path
from ..errors import StartupError
from ..vocabulary import default_socket
from .cli_args import build_parser, join_negative_values
from .exits import EXIT_INTERRUPTED, Terminated, terminate

if TYPE_CHECKING:
    from client import Live, SidecarClient

log = logging.getLogger("sidecar")
T = TypeVar("T")


def _socket(arg: str | None) -> str:
    """The daemon's address: a Unix socket path made absolute (a bare `name` is a file
    here, not a host), or a network target as given (`HOST:PORT`)."""
    target = arg or os.environ.get(Config.env_name("socket")) or default_socket()
    return socket_path(target) or target


def _unreachable(socket: str, exc: Exception, timeout: float) -> str:
    """One line for a daemon that did not answer: no raw gRPC text unless it helps."""
    from client import DeadlineExceeded, SidecarUnavailable

    from .launcher import permission_denied

    if socket_path(socket) is None:  # a network target
        start = f"video-sidecar serve --tcp {socket}"
    elif socket == default_socket():
        start = "video-sidecar serve"
    else:
        start = f"video-sidecar serve --socket {socket}"
    denied = permission_denied(socket) if isinstance(exc, SidecarUnavailable) else ""
    if denied:
        return denied
    if isinstance(exc, SidecarUnavailable):
        return (
            f"no daemon answers at {socket} (none runs there, or it is shutting down); "
            f"start one with `{start}`"
        )
    if isinstance(exc, DeadlineExceeded):
        return f"the daemon at {socket} did not answer within {timeout:g}s"
    return f"the daemon at {socket} failed: {type(exc).__name__}: {exc}"


def serve(args: argparse.Namespace) -> int:
    from ..face.metrics import require_client
    from ..face.server import Server

    try:
        config = Config.load(args)
    except ValueError as exc:
        print(f"video-sidecar: bad configuration: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_level, config.log_json)
    try:
        if config.metrics:  # before the socket and the pool are made, not after
            require_client()
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
            overwrite=args.overwrite,
            shm_prefix=args.shm_prefix,
        )
    )


def _ask(args: argparse.Namespace, question: Callable[[SidecarClient], T]) -> T | None:
    """The answer of the daemon at --socket within --timeout; None, said on stderr, when
    it gives none."""
    from client import SidecarClient, SidecarError

    socket = _socket(args.socket)
    try:
        with SidecarClient(socket, timeout=args.timeout, prepare=False) as client:
            return question(client)
    except SidecarError as exc:
        print(f"video-sidecar: {_unreachable(socket, exc, args.timeout)}", file=sys.stderr)
        return None


def status(args: argparse.Namespace) -> int:
    report = _ask(args, lambda client: client.status())
    if report is None:
        return 1
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
        return 0
    pool = report.pool
    print(
        f"video-sidecar {report.server_version}, instance {report.instance_id}, "
        f"up {report.uptime_s:.0f}s"
    )
    print(
        f"clients  {report.live_clients} live (holding a lease, encoding, waiting for room, or "
        f"called in the last lease TTL); {report.clients_attached} attached and remembered"
    )
    print(f"output   {report.output_dir}")
    print(
        f"pool     {format_size(pool.get('leased_bytes', 0))} of "
        f"{format_size(pool.get('total_bytes', 0))} leased in {pool.get('active_leases', 0)} "
        f"leases ({pool.get('slabs', 0)} slabs of {format_size(pool.get('slab_size', 0))} "
        f"in {report.shm_dir}/{report.shm_prefix}*)"
    )
    print(
        f"encodes  {report.active_encodes} running, {report.queued_encodes} queued, "
        f"limit {report.max_concurrent_encodes}"
    )
    c = report.counters
    for line in _counter_lines(c):
        print(line)
    refused = ", ".join(f"{k}={v}" for k, v in sorted(c.get("lease_refusals", {}).items()))
    print(
        f"leases   {c.get('lease_waits', 0)} waited for room, "
        f"{c.get('lease_wait_s', 0.0):.1f}s in all" + (f"; refused {refused}" if refused else "")
    )
    for i, w in enumerate(report.lease_waiters, 1):
        print(
            f"waiting  {i}. {w['client']}: {format_size(w['bytes'])} in {w['regions']} "
            f"region(s), {w['waited_s']:.1f}s"
        )
    return 0


def _counter_lines(c: dict[str, Any]) -> list[str]:
    """The totals, each request under one label so that they add up; errors, and the
    routine outcomes apart from them."""
    requests, ok, failed = c.get("requests", 0), c.get("encodes_ok", 0), c.get("encodes_failed", 0)
    cancelled = c.get("encodes_cancelled", 0)
    expired, spares = c.get("leases_expired", 0), c.get("spares_expired", 0)
    lines = [
        f"totals   {requests} requests: {ok} ok, {failed - cancelled} failed, {cancelled} "
        f"cancelled, {max(0, requests - ok - failed)} in flight; "
        f"{c.get('frames_encoded', 0)} frames, {expired - spares} leases expired"
    ]
    if c.get("errors"):
        lines.append("errors   " + ", ".join(f"{k}={v}" for k, v in sorted(c["errors"].items())))
    freed = c.get("releases_already_freed", 0)
    if freed or spares:
        lines.append(
            f"routine  {freed} release{'s' if freed != 1 else ''} of leases already freed, "
            f"{spares} spare lease{'s' if spares != 1 else ''} left unused"
        )
    return lines


def config(args: argparse.Namespace) -> int:
    try:
        effective, sources = Config.load_with_sources(args)
    except ValueError as exc:
        print(f"video-sidecar: bad configuration: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"config": effective.as_dict(), "sources": sources}, indent=2))
    else:
        print(CONFIG_HEADER)
        print(effective.to_toml(sources), end="")
    return 0


# A TOML comment: the output stays a config file `serve --config` reads.
CONFIG_HEADER = (
    "# What `video-sidecar serve` would start with here (these flags, VIDEO_SIDECAR_*\n"
    "# variables and config file). A running daemon's output directory and pool:\n"
    "# `video-sidecar status`."
)


def health(args: argparse.Namespace) -> int:
    state = _ask(args, lambda client: client.health())
    if state is None:
        return 1
    print(state)
    return 0 if state == "SERVING" else 1


def encode(args: argparse.Namespace) -> int:
    from .preview_args import image_flags_alone, previews_of
    from .tool import EncodeCommand, run

    if args.audio and args.sample_rate is None:
        print("video-sidecar: --audio needs --sample-rate HZ", file=sys.stderr)
        return 2
    if image_flags_alone(args):
        print(
            "video-sidecar: --image-format and --image-quality need --thumbnail or --sprite-sheet",
            file=sys.stderr,
        )
        return 2
    thumbnail, sprite_sheet = previews_of(args)
    logs.configure("warning")
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
            value_range=(args.value_range.low, args.value_range.high),
            container=args.container or "",  # "": the one -o's extension says
            audio=args.audio,
            sample_rate=args.sample_rate,
            overwrite=args.overwrite,
            shm_prefix=args.shm_prefix,
            thumbnail=thumbnail,
            sprite_sheet=sprite_sheet,
            live=_live(args),
        )
    )


def _live(args: argparse.Namespace) -> Live | None:
    """`--live FOLDER` and its lengths; the daemon judges their ranges."""
    from client import Live

    if args.live is None:
        return None
    return Live(args.live, args.live_segment, args.live_part, overwrite=args.overwrite)


@contextlib.contextmanager
def _stopped_as_by_ctrl_c(wanted: bool) -> Iterator[None]:
    """SIGTERM and SIGHUP (a job's timeout, a closed terminal) stop the command as Ctrl-C
    does, instead of killing it with its daemon and `.part` file left behind."""
    if not wanted or threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.signal(sig, terminate) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


COMMANDS = {
    "serve": serve,
    "demo": demo,
    "status": status,
    "health": health,
    "config": config,
    "encode": encode,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        try:
            argv = join_negative_values(Config.compat_bool_args(argv))
        except ValueError as exc:
            print(f"video-sidecar: {exc}", file=sys.stderr)
            return 2
        args = build_parser().parse_args(argv)
        with _stopped_as_by_ctrl_c(args.command != "serve"):  # serve has its own handlers
            code = COMMANDS[args.command](args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
        return code
    except Terminated as exc:
        # Cleaned up on the way out, as for Ctrl-C (an auto-started daemon too).
        print(f"video-sidecar: stopped by {exc}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        # Whatever was running cleaned up on the way out (an auto-started daemon too).
        end_line = "\n" if sys.stderr.isatty() else ""  # after the terminal's ^C
        print(f"{end_line}video-sidecar: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`video-sidecar status | head -1`): not worth a word.
        # Point stdout at /dev/null so that the interpreter's final flush fails silently.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
