"""Where settings come from and where they go: the fields of a settings dataclass as
command-line flags, `VIDEO_SIDECAR_*` variables and keys of a TOML file, read in their
precedence, and written back as flags or TOML.

Generic over the dataclass, so that `config.Config` stays the one list of settings: each
field says its flag's help and the parser of its text form in its metadata (`flag`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .config_values import (
    ENV_PREFIX,
    FALSE_WORDS,
    TRUE_WORDS,
    argument_type,
    format_size,
    parse_bool,
    parse_size,
    read_toml,
)

S = TypeVar("S")
Args = argparse.Namespace | Mapping[str, Any] | None


def flag(
    help: str,
    parse: Callable[[str], Any] = str,
    metavar: str | None = None,
    shown: str | Callable[[], str] | None = None,
) -> dict[str, Any]:
    """A field's flag: help text, parser of its text form, and how `--help` shows its
    default when the value itself would mislead (it depends on the machine; a callable
    is asked when the help is made)."""
    return {"help": help, "parse": parse, "metavar": metavar, "shown": shown}


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _off(flag: str) -> str:
    """`--insecure` -> `--no-insecure`."""
    return "--no-" + flag[2:]


def bool_fields(cls: type[Any]) -> frozenset[str]:
    # Annotations are strings where the dataclass has `from __future__ import annotations`.
    return frozenset(f.name for f in dataclasses.fields(cls) if f.type in ("bool", bool))


def default_text(f: dataclasses.Field[Any]) -> str:
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


def add_arguments(cls: type[Any], parser: argparse.ArgumentParser) -> None:
    """Add one flag per field; defaults stay None so unset flags fall through.

    A boolean is a bare flag with a `--no-` form (`--insecure`, `--no-insecure`);
    `compat_bool_args` turns the older `--insecure true` into that before parsing."""
    bools = bool_fields(cls)
    for f in dataclasses.fields(cls):
        # argparse %-formats help: a '%' in a default (a path, say) must be doubled.
        shown = default_text(f).replace("%", "%%")
        help_text = f"{f.metadata['help']} [default: {shown}; env {env_name(f.name)}]"
        if f.name in bools:
            kind: dict[str, Any] = {"action": argparse.BooleanOptionalAction}
        else:
            kind = {"type": argument_type(f.metadata["parse"]), "metavar": f.metadata["metavar"]}
        parser.add_argument(flag_name(f.name), dest=f.name, default=None, help=help_text, **kind)


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        dest="config_file",
        default=None,
        metavar="FILE",
        help=f"TOML file of settings (keys as the flags) [env {ENV_PREFIX}CONFIG]",
    )


def compat_bool_args(cls: type[Any], argv: Sequence[str]) -> list[str]:
    """Accept the older `--insecure true` / `--insecure=false` spellings of boolean
    flags (any word `parse_bool` takes) by rewriting them as `--insecure` /
    `--no-insecure`. A bare flag followed by anything else is left alone; ValueError
    for `--insecure=maybe`."""
    flags = {flag_name(name) for name in bool_fields(cls)}
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
                        f"use {name} or {_off(name)}"
                    ) from None
                token = name if on else _off(name)
            elif i + 1 < len(argv) and argv[i + 1].strip().lower() in words:
                i += 1
                token = name if parse_bool(argv[i]) else _off(name)
        out.append(token)
        i += 1
    return out


def to_args(cls: type[Any], options: Mapping[str, Any]) -> list[str]:
    """`serve` flags for settings: `{"slabs": 4, "insecure": True}` -> `--slabs 4
    --insecure`. Booleans may also be given as text ("true", "no")."""
    bools = bool_fields(cls)
    args: list[str] = []
    for key, value in options.items():
        if value is None:
            continue
        name = key.replace("-", "_")
        flag = flag_name(name)
        if name in bools:
            on = value if isinstance(value, bool) else parse_bool(str(value))
            args.append(flag if on else _off(flag))
        elif str(value).startswith("-"):  # a negative number, say: keep it a value
            args.append(f"{flag}={value}")
        else:
            args += [flag, str(value)]
    return args


def load_with_sources(
    cls: type[S], args: Args = None, environ: Mapping[str, str] | None = None
) -> tuple[S, dict[str, str]]:
    """The settings from flags, environment and file, in that precedence, and where each
    value came from: flag, env, file or default."""
    environ = os.environ if environ is None else environ
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    file = given.get("config_file") or environ.get(ENV_PREFIX + "CONFIG") or ""
    from_file = read_file(cls, file) if file else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # a dataclass
        raw = environ.get(env_name(f.name))
        if given.get(f.name) is not None:
            values[f.name], sources[f.name] = given[f.name], "flag"
        elif raw is not None and raw != "":
            try:
                values[f.name] = f.metadata["parse"](raw)
            except ValueError as exc:
                raise ValueError(f"{env_name(f.name)}: {exc}") from None
            sources[f.name] = "env"
        elif f.name in from_file:
            values[f.name] = _from_file(f, f.name in bool_fields(cls), from_file[f.name], file)
            sources[f.name] = f"file {file}"
        else:
            sources[f.name] = "default"
    return cls(**values), sources


def _from_file(f: dataclasses.Field[Any], is_bool: bool, value: Any, file: str) -> Any:
    """A TOML value: booleans must be TOML booleans, everything else a number or
    a string (a size may be either: 1048576 or "1MiB")."""
    want = "true or false (a TOML boolean)" if is_bool else "a number or a string"
    if is_bool != isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"config file {file}: {f.name} must be {want}, not {value!r}")
    if is_bool:
        return value
    try:
        return f.metadata["parse"](str(value))
    except ValueError as exc:
        raise ValueError(f"config file {file}: {f.name}: {exc}") from None


def read_file(cls: type[Any], path: str | Path) -> dict[str, Any]:
    """Settings from a TOML file; keys may use '_' or '-'. Unknown keys are errors."""
    known = {f.name for f in dataclasses.fields(cls)}
    settings = {}
    for key, value in read_toml(path).items():
        name = key.replace("-", "_")
        if name not in known:
            raise ValueError(f"config file {path}: unknown setting {key!r}")
        settings[name] = value
    return settings


def to_toml(settings: Any, sources: Mapping[str, str] | None = None) -> str:
    """The settings as a TOML file would give them, each with where it came from."""
    lines = []
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        note = f"  # {sources[f.name]}" if sources and sources[f.name] else ""
        lines.append(f"{f.name} = {text}{note}")
    return "\n".join(lines) + "\n"
