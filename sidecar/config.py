"""The daemon's configuration: one typed dataclass is the source of every setting.

Each field becomes a command-line flag (`--slab-size`), an environment variable
(`VIDEO_SIDECAR_SLAB_SIZE`) and a key of the optional TOML file (`slab_size`, or
`slab-size`). Precedence, highest first:

    command-line flag  >  environment variable  >  config file  >  built-in default

The file is named by `--config` or `VIDEO_SIDECAR_CONFIG`.

The slab pool's `slabs` and `slab_size` default to `auto` (0 here): a Config sizes them
to the host as it is made (`pool/sizing.py`), so a Config never holds a 0 there; what chose
them is in `pool_reason`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from . import config_sources
from .codec.ceiling import (
    DEFAULT_MAX_LOOKAHEAD,
    DEFAULT_MAX_PRESET,
    parse_max_lookahead,
    parse_max_preset,
)
from .codec.memory import RELEASE_S
from .config_sources import Args, flag
from .config_values import (
    AUTO,
    MAX_SLABS,
    at_least_one,
    config_problems,
    default_concurrency,
    default_encoder_processes,
    default_output_dir,
    format_size,
    parse_bool,
    parse_float,
    parse_int,
    parse_size,
    parse_slab_size,
    parse_slabs,
    positive_seconds,
    profile_name,
    seconds_or_never,
    shm_prefix_for,
)
from .pool import sizing as pool_sizing
from .vocabulary import DEFAULT_PROFILE, default_socket

SHM_PREFIX_SHOWN = "video-sidecar-$UID"

__all__ = ["Config", "shm_prefix_for"]


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


# The settings in groups by concern, which `Config` joins. A dataclass takes its bases'
# fields last base first: `Config` names the groups in the reverse of their order in
# `--help`, the TOML output and the JSON one.


@dataclass(frozen=True)
class Listening:
    """Where the daemon listens, and who may connect."""

    socket: str = field(
        default_factory=default_socket,
        metadata=flag("Unix socket to listen on", metavar="PATH"),
    )
    tcp: str = field(
        default="",
        metadata=flag("also listen on TCP HOST:PORT; needs TLS or --insecure", metavar="HOST:PORT"),
    )
    tls_cert: str = field(
        default="", metadata=flag("TLS certificate (PEM) for TCP", metavar="FILE")
    )
    tls_key: str = field(default="", metadata=flag("TLS private key (PEM) for TCP", metavar="FILE"))
    tls_client_ca: str = field(
        default="",
        metadata=flag("require client certificates signed by this CA (PEM)", metavar="FILE"),
    )
    insecure: bool = field(
        default=False,
        metadata=flag("allow TCP without TLS (trusted networks only)", parse_bool, "BOOL"),
    )
    framed_socket: bool = field(
        default=True,
        metadata=flag(
            "also serve one-reply encodes, leases and releases on SOCKET.framed, without "
            "HTTP/2, for this host's clients",
            parse_bool,
            "BOOL",
        ),
    )
    framed_connections: int = field(
        default=1024,
        metadata=flag(
            "connections the framed socket keeps open at once; more are refused "
            "(RESOURCE_EXHAUSTED)",
            at_least_one,
            "N",
        ),
    )
    framed_connections_per_uid: int = field(
        default=256,
        metadata=flag(
            "framed-socket connections one user (the peer's uid) keeps open at once; more "
            "are refused (RESOURCE_EXHAUSTED)",
            at_least_one,
            "N",
        ),
    )
    framed_message_timeout: float = field(
        default=10.0,
        metadata=flag(
            "seconds a framed connection gets for its preamble, for a request once its "
            "first byte came, and to read on in a reply; then it is closed (the time "
            "between requests has no limit)",
            positive_seconds,
            "SECONDS",
        ),
    )


@dataclass(frozen=True)
class Storage:
    """The output root, and the slabs in shared memory."""

    output_dir: str = field(
        default_factory=default_output_dir,
        metadata=flag("root directory for file outputs; paths are confined to it", metavar="DIR"),
    )
    shm_dir: str = field(
        default="/dev/shm",
        metadata=flag("directory the slabs live in (a tmpfs)", metavar="DIR"),
    )
    # "" until __post_init__ derives it from the socket: see `shm_prefix_for`.
    shm_prefix: str = field(
        default="",
        metadata=flag(
            "name prefix of this instance's slabs; one daemon per prefix",
            metavar="NAME",
            shown=f"{SHM_PREFIX_SHOWN} on the default socket, {SHM_PREFIX_SHOWN}-<8 hex digits "
            "of sha256 of the socket path> on any other",
        ),
    )
    shm_group: str = field(
        default="",
        metadata=flag(
            "group allowed to map the slabs and use the socket (mode 0660)", metavar="GROUP"
        ),
    )
    # 0 is auto (the text `auto`): sized to the host in __post_init__; see pool/sizing.py.
    slabs: int = field(
        default=0,
        metadata=flag(
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
        metadata=flag(
            f"size of each slab; also the largest single lease; {AUTO}: 64MiB, or less "
            "(down to 8MiB) where 4 slabs of 64MiB would take over half of --shm-dir or a "
            "quarter of the memory",
            parse_slab_size,
            "SIZE",
            shown=_slab_size_here,
        ),
    )


@dataclass(frozen=True)
class Encoding:
    """How many encodes run at once, on what, and with what settings."""

    profile: str = field(
        default=DEFAULT_PROFILE,
        metadata=flag(
            "encoder settings for requests that name none: fast (the most speed, files "
            "several times larger), balanced (diffusers' file sizes, fast) or small "
            "(smaller files, slower); docs/performance.md",
            profile_name,
            "NAME",
        ),
    )

    max_concurrent_encodes: int = field(
        default_factory=default_concurrency,
        metadata=flag(
            "encodes that run at once; more wait in a queue",
            parse_int,
            "N",
            shown=f"cores / 2, at most 16: {default_concurrency()} here",
        ),
    )
    encoder_threads: int = field(
        default=0,
        metadata=flag(
            "threads per encode; 0 shares the cores among running encodes", parse_int, "N"
        ),
    )
    warm_encoders: int = field(
        default=2,
        metadata=flag(
            "encoders opened ahead of time for recently served short-clip settings; 0: off",
            parse_int,
            "N",
        ),
    )
    encoder_processes: int = field(
        default_factory=default_encoder_processes,
        metadata=flag(
            "processes that encode videos beside the daemon, started as needed; 0: off",
            parse_int,
            "N",
            shown=f"the cores, 3 to 16; 0 on one core: {default_encoder_processes()} here",
        ),
    )
    idle_release: float = field(
        default=RELEASE_S,
        metadata=flag(
            "seconds without an encode after which ready encoders close, encoder processes "
            "beyond the first three stop, and their memory goes back",
            parse_float,
            "SECONDS",
        ),
    )


@dataclass(frozen=True)
class ClientLimits:
    """What one client or request may hold or ask for."""

    lease_ttl: float = field(
        default=30.0,
        metadata=flag(
            "seconds an unused lease lives before it is reclaimed", parse_float, "SECONDS"
        ),
    )
    max_lease_wait: float = field(
        default=30.0,
        metadata=flag("longest a Lease call may wait for room", parse_float, "SECONDS"),
    )
    max_frames: int = field(default=100_000, metadata=flag("frames per request", parse_int, "N"))
    max_width: int = field(default=8192, metadata=flag("frame width limit", parse_int, "PIXELS"))
    max_height: int = field(default=8192, metadata=flag("frame height limit", parse_int, "PIXELS"))
    max_request_bytes: int = field(
        default=64 * 1024**3,
        metadata=flag("raw bytes per request", parse_size, "SIZE"),
    )
    max_preset: str = field(
        default=DEFAULT_MAX_PRESET,
        metadata=flag(
            "the slowest encoder preset a request may ask for, an x264/x265 name "
            "(ultrafast ... placebo; SVT-AV1 and VP9 presets of like cost are held to it); "
            "slower ones are refused",
            parse_max_preset,
            "PRESET",
        ),
    )
    max_lookahead: int = field(
        default=DEFAULT_MAX_LOOKAHEAD,
        metadata=flag(
            "the most frames a request may ask its encoder to look ahead (rc-lookahead, "
            "lookahead, lag-in-frames), 0 to 250; more is refused",
            parse_max_lookahead,
            "FRAMES",
        ),
    )


@dataclass(frozen=True)
class Operations:
    """Metrics, shutdown and logs."""

    metrics: str = field(
        default="",
        metadata=flag("serve Prometheus metrics on HOST:PORT (needs prometheus-client)",
                      metavar="HOST:PORT"),
    )  # fmt: skip
    shutdown_grace: float = field(
        default=30.0,
        metadata=flag("seconds in-flight encodes get to finish on SIGTERM", parse_float, "SECONDS"),
    )
    idle_exit: float = field(
        default=0.0,
        metadata=flag(
            "stop by itself once no client has called for this many seconds (0: never); "
            "the daemon export_to_video starts uses 600",
            seconds_or_never,
            "SECONDS",
        ),
    )
    log_level: str = field(
        default="info", metadata=flag("debug, info, warning or error", metavar="LEVEL")
    )
    log_json: bool = field(default=False, metadata=flag("log JSON lines", parse_bool, "BOOL"))


@dataclass(frozen=True)
class Config(Operations, ClientLimits, Encoding, Storage, Listening):
    """Every setting; flags, variables and the file are read and written by
    `config_sources`."""

    def __post_init__(self) -> None:
        if not self.shm_prefix:  # frozen: set here once, as the pool's size below
            object.__setattr__(self, "shm_prefix", shm_prefix_for(self.socket))
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

    env_name = staticmethod(config_sources.env_name)
    flag_name = staticmethod(config_sources.flag_name)
    add_config_argument = staticmethod(config_sources.add_config_argument)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        config_sources.add_arguments(cls, parser)

    @classmethod
    def compat_bool_args(cls, argv: Sequence[str]) -> list[str]:
        return config_sources.compat_bool_args(cls, argv)

    @classmethod
    def to_args(cls, options: Mapping[str, Any]) -> list[str]:
        return config_sources.to_args(cls, options)

    @classmethod
    def load(cls, args: Args = None, environ: Mapping[str, str] | None = None) -> Config:
        """Build a config from flags, environment and file, in precedence order."""
        return config_sources.load_with_sources(cls, args, environ)[0]

    @classmethod
    def load_with_sources(
        cls, args: Args = None, environ: Mapping[str, str] | None = None
    ) -> tuple[Config, dict[str, str]]:
        """The config, and where each value came from: flag, env, file or default."""
        return config_sources.load_with_sources(cls, args, environ)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_toml(self, sources: Mapping[str, str] | None = None) -> str:
        """The settings as a TOML file would give them, each with where it came from;
        a pool `auto` sized says so."""
        if sources and self.pool_reason:
            auto = {n: f"default ({AUTO} on this host)" for n in ("slabs", "slab_size")}
            sources = {n: auto.get(n, s) if s == "default" else s for n, s in sources.items()}
        return config_sources.to_toml(self, sources)
