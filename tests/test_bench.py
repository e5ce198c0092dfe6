"""The bench's own tools run and record what they say (their figures live in bench/results)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def test_the_traffic_suite_counts_failed_requests_and_keeps_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each pattern against the sidecar and upstream_a, with counts; a request that fails
    is counted, with its error, and the run goes on. Here the default pool's daemon refuses
    frames wider than 600 pixels, so its 672x384 requests fail and the others succeed."""
    from bench import daemons, traffic
    from bench.__main__ import main
    from bench.traffic import suite

    started = daemons.daemon

    def daemon(**options: Any) -> Any:
        if "slabs" not in options:  # the default pool's daemons (the bursts send 448x256)
            options["max_width"] = 600
        return started(**options)

    monkeypatch.setattr(daemons, "daemon", daemon)
    for module in (traffic, suite):  # plans are made in this process, as the record says
        monkeypatch.setattr(module, "BURST_CLIENTS", 2)
        monkeypatch.setattr(module, "STEADY_REQUESTS", 1)
    out = tmp_path / "traffic.json"
    patterns = ("mixed_default_pool", "mixed_small_pool", "bursts_after_idle", "first_after_start")
    argv = ["--suite", "traffic", "--clients", "2", "--workers", "2", "--requests", "4",
            "--idle", "1", "--waves", "2", "--patterns", ",".join(patterns)]  # fmt: skip
    assert main([*argv, "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    rows = {(r["extra"]["pattern"], r["variant"]): r for r in payload["rows"]}
    assert set(rows) == {(p, v) for p in patterns for v in traffic.SIDES}
    for (pattern, variant), row in rows.items():
        x = row["extra"]
        assert row["suite"] == "traffic" and row["content"] == "smooth"
        sent = {"bursts_after_idle": 2 * (1 + 2), "first_after_start": 2 * (1 + 1)}.get(pattern, 8)
        assert x["requests"] == sent == len([e for e in x["log"] if e[2] != "warmup"])
        assert x["requests"] == x["ok"] + x["failed"] + x["skipped"] and x["skipped"] == 0
        assert sum(k["requests"] for k in x["by_kind"].values()) == x["requests"]
        assert x["failed"] == len([e for e in x["log"] if e[2] != "warmup" and not e[4]])
        assert all(k["psnr_db"] is None or k["psnr_db"] > 35 for k in x["by_kind"].values())
        if variant == "upstream_a" or pattern in ("bursts_after_idle", "first_after_start"):
            assert x["failed"] == 0 and x["p50_ms"] > 0 and x["p99_ms"] >= x["p50_ms"]
    # The small pool (4x8MiB) may fail requests while the daemon's hold-and-wait is open.
    assert rows["mixed_small_pool", "sidecar"]["extra"]["pool"] == "4x8MiB"
    refused = rows["mixed_default_pool", "sidecar"]["extra"]
    wide = [k for k in refused["by_kind"] if k.startswith("672x384")]
    assert refused["failed"] == sum(refused["by_kind"][k]["failed"] for k in wide) == 4
    assert "OutOfRange" in refused["first_error"] and refused["ok"] == 4
    assert refused["lease_ms"]["p50"] is not None and refused["p50_vs_upstream_a"] > 0
    burst = rows["bursts_after_idle", "sidecar"]["extra"]
    assert burst["idle_s"] == 1 and [w["wave"] for w in burst["waves"]] == [1, 2]
    assert burst["first_wave_vs_upstream_a"] > 0 and burst["steady_p50_ms"] > 0
    first = rows["first_after_start", "sidecar"]["extra"]["first_vs_steady"]
    assert set(first) == {"448x256x4 encode", "448x256x48 encode"}
    assert all(f["first_ms"] > 0 and f["ratio"] > 0 for f in first.values())
    assert payload["meta"]["traffic"]["log_fields"][:3] == ["worker", "client", "stage"]
    text = capsys.readouterr().out
    assert "| smooth | mixed_default_pool |" in text and "| 2 | 8 | 4 | 0 |" in text


def test_the_rdt_suite_records_time_size_and_quality_side_by_side(tmp_path: Path) -> None:
    """Each variant's median time beside its bytes, PSNR and SSIM, and the anchor in the
    same run; upstream A at the sidecar's very settings (so its bytes are near its own)."""
    from bench import rdt

    out = tmp_path / "rdt.json"
    argv = ["--shapes", "96x64x6", "--contents", "smooth", "--samples", "1", "--variants",
            "export_emulated,sidecar_balanced,upstream_a_balanced,sidecar_fast", "--json",
            str(out)]  # fmt: skip
    assert rdt.main(argv) == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"export_emulated", "sidecar_balanced", "upstream_a_balanced",
                         "sidecar_fast"}  # fmt: skip
    for row in rows.values():
        assert row["samples"] == 1 and row["extra"]["bytes"] > 0
        assert row["extra"]["psnr_db"] > 30 and 0.9 < row["extra"]["ssim"] <= 1
    fast, balanced = rows["sidecar_fast"]["extra"], rows["sidecar_balanced"]["extra"]
    assert fast["bytes"] > balanced["bytes"]  # the fast profile's size cost
    with pytest.raises(SystemExit, match="profiles"):
        rdt.main(["--variants", "sidecar_quick"])


def test_x264_options_are_timed_beside_balanced_and_export_to_video(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each set is balanced plus a request's x264-params, checked as the daemon checks
    them; its bytes and PSNR against export_to_video's settings say whether it keeps
    balanced's bounds."""
    from bench import x264_options

    out = tmp_path / "options.json"
    argv = ["--shapes", "96x64x6", "--contents", "smooth", "--rounds", "1", "--cores", "4",
            "--sets", "sub=subme=1;sf=preset=superfast:mbtree=1", "--json", str(out)]  # fmt: skip
    assert x264_options.main(argv) == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["export_to_video", "balanced", "sub", "sf"]
    assert rows["export_to_video"]["extra"]["options"] == {"preset": "medium", "crf": "25"}
    assert rows["sf"]["extra"]["options"]["preset"] == "superfast"
    assert "subme=1" in rows["sub"]["extra"]["options"]["x264-params"]
    for row in rows.values():
        assert row["extra"]["bytes"] > 0 and row["extra"]["psnr_db"] > 30
    assert "| sub |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"--sets: bad: .*x264-params"):
        x264_options.main(["--contents", "smooth", "--sets", "bad=frobnicate=1"])
    with pytest.raises(SystemExit, match="--sets"):
        x264_options.main(["--sets", "no params"])


def test_the_cold_suite_times_fresh_workers_against_upstream(tmp_path: Path) -> None:
    from bench import cold

    out = tmp_path / "cold.json"
    argv = ["--workers", "1", "--idle", "0", "--waves", "2", "--shape", "64x48x2", "--json",
            str(out)]  # fmt: skip
    assert cold.main(argv) == 0
    results = json.loads(out.read_text())["results"]
    assert results["first_no_warm_up"][0]["first_ms"] > 0
    assert results["warm_up"][0]["warm_up_ms"] > 0
    assert len(results["burst_after_idle"]["waves_ms"]) == 2
    assert len(results["burst_after_idle"]["warm_waves_ms"]) == 2  # the same, warm
    assert len(results["upstream_burst_after_idle"]["warm_waves_ms"]) == 2
    assert results["upstream_burst_after_idle"]["steady_ms"] > 0


def test_client_trees_side_by_side(tmp_path: Path) -> None:
    """`bench.client_ab`: each tree's own client in the burst's worker, rounds alternating,
    a row per tree and round; a folder without a client package is refused."""
    from bench import client_ab

    root = str(Path(__file__).resolve().parents[1])
    out = tmp_path / "ab.json"
    argv = ["--clients", root, root, "--rounds", "1", "--waves", "2", "--shape", "64x48x2",
            "--json", str(out)]  # fmt: skip
    assert client_ab.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["tree"] for r in rows] == [f"0:{root}", f"1:{root}"]
    for r in rows:
        assert r["steady_ms"] > 0 and r["later_waves_ms"] > 0 and r["warm_waves_ms"] > 0
    with pytest.raises(SystemExit, match="no client/ package"):
        client_ab.main(["--clients", str(tmp_path)])


def test_client_profile_prices_n_clients_of_one_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`bench.client_profile --clients N [--processes]`: one client, then N of one process
    back to back and in waves, each line with its wall time, copy, the daemon's time and
    the process's CPU a request; then N processes of one client each, the same two ways."""
    from bench import client_profile

    argv = ["--calls", "0", "--clients", "2", "--rounds", "3", "--shape", "64x48x2", "--processes"]
    client_profile.main(argv)
    lines = capsys.readouterr().out.splitlines()
    labels = [line.split(":")[0] for line in lines]
    assert labels == [
        "1 client, back to back",
        *["2 clients, back to back"] * 2,
        "2 clients, waves",
        "2 processes, back to back",
        "2 processes, waves",
    ]
    for line in lines:
        assert "(medians of 6)" in line
        wall = float(line.split("wall ")[1].split(" ms")[0])
        in_daemon = float(line.split("daemon ")[1].split(" ms")[0])
        assert 0 < in_daemon < wall
    for line in lines[:4]:
        cpu = float(line.split("CPU ")[1].split(" ms")[0])
        assert cpu > 0


def test_cuts_measure_what_a_keyframe_costs_beside_one_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench.cuts`: one encoder against two at once, at `balanced`: every frame decodes
    back from the segments, and the second segment's keyframe costs bytes."""
    from bench import cuts

    out = tmp_path / "cuts.json"
    argv = ["--shapes", "96x64x30", "--content", "smooth", "--segments", "1,2", "--samples", "1"]
    assert cuts.main([*argv, "--json", str(out)]) == 0
    one, two = json.loads(out.read_text())["rows"]
    assert (one["variant"], two["variant"]) == ("segments_1", "segments_2")
    assert len(two["extra"]["threads"]) == 2
    assert two["extra"]["bytes"] > one["extra"]["bytes"] > 0
    assert (
        one["extra"]["psnr_db"] > 40 and abs(two["extra"]["psnr_db"] - one["extra"]["psnr_db"]) < 1
    )
    assert one["extra"]["options"]["preset"] == "veryfast"
    assert "| smooth | 96x64x30 | 2 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--segments"):
        cuts.main(["--segments", "0"])


def test_cuts_can_encode_the_cut_video_at_another_crf(tmp_path: Path) -> None:
    """`--crf-offset`: every count but the first at the profile's CRF plus the offset,
    which x264 takes as a fraction; fewer bytes for it."""
    from bench import cuts

    out = tmp_path / "cuts.json"
    argv = ["--shapes", "96x64x30", "--content", "smooth", "--segments", "1,2,2", "--samples", "1"]
    assert cuts.main([*argv, "--crf-offset", "2.5", "--json", str(out)]) == 0
    one, two, _ = json.loads(out.read_text())["rows"]
    assert float(two["extra"]["options"]["crf"]) == float(one["extra"]["options"]["crf"]) + 2.5
    plain = tmp_path / "plain.json"
    assert cuts.main([*argv, "--json", str(plain)]) == 0
    assert two["extra"]["bytes"] < json.loads(plain.read_text())["rows"][1]["extra"]["bytes"]
