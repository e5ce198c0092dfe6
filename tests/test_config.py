from __future__ import annotations

import argparse

import pytest

from sidecar.config import Config, format_size, parse_size


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


def test_precedence_flag_over_env_over_default() -> None:
    env = {"VIDEO_SIDECAR_SLABS": "3", "VIDEO_SIDECAR_SLAB_SIZE": "2MiB"}
    assert Config.load(parse([]), {}).slabs == 8
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
        {"VIDEO_SIDECAR_SLABS": "0"},
        {"VIDEO_SIDECAR_SLABS": "many"},
        {"VIDEO_SIDECAR_SHM_PREFIX": "../evil"},
        {"VIDEO_SIDECAR_LOG_LEVEL": "loud"},
        {"VIDEO_SIDECAR_LOG_JSON": "maybe"},
    ],
)
def test_bad_values_are_refused_with_the_name(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        Config.load(parse([]), env)
