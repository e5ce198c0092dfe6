"""The command line's argument parser: commands, their options and help, and the small
value types the options take. `cli` runs the commands."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import __version__
from ..config import Config
from ..config_values import SHM_PREFIX, SHM_PREFIX_RULE
from ..vocabulary import default_socket
from .preview_args import add_preview_options

BOOLEAN_FLAGS_NOTE = (
    "Boolean settings are bare flags with a --no- form (--insecure, --no-insecure); the "
    "older --insecure true|false (also yes/no, 1/0) is still accepted. Environment "
    "variables take true/false, yes/no or 1/0; the config file takes TOML true/false. "
    "Precedence: flag > environment > config file > default."
)


class HelpFormatter(argparse.HelpFormatter):
    """Appends `[default: ...]`, as the settings' help has it, where a default says
    something: not for None, False or '', nor where the help already names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not text
            or "[default:" in text
            or "%(default)" in text
            or action.default in (None, False, "")
            or action.default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return action.help
        return text + " [default: %(default)s]"


class ValueRange:
    """`--value-range LOW,HIGH`: the type of that flag, as a value argparse can show."""

    def __init__(self, text: str) -> None:
        try:
            low, high = (float(part) for part in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not LOW,HIGH (e.g. 0,1 or -1,1)"
            ) from None
        if not low < high:
            raise argparse.ArgumentTypeError(f"{text!r}: LOW must be below HIGH")
        self.low, self.high = low, high

    def __str__(self) -> str:
        return f"{self.low:g},{self.high:g}"


# Flags whose value may begin with '-': argparse would take `-1,1` for an option.
NEGATIVE_VALUE_FLAGS = ("--value-range",)
_NUMBERISH = re.compile(r"^-[\d.]")


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """`--value-range -1,1` -> `--value-range=-1,1`, so both spellings work."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            out += argv[i:]
            break
        if token in NEGATIVE_VALUE_FLAGS and i + 1 < len(argv) and _NUMBERISH.match(argv[i + 1]):
            out.append(f"{token}={argv[i + 1]}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def _number(text: str, kind: type[int] | type[float], noun: str) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a {noun}: {text!r}") from None


def positive_int(text: str) -> int:
    value = int(_number(text, int, "whole number"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float, "number")
    if not 0 < value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _socket_help() -> str:
    shown = default_socket().replace("%", "%%")
    return (
        f"the daemon's Unix socket, or HOST:PORT for one on TCP [default: {shown}; "
        f"env {Config.env_name('socket')}]"
    )


def _address(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must name a socket path or HOST:PORT, got ''")
    return text


def _add_socket(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", metavar="PATH", type=_address, help=_socket_help())


def _shm_prefix(text: str) -> str:
    if text and not re.fullmatch(SHM_PREFIX, text):
        raise argparse.ArgumentTypeError(SHM_PREFIX_RULE.removeprefix("shm_prefix "))
    return text


def _add_shm_prefix(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shm-prefix",
        default="",
        metavar="NAME",
        type=_shm_prefix,
        help=(
            "shm prefix for a daemon this command starts when none answers at --socket "
            f"[default: {Config.env_name('shm_prefix')}, else video-sidecar-$UID for the "
            "default socket and video-sidecar-$UID-<hash of the socket path> for any other]"
        ),
    )


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake told in one line (the usage block is in --help), by
    the command it was made in: `video-sidecar serve --sokcet` points at `video-sidecar
    serve --help`, with the flag meant."""

    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(self, "commands", {}).get(getattr(parsed, "command", None) or "")
            (command or self).error(unknown_words(command or self, extras))
        return parsed


def unknown_words(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """What a command does not take, said with the flag of its that is nearest, if any."""
    flags = [f for f in extras if f.startswith("-")]
    if not flags:
        return f"unexpected argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}"
    word = flags[0].split("=", 1)[0]
    known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    near = difflib.get_close_matches(word, known, n=1)
    return f"unknown flag {word}" + (f"; did you mean {near[0]}?" if near else "")


Commands = Any  # argparse's subparsers action: `add_parser` makes a command


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="video-sidecar",
        description="Video-output daemon for GPU generation servers.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"video-sidecar {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_serve, _config, _demo, _status, _health, _encode):
        add(commands)
    parser.commands = dict(commands.choices)
    return parser


def _command(
    commands: Commands, name: str, help: str, description: str = "", **kw: Any
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=help, description=description or help, formatter_class=HelpFormatter, **kw
    )
    return parser


def _serve(commands: Commands) -> None:
    serve = _command(
        commands,
        "serve",
        "run the daemon",
        "Run the daemon; SIGTERM, SIGINT or SIGHUP shuts it down gracefully, a second one "
        "forces it.",
        epilog=BOOLEAN_FLAGS_NOTE,
    )
    Config.add_config_argument(serve)
    Config.add_arguments(serve)


def _config(commands: Commands) -> None:
    config = _command(
        commands,
        "config",
        "print the configuration `serve` would start with here (these flags, VIDEO_SIDECAR_* "
        "variables and config file), and where each value comes from; a running daemon's "
        "output directory and pool: `video-sidecar status`",
        epilog=BOOLEAN_FLAGS_NOTE,
    )
    Config.add_config_argument(config)
    Config.add_arguments(config)
    config.add_argument("--json", action="store_true", help="print JSON")


def _demo(commands: Commands) -> None:
    demo = _command(
        commands,
        "demo",
        "encode a generated video end to end (starts a daemon if needed)",
        "Encode a generated test video through the real client and print each stage's time. "
        "Starts a daemon for the run when none answers at --socket (its log goes to a file, "
        "printed). The MP4 goes to demo/demo.mp4 under the daemon's output root, replaced on "
        "every run, so runs do not pile up; --output names another file there.",
    )
    _add_socket(demo)
    _add_shm_prefix(demo)
    demo.add_argument("--frames", type=positive_int, default=122, help="number of frames")
    demo.add_argument("--width", type=positive_int, default=1344, help="frame width in pixels")
    demo.add_argument("--height", type=positive_int, default=768, help="frame height in pixels")
    demo.add_argument("--fps", type=positive_float, default=24.0, help="frames per second")
    demo.add_argument(
        "-o",
        "--output",
        default="",
        metavar="PATH",
        help="file to write, relative to the daemon's output root; refused if it exists "
        "unless --overwrite [default: demo/demo.mp4, replaced on every run]",
    )
    demo.add_argument(
        "--overwrite", action="store_true", help="replace the --output file if it exists"
    )


def _add_timeout(parser: argparse.ArgumentParser, default: float) -> None:
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=default,
        help="seconds to wait for the daemon's answer",
    )


def _status(commands: Commands) -> None:
    status = _command(commands, "status", "show pool occupancy, encodes and counters")
    _add_socket(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    _add_timeout(status, 10.0)


def _health(commands: Commands) -> None:
    health = _command(
        commands,
        "health",
        "exit 0 if the daemon answers SERVING (for probes and HEALTHCHECK)",
        "Print the daemon's health (SERVING, NOT_SERVING) and exit 0 only for SERVING.",
    )
    _add_socket(health)
    _add_timeout(health, 5.0)


def _encode(commands: Commands) -> None:
    encode = _command(
        commands,
        "encode",
        "encode a video file (.npy, .npz, torch .pt, a directory of frames) to MP4 or WebM",
        "Encode a video file through the daemon and write the result locally. Starts a "
        "daemon for the command when none answers at --socket, and stops it afterwards.",
    )
    encode.add_argument(
        "source",
        metavar="FILE",
        help="the video: .npy, .npz (one array, or the one named 'video' or 'frames'), a "
        "torch .pt tensor or list of frame tensors (needs torch), or a directory of PNG, "
        "JPEG or WebP frames in name order; frames as uint8 0..255, or float in --value-range",
    )
    encode.add_argument(
        "-o",
        "--output",
        default="",
        metavar="OUT",
        help="local file to write, .mp4 (MP4, or fragmented with --container fmp4) or "
        ".webm (WebM); refused if it exists unless --overwrite [default: FILE's name with "
        ".mp4 (.webm for --container webm), in this directory]",
    )
    encode.add_argument(
        "--overwrite", action="store_true", help="replace the output file if it exists"
    )
    _add_socket(encode)
    _add_shm_prefix(encode)
    encode.add_argument("--fps", type=positive_float, default=24.0, help="frames per second")
    _add_codec_options(encode)
    _add_media_options(encode)
    add_preview_options(encode)
    _add_live_options(encode)


def _add_live_options(encode: argparse.ArgumentParser) -> None:
    """A live LL-HLS/CMAF package beside the output (docs/live.md)."""
    encode.add_argument(
        "--live",
        metavar="FOLDER",
        help="also write a live LL-HLS/CMAF package into FOLDER of the daemon's output root "
        "(index.m3u8, init.mp4, segments and parts; H.264)",
    )
    encode.add_argument(
        "--live-segment",
        type=positive_float,
        default=2.0,
        metavar="S",
        help="the package's segment length in seconds, a keyframe each [default: 2]",
    )
    encode.add_argument(
        "--live-part",
        type=positive_float,
        default=0.5,
        metavar="S",
        help="the package's LL-HLS part length in seconds [default: 0.5]",
    )


def _add_codec_options(encode: argparse.ArgumentParser) -> None:
    """`encode`'s choices of codec, quality and speed."""
    encode.add_argument(
        "--codec",
        default="",
        help="h264, h265, av1, or vp9 (webm only) [default: h264; vp9 in webm]",
    )
    encode.add_argument(
        "--crf",
        type=int,
        help="quality: lower is better and larger [default: the codec's own: h264 18, "
        "h265 20 (0..51); av1 30, vp9 32 (0..63)]",
    )
    encode.add_argument(
        "--preset",
        help="speed against size [default: the codec's fastest: h264/h265 ultrafast "
        "(..., medium, slow, veryslow), av1 10 (-1..13), vp9 realtime (good, best)]",
    )


def _add_media_options(encode: argparse.ArgumentParser) -> None:
    """The form of what `encode` reads and writes: the frames' format, layout and range,
    the container, and audio."""
    encode.add_argument(
        "--pixel-format",
        metavar="FORMAT",
        help="what travels to the daemon: rgb24 (default), yuv420p or nv12 (converted "
        "here, half the bytes), bgr24, rgba, gray",
    )
    encode.add_argument(
        "--layout",
        help="axis order: THWC, TCHW, CTHW or BCTHW [default: guessed from the shape]",
    )
    encode.add_argument(
        "--value-range",
        type=ValueRange,
        default="0,1",
        metavar="LOW,HIGH",
        help="range of float frames: 0,1 or -1,1 (`--value-range -1,1` and "
        "`--value-range=-1,1` both work)",
    )
    encode.add_argument(
        "--container",
        choices=["mp4", "fmp4", "webm"],
        help="mp4, fmp4 (fragmented MP4) or webm (VP9 and Opus); it must agree with -o's "
        "extension [default: the one -o's extension says: .webm webm, .mp4 mp4; else mp4]",
    )
    encode.add_argument(
        "--audio",
        default="",
        metavar="PCM",
        help="audio track to mux: .npy/.npz/.pt of (samples, channels) or (samples,), "
        "float in -1..1 or int16; needs --sample-rate",
    )
    encode.add_argument(
        "--sample-rate", type=int, metavar="HZ", help="sample rate of --audio, 8000..192000"
    )
