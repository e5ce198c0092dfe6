"""The daemon's configuration: one typed dataclass is the source of every setting.

Each field becomes a command-line flag (`--slab-size`), an environment variable
(`VIDEO_SIDECAR_SLAB_SIZE`) and a key of the optional TOML file (`slab_size`, or
`slab-size`). Precedence, highest first:

    command-line flag  >  environment variable  >  config file  >  built-in default

The file is named by `--config` or `VIDEO_SIDECAR_CONFIG`.

The slab pool's `slabs` and `slab_size` default to `auto` (0 here): a Config sizes them
to the host as it is made (`pool_sizing`), so a Config never holds a 0 there; what chose
them is in `pool_reason`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import pool_sizing
from .codec.ceiling import (
    DEFAULT_MAX_LOOKAHEAD,
    DEFAULT_MAX_PRESET,
    parse_max_lookahead,
    parse_max_preset,
)
from .codec.memory import RELEASE_S
from .config_values import (
    AUTO,
    ENV_PREFIX,
    FALSE_WORDS,
    MAX_SLABS,
    TRUE_WORDS,
    argument_type,
    config_problems,
    default_concurrency,
    default_encoder_processes,
    default_output_dir,
    default_shm_prefix,
    format_size,
    parse_bool,
    parse_float,
    parse_int,
    parse_size,
    parse_slab_size,
    parse_slabs,
    read_toml,
)
from .vocabulary import default_socket


def _opt(
    help: str,
    parse: Callable[[str], Any] = str,
    metavar: str | None = None,
    shown: str | Callable[[], str] | None = None,
) -> dict[str, Any]:
    """A field's flag: help text, parser of its text form, and how `--help` shows its
    default when the value itself would mislead (it depends on the machine; a callable
    is asked when the help is made)."""
    return {"help": help, "parse": parse, "metavar": metavar, "shown": shown}


def _at_least_one(text: str) -> int:
    value = parse_int(text)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    value = parse_float(text)
    if value <= 0:
        raise ValueError(f"must be a positive number of seconds, got {value:g}")
    return value


def _pool_here() -> tuple[int, int, str]:
    """The pool `auto` gives with the default --shm-dir and concurrency."""
    return pool_sizing.resolve(default_concurrency(), "/dev/shm")


def _slabs_here() -> str:
    return f"{AUTO}: {_pool_here()[0]} here"


def _slab_size_here() -> str:
    # "64MiB" first: that is the size unless the host is small.
    size = _pool_here()[1]
    return format_size(pool_sizing.SLAB_SIZE) + (
        "" if size == pool_sizing.SLAB_SIZE else f"; {format_size(size)} here"
    )


@dataclass(frozen=True)
class Config:
    socket: str = field(
        default_factory=default_socket,
        metadata=_opt("Unix socket to listen on", metavar="PATH"),
    )
    tcp: str = field(
        default="",
        metadata=_opt("also listen on TCP HOST:PORT; needs TLS or --insecure", metavar="HOST:PORT"),
    )
    tls_cert: str = field(
        default="", metadata=_opt("TLS certificate (PEM) for TCP", metavar="FILE")
    )
    tls_key: str = field(default="", metadata=_opt("TLS private key (PEM) for TCP", metavar="FILE"))
    tls_client_ca: str = field(
        default="",
        metadata=_opt("require client certificates signed by this CA (PEM)", metavar="FILE"),
    )
    insecure: bool = field(
        default=False,
        metadata=_opt("allow TCP without TLS (trusted networks only)", parse_bool, "BOOL"),
    )
    framed_socket: bool = field(
        default=True,
        metadata=_opt(
            "also serve one-reply encodes, leases and releases on SOCKET.framed, without "
            "HTTP/2, for this host's clients",
            parse_bool,
            "BOOL",
        ),
    )
    framed_connections: int = field(
        default=1024,
        metadata=_opt(
            "connections the framed socket keeps open at once; more are refused "
            "(RESOURCE_EXHAUSTED)",
            _at_least_one,
            "N",
        ),
    )
    framed_connections_per_uid: int = field(
        default=256,
        metadata=_opt(
            "framed-socket connections one user (the peer's uid) keeps open at once; more "
            "are refused (RESOURCE_EXHAUSTED)",
            _at_least_one,
            "N",
        ),
    )
    framed_message_timeout: float = field(
        default=10.0,
        metadata=_opt(
            "seconds a framed connection gets for its preamble, for a request once its "
            "first byte came, and to read on in a reply; then it is closed (the time "
            "between requests has no limit)",
            _positive_seconds,
            "SECONDS",
        ),
    )
    output_dir: str = field(
        default_factory=default_output_dir,
        metadata=_opt("root directory for file outputs; paths are confined to it", metavar="DIR"),
    )
    shm_dir: str = field(
        default="/dev/shm",
        metadata=_opt("directory the slabs live in (a tmpfs)", metavar="DIR"),
    )
    shm_prefix: str = field(
        default_factory=default_shm_prefix,
        metadata=_opt(
            "name prefix of this instance's slabs; one daemon per prefix", metavar="NAME"
        ),
    )
    shm_group: str = field(
        default="",
        metadata=_opt(
            "group allowed to map the slabs and use the socket (mode 0660)", metavar="GROUP"
        ),
    )
    # 0 is auto (the text `auto`): sized to the host in __post_init__; see pool_sizing.
    slabs: int = field(
        default=0,
        metadata=_opt(
            f"number of shared-memory slabs, 1 to {MAX_SLABS}, or {AUTO}: 3 for each "
            "concurrent encode (one 1344x768x122 4:2:0 video in 64MiB slabs), at least 4, "
            "at most what half of --shm-dir and a quarter of the memory hold",
            parse_slabs,
            "N",
            shown=_slabs_here,
        ),
    )
    slab_size: int = field(
        default=0,
        metadata=_opt(
            f"size of each slab; also the largest single lease; {AUTO}: 64MiB, or less "
            "(down to 8MiB) where 4 slabs of 64MiB would take over half of --shm-dir or a "
            "quarter of the memory",
            parse_slab_size,
            "SIZE",
            shown=_slab_size_here,
        ),
    )
    max_concurrent_encodes: int = field(
        default_factory=default_concurrency,
        metadata=_opt(
            "encodes that run at once; more wait in a queue",
            parse_int,
            "N",
            shown=f"cores / 2, at most 16: {default_concurrency()} here",
        ),
    )
    encoder_threads: int = field(
        default=0,
        metadata=_opt(
            "threads per encode; 0 shares the cores among running encodes", parse_int, "N"
        ),
    )
    warm_encoders: int = field(
        default=2,
        metadata=_opt(
            "encoders opened ahead of time for recently served short-clip settings; 0: off",
            parse_int,
            "N",
        ),
    )
    encoder_processes: int = field(
        default_factory=default_encoder_processes,
        metadata=_opt(
            "processes that encode videos beside the daemon, started as needed; 0: off",
            parse_int,
            "N",
            shown=f"the cores, 3 to 16; 0 on one core: {default_encoder_processes()} here",
        ),
    )
    idle_release: float = field(
        default=RELEASE_S,
        metadata=_opt(
            "seconds without an encode after which ready encoders close, encoder processes "
            "beyond the first three stop, and their memory goes back",
            parse_float,
            "SECONDS",
        ),
    )
    lease_ttl: float = field(
        default=30.0,
        metadata=_opt(
            "seconds an unused lease lives before it is reclaimed", parse_float, "SECONDS"
        ),
    )
    max_lease_wait: float = field(
        default=30.0,
        metadata=_opt("longest a Lease call may wait for room", parse_float, "SECONDS"),
    )
    max_frames: int = field(default=100_000, metadata=_opt("frames per request", parse_int, "N"))
    max_width: int = field(default=8192, metadata=_opt("frame width limit", parse_int, "PIXELS"))
    max_height: int = field(default=8192, metadata=_opt("frame height limit", parse_int, "PIXELS"))
    max_request_bytes: int = field(
        default=64 * 1024**3,
        metadata=_opt("raw bytes per request", parse_size, "SIZE"),
    )
    max_preset: str = field(
        default=DEFAULT_MAX_PRESET,
        metadata=_opt(
            "the slowest encoder preset a request may ask for, an x264/x265 name "
            "(ultrafast ... placebo; SVT-AV1 and VP9 presets of like cost are held to it); "
            "slower ones are refused",
            parse_max_preset,
            "PRESET",
        ),
    )
    max_lookahead: int = field(
        default=DEFAULT_MAX_LOOKAHEAD,
        metadata=_opt(
            "the most frames a request may ask its encoder to look ahead (rc-lookahead, "
            "lookahead, lag-in-frames), 0 to 250; more is refused",
            parse_max_lookahead,
            "FRAMES",
        ),
    )
    metrics: str = field(
        default="",
        metadata=_opt("serve Prometheus metrics on HOST:PORT (needs prometheus-client)",
                      metavar="HOST:PORT"),
    )  # fmt: skip
    shutdown_grace: float = field(
        default=30.0,
        metadata=_opt("seconds in-flight encodes get to finish on SIGTERM", parse_float, "SECONDS"),
    )
    log_level: str = field(
        default="info", metadata=_opt("debug, info, warning or error", metavar="LEVEL")
    )
    log_json: bool = field(default=False, metadata=_opt("log JSON lines", parse_bool, "BOOL"))

    def __post_init__(self) -> None:
        problems = config_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        if self.slabs == 0 or self.slab_size == 0:
            slabs, slab_size, why = pool_sizing.resolve(
                self.max_concurrent_encodes, self.shm_dir, self.slabs, self.slab_size
            )
            # Frozen: the one place these are set after __init__.
            object.__setattr__(self, "slabs", slabs)
            object.__setattr__(self, "slab_size", slab_size)
            object.__setattr__(self, "_pool_reason", why)

    @property
    def pool_reason(self) -> str:
        """Why the pool is the size it is when `auto` chose its count or size; "" when
        both were configured. Not a field: no flag, and `dataclasses.replace` passes the
        chosen numbers on as configured ones."""
        reason: str = self.__dict__.get("_pool_reason", "")
        return reason

    @property
    def slab_alignment(self) -> int:
        return 4096

    @staticmethod
    def env_name(name: str) -> str:
        return ENV_PREFIX + name.upper()

    @staticmethod
    def flag_name(name: str) -> str:
        return "--" + name.replace("_", "-")

    @classmethod
    def bool_fields(cls) -> frozenset[str]:
        # Annotations are strings here (from __future__ import annotations).
        return frozenset(f.name for f in dataclasses.fields(cls) if f.type in ("bool", bool))

    @classmethod
    def default_text(cls, f: dataclasses.Field[Any]) -> str:
        """A field's default as `--help` shows it."""
        shown = f.metadata["shown"]
        if shown:
            return str(shown() if callable(shown) else shown)
        factory: Any = f.default_factory
        value: Any = factory() if factory is not dataclasses.MISSING else f.default
        if isinstance(value, bool):
            return "true" if value else "false"
        if value == "":
            return "none"
        if f.metadata["parse"] is parse_size:
            return format_size(value)
        return str(value)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add one flag per field; defaults stay None so unset flags fall through.

        A boolean is a bare flag with a `--no-` form (`--insecure`, `--no-insecure`);
        `compat_bool_args` turns the older `--insecure true` into that before parsing."""
        bools = cls.bool_fields()
        for f in dataclasses.fields(cls):
            meta = f.metadata
            # argparse %-formats help: a '%' in a default (a path, say) must be doubled.
            shown = cls.default_text(f).replace("%", "%%")
            help_text = f"{meta['help']} [default: {shown}; env {cls.env_name(f.name)}]"
            if f.name in bools:
                parser.add_argument(
                    cls.flag_name(f.name),
                    dest=f.name,
                    default=None,
                    action=argparse.BooleanOptionalAction,
                    help=help_text,
                )
                continue
            parser.add_argument(
                cls.flag_name(f.name),
                dest=f.name,
                default=None,
                type=argument_type(meta["parse"]),
                metavar=meta["metavar"],
                help=help_text,
            )

    @classmethod
    def add_config_argument(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--config",
            dest="config_file",
            default=None,
            metavar="FILE",
            help=f"TOML file of settings (keys as the flags) [env {ENV_PREFIX}CONFIG]",
        )

    @classmethod
    def compat_bool_args(cls, argv: Sequence[str]) -> list[str]:
        """Accept the older `--insecure true` / `--insecure=false` spellings of boolean
        flags (any word `parse_bool` takes) by rewriting them as `--insecure` /
        `--no-insecure`. A bare flag followed by anything else is left alone; ValueError
        for `--insecure=maybe`."""
        flags = {cls.flag_name(name) for name in cls.bool_fields()}
        words = TRUE_WORDS | FALSE_WORDS
        out: list[str] = []
        i = 0
        while i < len(argv):
            token = argv[i]
            if token == "--":  # everything after it is positional
                out += argv[i:]
                break
            name, has_value, value = token.partition("=")
            if name in flags:
                if has_value:
                    try:
                        on = parse_bool(value)
                    except ValueError:
                        raise ValueError(
                            f"{name}={value}: {name} is a bare flag (or {name} true|false); "
                            f"use {name} or --no-{name[2:]}"
                        ) from None
                    token = name if on else "--no-" + name[2:]
                elif i + 1 < len(argv) and argv[i + 1].strip().lower() in words:
                    i += 1
                    token = name if parse_bool(argv[i]) else "--no-" + name[2:]
            out.append(token)
            i += 1
        return out

    @classmethod
    def to_args(cls, options: Mapping[str, Any]) -> list[str]:
        """`serve` flags for settings: `{"slabs": 4, "insecure": True}` -> `--slabs 4
        --insecure`. Booleans may also be given as text ("true", "no")."""
        bools = cls.bool_fields()
        args: list[str] = []
        for key, value in options.items():
            if value is None:
                continue
            name = key.replace("-", "_")
            flag = cls.flag_name(name)
            if name in bools:
                on = value if isinstance(value, bool) else parse_bool(str(value))
                args.append(flag if on else "--no-" + flag[2:])
            elif str(value).startswith("-"):  # a negative number, say: keep it a value
                args.append(f"{flag}={value}")
            else:
                args += [flag, str(value)]
        return args

    @classmethod
    def load(
        cls,
        args: argparse.Namespace | Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Config:
        """Build a config from flags, environment and file, in precedence order."""
        return cls.load_with_sources(args, environ)[0]

    @classmethod
    def load_with_sources(
        cls,
        args: argparse.Namespace | Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> tuple[Config, dict[str, str]]:
        """The config, and where each value came from: flag, env, file or default."""
        environ = os.environ if environ is None else environ
        given = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
        file = given.get("config_file") or environ.get(ENV_PREFIX + "CONFIG") or ""
        from_file = read_file(file) if file else {}
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for f in dataclasses.fields(cls):
            parse = f.metadata["parse"]
            raw = environ.get(cls.env_name(f.name))
            if given.get(f.name) is not None:
                values[f.name], sources[f.name] = given[f.name], "flag"
            elif raw is not None and raw != "":
                try:
                    values[f.name] = parse(raw)
                except ValueError as exc:
                    raise ValueError(f"{cls.env_name(f.name)}: {exc}") from None
                sources[f.name] = "env"
            elif f.name in from_file:
                values[f.name] = cls._from_file(f, from_file[f.name], file)
                sources[f.name] = f"file {file}"
            else:
                sources[f.name] = "default"
        return cls(**values), sources

    @classmethod
    def _from_file(cls, f: dataclasses.Field[Any], value: Any, file: str) -> Any:
        """A TOML value: booleans must be TOML booleans, everything else a number or
        a string (a size may be either: 1048576 or "1MiB")."""
        is_bool = f.name in cls.bool_fields()
        if is_bool != isinstance(value, bool):
            want = "true or false (a TOML boolean)" if is_bool else "a number or a string"
            raise ValueError(f"config file {file}: {f.name} must be {want}, not {value!r}")
        if is_bool:
            return value
        if not isinstance(value, (str, int, float)):
            raise ValueError(
                f"config file {file}: {f.name} must be a number or a string, not {value!r}"
            )
        try:
            return f.metadata["parse"](str(value))
        except ValueError as exc:
            raise ValueError(f"config file {file}: {f.name}: {exc}") from None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self, sources: Mapping[str, str] | None = None) -> str:
        """The settings as a TOML file would give them, each with where it came from."""
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, (int, float)):
                text = repr(value)
            else:
                text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
            source = sources[f.name] if sources else ""
            if source == "default" and self.pool_reason and f.name in ("slabs", "slab_size"):
                source += f" ({AUTO} on this host)"  # what auto chose here
            note = f"  # {source}" if source else ""
            lines.append(f"{f.name} = {text}{note}")
        return "\n".join(lines) + "\n"


def read_file(path: str | Path) -> dict[str, Any]:
    """Settings from a TOML file; keys may use '_' or '-'. Unknown keys are errors."""
    known = {f.name for f in dataclasses.fields(Config)}
    settings = {}
    for key, value in read_toml(path).items():
        name = key.replace("-", "_")
        if name not in known:
            raise ValueError(f"config file {path}: unknown setting {key!r}")
        settings[name] = value
    return settings
