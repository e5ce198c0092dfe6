"""The bench's own tools run and record what they say (their figures live in bench/results)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_the_floor_times_upstream_and_x264_alone_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import floor

    out = tmp_path / "floor.json"
    argv = ["--shapes", "96x64x3", "--content", "noisy", "--samples", "2", "--json", str(out)]
    assert floor.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["variant"], r["shape"], r["content"]) for r in rows] == [
        ("upstream_a", "96x64x3", "noisy"),
        ("x264_alone", "96x64x3", "noisy"),
    ]
    assert rows[0]["ratio_to_upstream_a"] == 1.0 and rows[1]["samples"] == 2
    assert rows[1]["extra"]["output_bytes"] > 0
    meta = json.loads(out.read_text())["meta"]
    assert meta["command"].startswith("python -m bench.floor --shapes 96x64x3")
    assert meta["machine"]["threads_per_core"] >= 1  # what "cores" are made of
    assert "| noisy | 96x64x3 | x264_alone |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--content"):
        floor.main(["--content", "grainy"])


def test_the_parallel_floor_adds_up_concurrent_x264_encoders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--processes N`: N encoders at once, each with the daemon's share of the cores."""
    from bench import floor

    out = tmp_path / "floor.json"
    argv = ["--processes", "2", "--seconds", "0.5", "--shapes", "96x64x30"]
    assert floor.main([*argv, "--content", "noisy", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["variant"], row["shape"], row["content"]) == ("x264_alone", "96x64x30", "noisy")
    assert row["extra"]["processes"] == 2 and row["extra"]["threads"] >= 1
    assert row["samples"] >= 2 and row["extra"]["frames_per_s"] > 0
    assert "| noisy | 96x64x30 | 2 x " in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--processes"):
        floor.main(["--processes", "-1"])


def test_the_node_suite_records_the_daemons_memory_after_its_idle(tmp_path: Path) -> None:
    """`--idle` samples RssAnon of the daemon and of its encoder processes (its children)
    after the load: the figure behind the README's memory row."""
    from bench.__main__ import main
    from sidecar.config_values import default_encoder_processes

    out = tmp_path / "node.json"
    argv = ["--suite", "node", "--throughput-shape", "96x64x2", "--clients", "2",
            "--requests", "1", "--workers", "1", "--idle", "1", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows if r["suite"] == "node"] == ["node_rgb24", "node_yuv420p"]
    memory = next(r for r in rows if r["suite"] == "memory")
    x = memory["extra"]
    assert x["processes"] >= min(3, default_encoder_processes())  # found as its children
    assert memory["median_ms"] == x["idle"][-1]["total_mib"] > x["daemon_mib"] > 10
    assert x["idle"][-1]["idle_s"] >= 1 and x["peak_under_load"]["total_mib"] > 0
    with pytest.raises(SystemExit, match="--idle"):
        main(["--suite", "e2e", "--idle", "5"])
