"""The default slab pool is sized to the host: the pure rule, and Config applying it."""

from __future__ import annotations

import argparse
import itertools

import pytest

from sidecar.config import Config
from sidecar.config_values import MAX_SLABS, PAGE
from sidecar.pool import sizing as pool_sizing
from sidecar.pool.sizing import (
    REFERENCE_FRAME_BYTES,
    describe_pool,
    host_totals,
    pool_warning,
    size_pool,
    slabs_per_video,
)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    Config.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch):
    """Pretend the host has this /dev/shm and memory: `host(shm, memory)`."""

    def pretend(shm: int | None, memory: int | None) -> None:
        monkeypatch.setattr(pool_sizing, "host_totals", lambda shm_dir: (shm, memory))

    return pretend


def described(c: Config) -> list[str]:
    return describe_pool(c.slabs, c.slab_size, c.pool_reason, c.max_concurrent_encodes)


def test_the_reference_video_takes_three_64mib_slabs() -> None:
    assert REFERENCE_FRAME_BYTES == 1_548_288
    assert (64 * MiB) // REFERENCE_FRAME_BYTES == 43  # 43 + 43 + 36 frames
    assert slabs_per_video(64 * MiB) == 3
    assert slabs_per_video(8 * MiB) == 25  # 5 frames a slab
    assert slabs_per_video(REFERENCE_FRAME_BYTES) == 122
    assert slabs_per_video(REFERENCE_FRAME_BYTES - 1) is None


@pytest.mark.parametrize(
    ("concurrent", "shm", "memory", "expected"),
    [
        # A 16-core H200 node: 8 concurrent encodes, 3 slabs each.
        (8, 64 * GiB, 128 * GiB, (24, 64 * MiB)),
        # Docker's 64 MiB /dev/shm: a 32 MiB cap, so 4 slabs shrink to 8 MiB.
        (8, 64 * MiB, 128 * GiB, (4, 8 * MiB)),
        (1, 64 * MiB, 4 * GiB, (4, 8 * MiB)),
        # A 2-core CI box (1 concurrent encode): 3 slabs wanted, 4 at least.
        (1, 3584 * MiB, 7 * GiB, (4, 64 * MiB)),
        (1, 24 * GiB, 23 * GiB, (4, 64 * MiB)),
        # A small /dev/shm cuts the count, down to 4 slabs of 64 MiB...
        (8, 1 * GiB, 128 * GiB, (8, 64 * MiB)),
        (8, 600 * MiB, 128 * GiB, (4, 64 * MiB)),
        # ...then shrinks the 4 slabs, in whole pages.
        (8, 100 * MiB, 128 * GiB, (4, 12800 * KiB)),
        (8, 300 * MiB, 128 * GiB, (4, 150 * MiB // 4 // PAGE * PAGE)),
        # Never below 4 x 8 MiB, even where that is over the cap (startup then says so).
        (8, 32 * MiB, 128 * GiB, (4, 8 * MiB)),
        (8, 4 * MiB, 128 * GiB, (4, 8 * MiB)),
        # A quarter of the memory caps it too.
        (8, 64 * GiB, 2 * GiB, (8, 64 * MiB)),
        (16, 512 * GiB, 1024 * GiB, (48, 64 * MiB)),
        # Unknown totals cap nothing; MAX_SLABS still does.
        (16, None, None, (48, 64 * MiB)),
        (1000, None, None, (MAX_SLABS, 64 * MiB)),
    ],
)
def test_the_rule(
    concurrent: int, shm: int | None, memory: int | None, expected: tuple[int, int]
) -> None:
    slabs, slab_size, why = size_pool(concurrent, shm, memory)
    assert (slabs, slab_size) == expected, why
    assert why.startswith("sized to this host: ") and "\n" not in why


def test_why_names_what_set_the_size() -> None:
    assert (
        "24 slabs of 64MiB for 8 concurrent 1344x768x122 4:2:0 videos"
        in (size_pool(8, 64 * GiB, 128 * GiB)[2])
    )
    assert "the least pool, 4 slabs" in size_pool(1, 64 * GiB, 128 * GiB)[2]
    assert "half of the 1GiB shared-memory dir" in size_pool(8, 1 * GiB, 128 * GiB)[2]
    assert "a quarter of the 2GiB memory" in size_pool(8, 64 * GiB, 2 * GiB)[2]
    docker = size_pool(8, 64 * MiB, 128 * GiB)[2]
    assert "4 slabs of 8MiB" in docker and "shrunk from 64MiB to fit" in docker
    assert "do not fit" in size_pool(8, 32 * MiB, 128 * GiB)[2]


def test_the_rule_keeps_its_promises_everywhere() -> None:
    sizes = [None, 4 * MiB, 64 * MiB, 100 * MiB, 333 * MiB, 1 * GiB, 7 * GiB, 64 * GiB]
    for concurrent, shm, memory in itertools.product([1, 2, 5, 8, 16], sizes, sizes):
        slabs, slab_size, _ = size_pool(concurrent, shm, memory)
        assert 4 <= slabs <= MAX_SLABS
        assert 8 * MiB <= slab_size <= 64 * MiB and slab_size % PAGE == 0
        caps = [t // 2 for t in (shm,) if t] + [t // 4 for t in (memory,) if t]
        if caps and min(caps) >= 4 * 8 * MiB:
            assert slabs * slab_size <= min(caps)
        if slab_size < 64 * MiB:
            assert slabs == 4
        if not caps or min(caps) >= 3 * concurrent * 64 * MiB:
            assert slabs >= 3 * concurrent  # room for every concurrent video


def test_both_given_are_kept() -> None:
    assert size_pool(8, 64 * MiB, 1 * GiB, slabs=100, slab_size=1 * GiB) == (
        100,
        1 * GiB,
        "as configured",
    )


@pytest.mark.parametrize(
    ("given", "shm", "expected"),
    [
        ({"slabs": 2}, 64 * GiB, (2, 64 * MiB)),
        ({"slabs": 40}, 64 * GiB, (40, 64 * MiB)),
        ({"slabs": 40}, 1 * GiB, (40, 512 * MiB // 40 // PAGE * PAGE)),
        ({"slabs": 40}, 64 * MiB, (40, 8 * MiB)),  # not below 8 MiB
        ({"slab_size": 16 * MiB}, 64 * GiB, (8 * 13, 16 * MiB)),  # 10 frames a slab
        ({"slab_size": 16 * MiB}, 1 * GiB, (32, 16 * MiB)),  # what 512 MiB holds
        ({"slab_size": 256 * MiB}, 64 * GiB, (8, 256 * MiB)),  # one video a slab
        ({"slab_size": 1 * MiB}, 64 * GiB, (4, 1 * MiB)),  # no frame fits: the least
        ({"slab_size": 1 * GiB}, 1 * GiB, (1, 1 * GiB)),  # over the cap: one
    ],
)
def test_one_given_the_other_is_chosen(
    given: dict[str, int], shm: int, expected: tuple[int, int]
) -> None:
    slabs, slab_size, why = size_pool(8, shm, 128 * GiB, **given)
    assert (slabs, slab_size) == expected, why
    flag = "--slabs" if "slabs" in given else "--slab-size"
    assert why.startswith(f"{flag} as configured, ")


def test_pool_warning() -> None:
    assert pool_warning(4, 8 * MiB, 8) == (
        "the pool (4 x 8MiB) holds 0 of the 8 concurrent 1344x768x122 4:2:0 videos "
        "--max-concurrent-encodes allows; they will wait their turn for memory. "
        "Raise --slabs or --slab-size."
    )
    assert pool_warning(24, 64 * MiB, 8) is None
    assert pool_warning(4, 64 * MiB, 1) is None
    assert pool_warning(8, 64 * MiB, 4) == (
        "the pool (8 x 64MiB) holds 2 of the 4 concurrent 1344x768x122 4:2:0 videos "
        "--max-concurrent-encodes allows; they will wait their turn for memory. "
        "Raise --slabs or --slab-size."
    )
    assert "1 concurrent 1344x768x122 4:2:0 video --max" in (pool_warning(2, 64 * MiB, 1) or "")
    too_small = pool_warning(100, 1 * MiB, 1)
    assert too_small and "smaller than one 1344x768x122 4:2:0 frame" in too_small


def test_config_sizes_the_pool_when_nothing_is_given(host) -> None:
    host(64 * GiB, 128 * GiB)
    c = Config.load(parse(["--max-concurrent-encodes", "8"]), {})
    assert (c.slabs, c.slab_size) == (24, 64 * MiB)
    assert c.pool_reason.startswith("sized to this host: ")
    assert described(c) == [
        "slab pool: 24 x 64MiB = 1.5GiB, sized to this host: 24 slabs of 64MiB for 8 "
        "concurrent 1344x768x122 4:2:0 videos (--max-concurrent-encodes) at 3 slabs each"
    ]
    host(64 * MiB, 128 * GiB)  # Docker
    c = Config(max_concurrent_encodes=8)
    assert (c.slabs, c.slab_size) == (4, 8 * MiB)
    lines = described(c)
    assert len(lines) == 2 and lines[0].startswith("slab pool: 4 x 8MiB = 32MiB, sized")
    assert lines[1] == pool_warning(4, 8 * MiB, 8)


@pytest.mark.parametrize(
    ("argv", "env", "file"),
    [
        (["--slabs", "5", "--slab-size", "2MiB"], {}, ""),
        ([], {"VIDEO_SIDECAR_SLABS": "5", "VIDEO_SIDECAR_SLAB_SIZE": "2MiB"}, ""),
        ([], {}, 'slabs = 5\nslab-size = "2MiB"\n'),
        (["--slabs", "5"], {"VIDEO_SIDECAR_SLAB_SIZE": "2MiB"}, "slabs = 9\n"),
    ],
)
def test_explicit_settings_override(host, tmp_path, argv, env, file) -> None:
    host(64 * MiB, 128 * GiB)
    if file:
        (tmp_path / "c.toml").write_text(file)
        argv = [*argv, "--config", str(tmp_path / "c.toml")]
    parser = argparse.ArgumentParser()
    Config.add_arguments(parser)
    Config.add_config_argument(parser)
    c = Config.load(parser.parse_args(argv), env)
    assert (c.slabs, c.slab_size, c.pool_reason) == (5, 2 * MiB, "")
    assert described(c)[0] == "slab pool: 5 x 2MiB = 10MiB, as configured"


def test_one_setting_given_the_config_chooses_the_other(host) -> None:
    host(1 * GiB, 128 * GiB)
    c = Config.load(parse(["--max-concurrent-encodes", "8"]), {"VIDEO_SIDECAR_SLABS": "2"})
    assert (c.slabs, c.slab_size) == (2, 64 * MiB)
    assert described(c)[0] == (
        "slab pool: 2 x 64MiB = 128MiB, --slabs as configured, the slab size chosen for "
        "this host: 64MiB"
    )
    c = Config.load(parse(["--slab-size", "16MiB", "--max-concurrent-encodes", "8"]), {})
    assert (c.slabs, c.slab_size) == (32, 16 * MiB)
    assert c.pool_reason.startswith("--slab-size as configured, the count chosen")


def test_auto_is_a_word_and_overrides_lower_sources(host) -> None:
    host(64 * GiB, 128 * GiB)
    env = {"VIDEO_SIDECAR_SLABS": "5", "VIDEO_SIDECAR_MAX_CONCURRENT_ENCODES": "2"}
    c = Config.load(parse(["--slabs", "auto", "--slab-size", "AUTO"]), env)
    assert (c.slabs, c.slab_size) == (6, 64 * MiB)
    assert Config.to_args({"slabs": "auto"}) == ["--slabs", "auto"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"VIDEO_SIDECAR_SLABS": "0"}, "slabs must be 1 to 1024 \\(or auto\\)"),
        ({"VIDEO_SIDECAR_SLABS": "-1"}, "slabs must be 1 to 1024"),
        ({"VIDEO_SIDECAR_SLABS": "1025"}, "slabs must be 1 to 1024"),
        ({"VIDEO_SIDECAR_SLAB_SIZE": "0"}, "slab_size must be at least 1MiB \\(or auto\\)"),
        ({"VIDEO_SIDECAR_SLAB_SIZE": "1000"}, "slab_size must be at least 1MiB"),
    ],
)
def test_a_written_zero_is_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Config.load(parse([]), env)
    ((name, value),) = env.items()
    flag = Config.flag_name(name.removeprefix("VIDEO_SIDECAR_").lower())
    with pytest.raises(SystemExit):  # a usage error, as from `serve --slabs 0`
        parse([flag, value])


def test_a_config_never_holds_a_zero(host) -> None:
    host(None, None)
    c = Config(slabs=0, slab_size=0, max_concurrent_encodes=3)
    assert (c.slabs, c.slab_size) == (9, 64 * MiB)
    assert "slabs = 9  # default (auto on this host)" in c.to_toml(
        dict.fromkeys(Config.__dataclass_fields__, "default")
    )
    with pytest.raises(ValueError, match="slabs must be 1 to 1024"):
        Config(slabs=-1)


def test_help_says_what_auto_means(host) -> None:
    host(64 * MiB, 128 * GiB)
    parser = argparse.ArgumentParser()
    Config.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "or auto: 3 for each concurrent encode" in text
    assert "[default: auto: 4 here; env VIDEO_SIDECAR_SLABS]" in text
    assert "[default: 64MiB; 8MiB here; env VIDEO_SIDECAR_SLAB_SIZE]" in text


def test_host_totals_reads_this_host(tmp_path) -> None:
    shm, memory = host_totals("/dev/shm")
    assert shm is not None and shm > 0 and memory is not None and memory > 0
    assert host_totals(str(tmp_path / "missing"))[0] is None
