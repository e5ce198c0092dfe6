from __future__ import annotations

import argparse

import pytest

from sidecar.config import Config
from sidecar.config_values import format_size, parse_size


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    Config.add_arguments(parser)
    return parser.parse_args(argv)


def test_sizes() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("64M") == parse_size("64MiB") == parse_size("64mb") == 64 << 20
    assert parse_size("1.5G") == 3 << 29
    assert format_size(64 << 20) == "64MiB"
    with pytest.raises(ValueError):
        parse_size("lots")


def test_every_field_has_a_flag_and_an_env_twin() -> None:
    parser = argparse.ArgumentParser()
    Config.add_arguments(parser)
    text = parser.format_help()
    for name in Config.__dataclass_fields__:
        assert Config.flag_name(name) in text
        assert Config.env_name(name) in text


def test_precedence_flag_over_env_over_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar.pool import sizing as pool_sizing

    # The default pool is sized to the host (tests/test_pool_sizing.py): pretend one.
    monkeypatch.setattr(pool_sizing, "host_totals", lambda shm_dir: (64 << 30, 128 << 30))
    env = {"VIDEO_SIDECAR_SLABS": "3", "VIDEO_SIDECAR_SLAB_SIZE": "2MiB"}
    default = Config.load(parse(["--max-concurrent-encodes", "8"]), {})
    assert (default.slabs, default.slab_size) == (24, 64 << 20)
    from_env = Config.load(parse([]), env)
    assert (from_env.slabs, from_env.slab_size) == (3, 2 << 20)
    from_flag = Config.load(parse(["--slabs", "5"]), env)
    assert (from_flag.slabs, from_flag.slab_size) == (5, 2 << 20)


def test_issue_flags_exist() -> None:
    ns = parse(
        ["--socket", "/s", "--output-dir", "/o", "--slabs", "2", "--slab-size", "8M",
         "--max-concurrent-encodes", "3", "--lease-ttl", "5"]
    )  # fmt: skip
    c = Config.load(ns, {})
    got = (c.socket, c.output_dir, c.slabs, c.slab_size, c.max_concurrent_encodes, c.lease_ttl)
    assert got == ("/s", "/o", 2, 8 << 20, 3, 5.0)


def test_defaults_need_no_root(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert Config().socket == str(tmp_path / "video-sidecar" / "sidecar.sock")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert "video-sidecar-" in Config().socket


@pytest.mark.parametrize(
    "env",
    [
        {"VIDEO_SIDECAR_SLABS": "0"},  # `auto` is written out
        {"VIDEO_SIDECAR_SLABS": "-1"},
        {"VIDEO_SIDECAR_SLAB_SIZE": "0"},
        {"VIDEO_SIDECAR_SLABS": "many"},
        {"VIDEO_SIDECAR_SHM_PREFIX": "../evil"},
        {"VIDEO_SIDECAR_LOG_LEVEL": "loud"},
        {"VIDEO_SIDECAR_LOG_JSON": "maybe"},
    ],
)
def test_bad_values_are_refused_with_the_name(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        Config.load(parse([]), env)


def test_booleans_are_bare_flags_with_a_no_form() -> None:
    assert parse(["--insecure"]).insecure is True
    assert parse(["--no-insecure"]).insecure is False
    assert parse([]).insecure is None  # unset: falls through to env, file, default
    with pytest.raises(SystemExit):
        parse(["--insecure", "true"])  # only after compat_bool_args, as the CLI does


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--insecure", "true"], ["--insecure"]),
        (["--insecure", "No"], ["--no-insecure"]),
        (["--insecure=1", "--log-json=false"], ["--insecure", "--no-log-json"]),
        (["--insecure", "--slabs", "2"], ["--insecure", "--slabs", "2"]),
        (["--log-json", "--", "--insecure", "true"], ["--log-json", "--", "--insecure", "true"]),
    ],
)
def test_older_boolean_spellings_still_work(argv: list[str], expected: list[str]) -> None:
    assert Config.compat_bool_args(argv) == expected


def test_inline_boolean_nonsense_is_refused() -> None:
    with pytest.raises(ValueError, match="--no-insecure"):
        Config.compat_bool_args(["--insecure=maybe"])


@pytest.mark.parametrize(
    ("word", "value"),
    [("TRUE", True), ("yes", True), ("1", True), ("False", False), ("NO", False), ("0", False)],
)
def test_env_booleans(word: str, value: bool) -> None:
    assert Config.load(parse([]), {"VIDEO_SIDECAR_INSECURE": word}).insecure is value


@pytest.mark.parametrize("word", ["on", "off", "maybe", "2"])
def test_env_boolean_nonsense_names_the_variable(word: str) -> None:
    with pytest.raises(ValueError, match="VIDEO_SIDECAR_INSECURE: not a boolean"):
        Config.load(parse([]), {"VIDEO_SIDECAR_INSECURE": word})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('insecure = "true"', "insecure must be true or false"),
        ("slabs = true", "slabs must be a number or a string"),
        ("slabs = 2.5", "not a whole number"),
        ("lease_ttl = nan", "not a finite number"),
    ],
)
def test_file_values_keep_their_types(tmp_path, text: str, message: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text + "\n")
    with pytest.raises(ValueError, match=message):
        Config.load({"config_file": str(cfg)}, {})


def test_to_args_turns_settings_into_serve_flags() -> None:
    args = Config.to_args({"insecure": True, "log_json": "no", "slab_size": "16MiB", "tcp": None})
    assert args == ["--insecure", "--no-log-json", "--slab-size", "16MiB"]
    ns = parse(args)
    assert (ns.insecure, ns.log_json, ns.slab_size) == (True, False, 16 << 20)


def test_help_shows_defaults_and_what_a_size_looks_like(monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar.pool import sizing as pool_sizing

    # A host with room for 64MiB slabs (a small one says "64MiB; 8MiB here").
    monkeypatch.setattr(pool_sizing, "host_totals", lambda shm_dir: (64 << 30, 128 << 30))
    parser = argparse.ArgumentParser()
    Config.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "[default: 64MiB; env VIDEO_SIDECAR_SLAB_SIZE]" in text
    assert "--insecure, --no-insecure" in text
    with pytest.raises(ValueError, match="16MiB, 1GiB, 65536"):
        parse_size("16X")


@pytest.mark.parametrize(
    ("name", "zero"),
    [("warm_encoders", "off"), ("encoder_processes", "off"), ("encoder_threads", "auto")],
)
def test_counts_below_zero_name_what_zero_means(name: str, zero: str) -> None:
    env = {Config.env_name(name): "-1"}
    with pytest.raises(ValueError, match=rf"{name} must be 0 \({zero}\) or more"):
        Config.load(parse([]), env)


def test_encoder_processes_default_to_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar import config_values

    for cores, expected in ((1, 0), (2, 3), (4, 4), (16, 16), (64, 16)):
        monkeypatch.setattr(config_values, "cpu_count", lambda cores=cores: cores)
        assert config_values.default_encoder_processes() == expected


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_idle_release_is_a_positive_number_of_seconds(value: str) -> None:
    with pytest.raises(ValueError, match=r"IDLE_RELEASE|idle_release"):
        Config.load(parse([]), {Config.env_name("idle_release"): value})
    assert Config.load(parse(["--idle-release", "2.5"]), {}).idle_release == 2.5


def test_the_shm_prefix_follows_the_socket(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule for `serve`, and the daemon `encode` and `demo` start: the default socket
    keeps the default prefix, any other gets one of its own, a prefix set anywhere wins."""
    import hashlib
    import os

    from sidecar.config import shm_prefix_for
    from sidecar.tools.launcher import AutoDaemon
    from sidecar.vocabulary import default_socket

    monkeypatch.delenv("VIDEO_SIDECAR_SHM_PREFIX", raising=False)
    monkeypatch.delenv("VIDEO_SIDECAR_CONFIG", raising=False)
    mine = f"video-sidecar-{os.getuid()}"
    other = str(tmp_path / "other.sock")
    derived = f"{mine}-{hashlib.sha256(other.encode()).hexdigest()[:8]}"
    assert Config.load({}).shm_prefix == mine == shm_prefix_for(default_socket())
    assert Config.load({"socket": other}).shm_prefix == derived == shm_prefix_for(other)
    config, sources = Config.load_with_sources(parse(["--socket", other]))
    assert config.shm_prefix == derived and sources["shm_prefix"] == "default"
    assert Config(socket=other).shm_prefix == derived
    assert AutoDaemon(other).shm_prefix == derived
    assert Config.load({"socket": other, "shm_prefix": "mine"}).shm_prefix == "mine"
    assert Config.load({"socket": other}, {"VIDEO_SIDECAR_SHM_PREFIX": "env"}).shm_prefix == "env"
    assert "video-sidecar-$UID-<8 hex digits" in parse_help()


def parse_help() -> str:
    parser = argparse.ArgumentParser()
    Config.add_arguments(parser)
    return " ".join(parser.format_help().split())
