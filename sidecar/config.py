"""The daemon's configuration: one typed dataclass is the source of every setting.

Each field becomes a command-line flag (`--slab-size`), an environment variable
(`VIDEO_SIDECAR_SLAB_SIZE`) and a key of the optional TOML file (`slab_size`, or
`slab-size`). Precedence, highest first:

    command-line flag  >  environment variable  >  config file  >  built-in default

The file is named by `--config` or `VIDEO_SIDECAR_CONFIG`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "VIDEO_SIDECAR_"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.I)
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str) -> int:
    """Parse a byte size: `67108864`, `64M`, `64MiB`, `1.5G`. Units are powers of 1024."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 64MiB, 1G, 4096)")
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** _SIZE_POWERS[unit.lower()])


def format_size(n: int) -> str:
    """Human-readable binary size: 67108864 -> '64MiB'."""
    for unit, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        scale = 1024**power
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n}B"


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def runtime_dir() -> Path:
    """Where a user's sockets live: $XDG_RUNTIME_DIR, else a private dir in the temp dir."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "video-sidecar"
    return Path(tempfile.gettempdir()) / f"video-sidecar-{os.getuid()}"


def default_socket() -> str:
    return str(runtime_dir() / "sidecar.sock")


def default_output_dir() -> str:
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return str(Path(data) / "video-sidecar" / "outputs")


def default_shm_prefix() -> str:
    return f"video-sidecar-{os.getuid()}"


def default_concurrency() -> int:
    # Several encodes with few threads each beat one wide encode on throughput.
    return max(1, min(8, cpu_count() // 2))


def _opt(
    help: str, parse: Callable[[str], Any] = str, metavar: str | None = None
) -> dict[str, Any]:
    return {"help": help, "parse": parse, "metavar": metavar}


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
        metadata=_opt("name prefix of this instance's slabs; one daemon per prefix"),
    )
    shm_group: str = field(
        default="",
        metadata=_opt("group allowed to map the slabs and use the socket (mode 0660)"),
    )
    slabs: int = field(default=8, metadata=_opt("number of shared-memory slabs", int, "N"))
    slab_size: int = field(
        default=64 * 1024 * 1024,
        metadata=_opt("size of each slab; also the largest single lease", parse_size, "SIZE"),
    )
    max_concurrent_encodes: int = field(
        default_factory=default_concurrency,
        metadata=_opt("encodes that run at once; more wait in a queue", int, "N"),
    )
    encoder_threads: int = field(
        default=0,
        metadata=_opt("threads per encode; 0 shares the cores among running encodes", int, "N"),
    )
    warm_encoders: int = field(
        default=2,
        metadata=_opt(
            "encoders opened ahead of time for recently served short-clip settings; 0: off",
            int,
            "N",
        ),
    )
    lease_ttl: float = field(
        default=30.0,
        metadata=_opt("seconds an unused lease lives before it is reclaimed", float, "SECONDS"),
    )
    max_lease_wait: float = field(
        default=30.0,
        metadata=_opt("longest a Lease call may wait for room", float, "SECONDS"),
    )
    max_frames: int = field(default=100_000, metadata=_opt("frames per request", int, "N"))
    max_width: int = field(default=8192, metadata=_opt("frame width limit", int, "PIXELS"))
    max_height: int = field(default=8192, metadata=_opt("frame height limit", int, "PIXELS"))
    max_request_bytes: int = field(
        default=64 * 1024**3,
        metadata=_opt("raw bytes per request", parse_size, "SIZE"),
    )
    metrics: str = field(
        default="",
        metadata=_opt("serve Prometheus metrics on HOST:PORT (needs prometheus-client)",
                      metavar="HOST:PORT"),
    )  # fmt: skip
    shutdown_grace: float = field(
        default=30.0,
        metadata=_opt("seconds in-flight encodes get to finish on SIGTERM", float, "SECONDS"),
    )
    log_level: str = field(default="info", metadata=_opt("debug, info, warning or error"))
    log_json: bool = field(default=False, metadata=_opt("log JSON lines", parse_bool, "BOOL"))

    def __post_init__(self) -> None:
        problems = []
        if self.slabs < 1:
            problems.append("slabs must be at least 1")
        if self.slab_size < 1024 * 1024:
            problems.append("slab_size must be at least 1MiB")
        if self.max_concurrent_encodes < 1:
            problems.append("max_concurrent_encodes must be at least 1")
        if self.warm_encoders < 0:
            problems.append("warm_encoders must be 0 (off) or more")
        if self.encoder_threads < 0:
            problems.append("encoder_threads must be 0 (auto) or more")
        if self.lease_ttl <= 0 or self.max_lease_wait < 0 or self.shutdown_grace < 0:
            problems.append("lease_ttl must be positive; max_lease_wait, shutdown_grace >= 0")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", self.shm_prefix):
            problems.append("shm_prefix may hold only letters, digits, '_' and '-' (1-64)")
        if self.log_level.lower() not in {"debug", "info", "warning", "error"}:
            problems.append("log_level must be debug, info, warning or error")
        if min(self.max_frames, self.max_width, self.max_height, self.max_request_bytes) < 1:
            problems.append("limits must be positive")
        if bool(self.tls_cert) != bool(self.tls_key):
            problems.append("tls_cert and tls_key go together")
        if self.tls_client_ca and not self.tls_cert:
            problems.append("tls_client_ca needs tls_cert and tls_key")
        if self.tcp and not self.tls_cert and not self.insecure:
            problems.append(
                "listening on TCP needs TLS (--tls-cert, --tls-key) or an explicit --insecure"
            )
        if self.metrics and not re.fullmatch(r"\[?[\w.:-]*\]?:\d{1,5}", self.metrics):
            problems.append(f"metrics must be HOST:PORT, got {self.metrics!r}")
        if self.tcp and not re.fullmatch(r"\[?[\w.:-]*\]?:\d{1,5}", self.tcp):
            problems.append(f"tcp must be HOST:PORT, got {self.tcp!r}")
        if problems:
            raise ValueError("; ".join(problems))

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
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add one flag per field; defaults stay None so unset flags fall through."""
        for f in dataclasses.fields(cls):
            meta = f.metadata
            parser.add_argument(
                cls.flag_name(f.name),
                dest=f.name,
                default=None,
                type=meta["parse"],
                metavar=meta["metavar"],
                help=f"{meta['help']} [env {cls.env_name(f.name)}]",
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
                value = from_file[f.name]
                try:
                    values[f.name] = parse(str(value)) if not isinstance(value, bool) else value
                except ValueError as exc:
                    raise ValueError(f"{file}: {f.name}: {exc}") from None
                sources[f.name] = f"file {file}"
            else:
                sources[f.name] = "default"
        return cls(**values), sources

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
            note = f"  # {sources[f.name]}" if sources else ""
            lines.append(f"{f.name} = {text}{note}")
        return "\n".join(lines) + "\n"


def read_file(path: str | Path) -> dict[str, Any]:
    """Settings from a TOML file; keys may use '_' or '-'. Unknown keys are errors."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path}: {exc}") from None
    known = {f.name for f in dataclasses.fields(Config)}
    settings = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ValueError(f"config file {path}: unknown setting {key!r}")
        settings[name] = value
    return settings
