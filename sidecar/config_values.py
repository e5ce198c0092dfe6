"""The value types and machine-dependent defaults of the daemon's settings: sizes,
booleans, numbers, the socket and output locations, the core count. `config` builds the
typed Config from these."""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .vocabulary import PROFILES, default_socket

ENV_PREFIX = "VIDEO_SIDECAR_"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.I)
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str) -> int:
    """Parse a byte size: `67108864`, `64M`, `64MiB`, `1.5G`. Units are powers of 1024."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(
            f"not a size: {text!r} (a number of bytes with an optional unit K, M, G or T, "
            "e.g. 16MiB, 1GiB, 65536)"
        )
    number, unit, _ = match.groups()
    return int(float(number) * 1024 ** _SIZE_POWERS[unit.lower()])


def format_size(n: int) -> str:
    """Human-readable binary size: 67108864 -> '64MiB'."""
    for unit, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        scale = 1024**power
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n}B"


TRUE_WORDS = frozenset({"true", "yes", "1"})
FALSE_WORDS = frozenset({"false", "no", "0"})


def parse_bool(text: str) -> bool:
    """true/false, yes/no or 1/0, any case: what an environment variable may say."""
    value = str(text).strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false, yes or no, 1 or 0)")


def parse_int(text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise ValueError(f"not a whole number: {text!r}") from None


def parse_float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not math.isfinite(value):  # nan slips through every comparison in __post_init__
        raise ValueError(f"not a finite number: {text!r}")
    return value


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def socket_path(target: str) -> str | None:
    """The absolute Unix socket path `target` names, or None for a network target.

    A value with a '/' or without a ':' is a path (`WRONG` is `./WRONG`, where the client
    alone would look up a host of that name); `unix:PATH` is one too; `HOST:PORT` and
    other gRPC schemes are not."""
    if target.startswith("unix:"):
        path = target.removeprefix("unix:")
        return os.path.abspath(path[1:] if path.startswith("//") else path)
    if target.startswith(("unix-abstract:", "dns:", "ipv4:", "ipv6:")):
        return None
    if "/" in target or ":" not in target:
        return os.path.abspath(target)
    return None


def default_output_dir() -> str:
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return str(Path(data) / "video-sidecar" / "outputs")


def default_shm_prefix() -> str:
    return f"video-sidecar-{os.getuid()}"


def default_concurrency() -> int:
    # Several encodes with few threads each beat one wide encode on throughput; a node
    # with 32 cores and two GPUs needs 16 of them to keep its cores busy.
    return max(1, min(16, cpu_count() // 2))


def default_encoder_processes() -> int:
    # At least the three a daemon keeps, even on two cores: back-to-back clips alternate
    # between two of them while the third serves other settings. Measured on 2 cores
    # (bench/results/2026-11-30-cpu2-processes-ab.md), small clips took 0.77-1.01x of
    # upstream_a with them and 0.64-1.80x without. One core has nothing to spare.
    cores = cpu_count()
    return 0 if cores < 2 else min(16, max(3, cores))


SHM_PREFIX = r"[A-Za-z0-9_-]{1,64}"  # it names files in /dev/shm
SHM_PREFIX_RULE = "shm_prefix may hold only letters, digits, '_' and '-' (1-64)"
PAGE = 4096  # slabs are mapped whole; a lease's offset and size are pages too
# Every worker maps and registers each slab, and a lease looks for room slab by slab: a
# few large slabs, not many small ones (a million took 3.6 s and 422 MB before the
# /dev/shm check could say the pool does not fit).
MAX_SLABS = 1024

AUTO = "auto"  # the text of a slab count or size the daemon chooses (0 inside Config)
SLABS_RULE = f"slabs must be 1 to {MAX_SLABS} (or {AUTO}); for a larger pool, larger slabs"
SLAB_SIZE_RULE = f"slab_size must be at least 1MiB (or {AUTO})"


def parse_slabs(text: str) -> int:
    """A slab count, 1 to MAX_SLABS, or `auto` (0): sized to the host. A 0 written out
    is refused, as it always was: `auto` says what it means."""
    if str(text).strip().lower() == AUTO:
        return 0
    n = parse_int(text)
    if not 1 <= n <= MAX_SLABS:
        raise ValueError(SLABS_RULE)
    return n


def parse_slab_size(text: str) -> int:
    """A slab size as `parse_size` reads it, at least 1MiB, or `auto` (0): sized to the
    host."""
    if str(text).strip().lower() == AUTO:
        return 0
    n = parse_size(text)
    if n < 1024 * 1024:
        raise ValueError(SLAB_SIZE_RULE)
    return n


def config_problems(c: Any) -> list[str]:
    """What is wrong with a `Config`'s values, one phrase each (empty: nothing)."""
    problems = []
    for name, zero in (("warm_encoders", "off"), ("encoder_processes", "off"),
                       ("encoder_threads", "auto")):  # fmt: skip
        if getattr(c, name) < 0:
            problems.append(f"{name} must be 0 ({zero}) or more")
    # 0 is auto: Config sizes the pool to the host once these are checked.
    if not 0 <= c.slabs <= MAX_SLABS:
        problems.append(SLABS_RULE)
    if c.slab_size != 0 and c.slab_size < 1024 * 1024:
        problems.append(SLAB_SIZE_RULE)
    elif c.slab_size % PAGE:
        problems.append(
            f"slab_size must be a whole number of 4KiB pages, got {c.slab_size} bytes "
            f"(the next is {-(-c.slab_size // PAGE) * PAGE})"
        )
    if not c.socket:
        problems.append("socket must name a path")
    if c.max_concurrent_encodes < 1:
        problems.append("max_concurrent_encodes must be at least 1")
    if c.idle_release <= 0:
        problems.append("idle_release must be positive")
    if c.lease_ttl <= 0 or c.max_lease_wait < 0 or c.shutdown_grace < 0:
        problems.append("lease_ttl must be positive; max_lease_wait, shutdown_grace >= 0")
    if not re.fullmatch(SHM_PREFIX, c.shm_prefix):
        problems.append(SHM_PREFIX_RULE)
    if c.log_level.lower() not in {"debug", "info", "warning", "error"}:
        problems.append("log_level must be debug, info, warning or error")
    if min(c.max_frames, c.max_width, c.max_height, c.max_request_bytes) < 1:
        problems.append("limits must be positive")
    if bool(c.tls_cert) != bool(c.tls_key):
        problems.append("tls_cert and tls_key go together")
    if c.tls_client_ca and not c.tls_cert:
        problems.append("tls_client_ca needs tls_cert and tls_key")
    if c.tcp and not c.tls_cert and not c.insecure:
        problems.append(
            "listening on TCP needs TLS (--tls-cert, --tls-key) or an explicit --insecure"
        )
    for name in ("metrics", "tcp"):
        address = getattr(c, name)
        match = re.fullmatch(r"\[?[\w.:-]*\]?:(\d{1,5})", address) if address else None
        if address and (match is None or not 0 < int(match[1]) < 65536):
            problems.append(f"{name} must be HOST:PORT with a port of 1 to 65535, got {address!r}")
    return problems


def argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` for argparse: its ValueError message becomes the usage error, instead of
    argparse's `invalid parse_size value`."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file's table; ValueError saying what is wrong with it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            table: dict[str, Any] = tomllib.load(fh)
            return table
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path}: {exc}") from None


# Parsers of single settings, for the fields of `config.Config`.


def shm_prefix_for(socket: str) -> str:
    """The shm prefix of a daemon on `socket` when no setting names one: the same for
    `serve`, and for the daemon `encode` and `demo` start when none answers.

    The default socket gets `video-sidecar-$UID`. Any other gets that and the first 8 hex
    digits of the sha256 of its absolute path: one daemon owns a prefix, so a daemon on a
    second socket must not take the default daemon's.
    """
    path = os.path.abspath(socket)
    if path == os.path.abspath(default_socket()):
        return default_shm_prefix()
    return f"{default_shm_prefix()}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def at_least_one(text: str) -> int:
    value = parse_int(text)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    value = parse_float(text)
    if value <= 0:
        raise ValueError(f"must be a positive number of seconds, got {value:g}")
    return value


def profile_name(text: str) -> str:
    if text not in PROFILES:
        raise ValueError(f"must be one of {', '.join(PROFILES)}, got {text!r}")
    return text


def seconds_or_never(text: str) -> float:
    value = parse_float(text)
    if value < 0:
        raise ValueError(f"must be 0 (never) or a positive number of seconds, got {value:g}")
    return value
