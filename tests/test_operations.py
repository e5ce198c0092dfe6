"""Operations: metrics, structured logs with request ids, the config file, the CLI."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from client import InvalidArgument, Reason
from client.patterns import moving_pattern

from .helpers import decode, psnr
from .test_cli import run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_prometheus_metrics(make_daemon) -> None:
    pytest.importorskip("prometheus_client")
    port = free_port()
    d = make_daemon(metrics=f"127.0.0.1:{port}")
    with d.client() as c:
        c.encode(moving_pattern(6, 64, 64))
        with pytest.raises(InvalidArgument, match="output root") as info:
            c.encode(moving_pattern(2, 64, 64), path="../out.mp4")  # the daemon's refusal
        assert info.value.reason is Reason.INVALID_REQUEST
        held = c.lease(1 << 20)
        text = (
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        )
        c.release(held)
    lines = {
        line.split(" ")[0]: line.split(" ")[-1] for line in text.splitlines() if line[:1] != "#"
    }
    assert lines['video_sidecar_requests_total{code="OK"}'] == "1.0"
    assert lines['video_sidecar_requests_total{code="INVALID_ARGUMENT"}'] == "1.0"
    assert lines['video_sidecar_errors_total{code="INVALID_ARGUMENT"}'] == "1.0"
    assert lines["video_sidecar_frames_total"] == "6.0"
    assert float(lines["video_sidecar_output_bytes_total"]) > 0
    assert lines["video_sidecar_encode_seconds_count"] == "1.0"
    assert float(lines['video_sidecar_pool_bytes{state="leased"}']) >= 1 << 20
    assert float(lines['video_sidecar_pool_bytes{state="total"}']) == 4 * 16 * 1024 * 1024
    for name in ("video_sidecar_leases_active", "video_sidecar_lease_expiries_total",
                 "video_sidecar_encodes_active", "video_sidecar_encodes_queued"):  # fmt: skip
        assert name in lines, name


def test_json_logs_carry_the_request_id(make_daemon, connect) -> None:
    d = make_daemon(log_json="true")
    with connect(d) as c:
        c.encode(moving_pattern(3, 32, 32), request_id="job-4711")
    records = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
    mine = [r for r in records if r.get("request_id") == "job-4711"]
    assert mine, d.log()
    assert mine[0]["status"] == "OK" and mine[0]["frames"] == 3 and mine[0]["level"] == "info"
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)


def test_config_file_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "sidecar.toml"
    cfg.write_text('slabs = 3\nslab-size = "2MiB"\nlease_ttl = 7.5\nlog_json = true\n')
    env = {"VIDEO_SIDECAR_CONFIG": str(cfg), "VIDEO_SIDECAR_SLAB_SIZE": "4MiB"}
    result = run(["config", "--json", "--lease-ttl", "9"], env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    c, src = data["config"], data["sources"]
    assert (c["slabs"], src["slabs"]) == (3, f"file {cfg}")
    assert (c["slab_size"], src["slab_size"]) == (4 << 20, "env")
    assert (c["lease_ttl"], src["lease_ttl"]) == (9.0, "flag")
    assert (c["log_json"], src["log_json"]) == (True, f"file {cfg}")
    assert src["max_frames"] == "default"
    toml = run(["config", "--config", str(cfg)], {}).stdout
    assert "slabs = 3  # file" in toml


def test_config_file_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("slabz = 3\n")
    result = run(["config", "--config", str(cfg)])
    assert result.returncode == 2 and "unknown setting 'slabz'" in result.stderr
    cfg.write_text("slabs = [\n")
    assert run(["serve", "--config", str(cfg)]).returncode == 2


def test_encode_command(daemon, tmp_path: Path) -> None:
    video = moving_pattern(12, 64, 96)
    floats = (video.astype(np.float32) / 127.5 - 1).transpose(3, 0, 1, 2)[None]  # BCTHW
    source = tmp_path / "clip.npy"
    np.save(source, floats)
    out = tmp_path / "clip.mp4"
    result = run(["encode", str(source), "-o", str(out), "--socket", daemon.socket,
                  "--value-range=-1,1", "--crf", "16"])  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
    frames, _ = decode(out)
    assert psnr(frames, video) >= 40


def test_encode_command_bad_input(daemon, tmp_path: Path) -> None:
    np.save(tmp_path / "bad.npy", np.zeros((2, 3), np.uint8))
    result = run(["encode", str(tmp_path / "bad.npy"), "--socket", daemon.socket])
    assert result.returncode == 2 and "InvalidVideo" in result.stderr  # an input problem
    assert run(["encode", str(tmp_path / "missing.npy")]).returncode == 2


def test_health_command(daemon, tmp_path: Path) -> None:
    ok = run(["health", "--socket", daemon.socket])
    assert ok.returncode == 0 and ok.stdout.strip() == "SERVING"
    down = run(["health", "--socket", str(tmp_path / "none.sock"), "--timeout", "1"])
    assert down.returncode == 1


def test_an_encode_its_deadline_stopped_is_logged_and_counted_as_that(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Over gRPC the daemon knows the call's deadline: the encode it stopped is logged,
    counted and answered as DEADLINE_EXCEEDED, not as a cancel the client never made."""
    from client import DeadlineExceeded

    d = make_daemon(log_json="true", framed_socket=False)
    grain = np.random.default_rng(2).integers(0, 256, (90, 256, 448, 3), dtype=np.uint8)
    with d.client() as c:
        with pytest.raises(DeadlineExceeded):
            c.encode(grain, preset="medium", timeout=0.4, request_id="late-1")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            records = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
            mine = [r for r in records if r.get("request_id") == "late-1" and "status" in r]
            if mine:
                break
            time.sleep(0.1)
        assert mine and mine[0]["status"] == "DEADLINE_EXCEEDED", d.log()[-2000:]
        assert c.status().counters["errors"].get("DEADLINE_EXCEEDED", 0) >= 1


def test_the_deadline_the_client_sent_stops_the_encode(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """The deadline a client sends in the metadata is the one the daemon keeps, when it
    falls before the one gRPC carried: the encode stops there and is logged and answered
    as DEADLINE_EXCEEDED. (gRPC's own deadline falls later on the daemon's side by the
    time the call took to arrive, which on a loaded host makes a cancel of it.)"""
    import grpc

    from sidecar.api.v1 import sidecar_pb2 as pb
    from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc
    from sidecar.vocabulary import DEADLINE_KEY

    d = make_daemon(log_json="true", framed_socket=False)
    frames, width, height = 45, 448, 256  # one lease: a slab holds 16 MiB
    grain = np.random.default_rng(3).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    with grpc.insecure_channel(f"unix:{d.socket}") as channel:
        s = pb_grpc.VideoSidecarStub(channel)  # type: ignore[no-untyped-call]
        attached = s.Attach(pb.AttachRequest(client_name="sent-deadline"))
        token = attached.client_token
        lease = s.Lease(pb.LeaseRequest(client_token=token, size=grain.nbytes, wait_ms=5000))
        slab = next(x for x in attached.slabs if x.id == lease.slab_id)
        with open(Path(attached.shm_dir) / slab.shm_name, "r+b") as f:
            f.seek(lease.offset)
            f.write(grain.tobytes())
        request = pb.EncodeRequest(
            client_token=token, request_id="sent-1",
            video=pb.VideoDescriptor(
                width=width, height=height, pixel_format=pb.PIXEL_FORMAT_RGB24,
                fps=pb.Rational(num=24, den=1),
                ranges=[pb.FrameRange(lease_id=lease.lease_id, frame_count=frames)],
            ),
            codec=pb.CodecOptions(codec="h264", preset="veryslow"),
            output=pb.OutputSpec(bytes=pb.BytesOutput()),
        )  # fmt: skip
        sent = ((DEADLINE_KEY, f"{time.time() + 0.3:.6f}"),)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            for _ in s.Encode(request, timeout=60, metadata=sent):
                pass
        took = time.monotonic() - started
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value
    assert took < 20, took  # stopped at the deadline sent, not gRPC's 60 s
    deadline = time.monotonic() + 10
    mine: list[dict[str, object]] = []
    while not mine and time.monotonic() < deadline:
        records = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
        mine = [r for r in records if r.get("request_id") == "sent-1" and "status" in r]
        time.sleep(0.1)
    assert mine and mine[0]["status"] == "DEADLINE_EXCEEDED", d.log()[-2000:]
