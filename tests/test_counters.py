"""The daemon's counters after ordinary traffic: routine outcomes apart from errors, totals
that add up, and an encode its client cancelled logged with the frames it had encoded."""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

import numpy as np
import pytest

from client import DeadlineExceeded, FrameRange, NotFound
from client.patterns import moving_pattern
from sidecar.pool.leases import SPARE_TTL

from .test_cli import run
from .test_operations import free_port


def _metrics(port: int) -> dict[str, str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        line.split(" ")[0]: line.split(" ")[-1] for line in text.splitlines() if line[:1] != "#"
    }


def _settled(c: Any) -> Any:
    """The status once no encode runs and every request has ended."""
    deadline = time.monotonic() + 10
    while True:
        s = c.status()
        k = s.counters
        ended = k["encodes_ok"] + k["encodes_failed"]
        if (s.active_encodes == 0 and ended == k["requests"]) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def _ordinary_traffic(c: Any) -> None:
    """Whole videos (each result brings a spare lease), a file, a stream, frames leased by
    hand and released after their encode, and a spare left to expire."""
    for frames in (8, 8, 12):
        c.encode(moving_pattern(frames, 64, 64))
    c.encode(moving_pattern(8, 64, 64), path="ordinary.mp4")
    with c.stream(fps=24) as s:
        for _ in range(3):
            s.write(moving_pattern(8, 64, 64))
    video = moving_pattern(4, 64, 64)
    lease = c.lease(video.nbytes)
    lease.array[: video.nbytes] = video.reshape(-1)
    c.encode_leased([FrameRange(lease, 4)], width=64, height=64)
    c.release(lease)  # its encode freed it already: done, as the client takes it
    c.encode(moving_pattern(8, 64, 64))  # its spare expires unused
    time.sleep(SPARE_TTL + 1.5)


def test_ordinary_traffic_leaves_no_errors(make_daemon) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("prometheus_client")
    port = free_port()
    d = make_daemon(metrics=f"127.0.0.1:{port}")
    with d.client() as c:
        _ordinary_traffic(c)
    with d.client() as c:  # the first client has closed: its expired spare given back
        s = _settled(c)
    k = s.counters
    assert k["errors"] == {}, k
    assert k["releases_already_freed"] >= 2, k  # the leased frames, the expired spare
    assert k["spares_expired"] >= 1, k
    assert k["requests"] == k["encodes_ok"] == 7 and k["encodes_failed"] == 0, k
    lines = _metrics(port)
    assert lines['video_sidecar_errors_total{code="NOT_FOUND"}'] == "0.0"
    assert float(lines['video_sidecar_routine_total{kind="release_already_freed"}']) >= 2
    assert float(lines['video_sidecar_routine_total{kind="spare_expired"}']) >= 1
    human = run(["status", "--socket", d.socket]).stdout
    assert "errors" not in human, human
    assert re.search(r"routine  \d+ releases? of leases already freed", human), human


def test_totals_add_up_with_each_outcome_labelled(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Refused, cancelled and successful requests: each counted under one label."""
    d = make_daemon()
    with d.client() as c:
        c.encode(moving_pattern(8, 64, 64))
        with pytest.raises(NotFound):  # a lease it never had: refused before it is encoded
            c.encode_leased([FrameRange("0" * 32, 1)], width=64, height=64)
        with pytest.raises(RuntimeError, match="stop"), c.stream(fps=24) as s:
            s.write(moving_pattern(8, 64, 64))
            # Cancelled once the daemon has it: a stream cancelled before its call
            # reached the daemon is no request there.
            deadline = time.monotonic() + 10
            while c.status().counters["requests"] < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            raise RuntimeError("stop")  # the client cancels its stream
        k = _settled(c).counters
    assert k["requests"] == 3 and k["encodes_ok"] == 1, k
    assert k["encodes_failed"] == 2 and k["encodes_cancelled"] == 1, k
    assert k["errors"] == {"NOT_FOUND": 1}, k  # a lease never granted is an error still
    human = run(["status", "--socket", d.socket]).stdout
    assert "totals   3 requests: 1 ok, 1 failed, 1 cancelled, 0 in flight" in human, human


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])
def test_an_encode_its_client_stopped_logs_the_frames_it_encoded(make_daemon, framed: bool) -> None:  # type: ignore[no-untyped-def]
    """As Ctrl-C in the client does (over gRPC, from its progress callback), or a deadline
    that passes (on the framed socket, which closes the connection): the log says how far
    the encode got, as a lower bound, not frames=0 as if none were encoded."""
    d = make_daemon(framed_socket=framed, slabs=8)  # 128 MiB: the 62 MB video is one request
    grain = np.random.default_rng(3).integers(0, 256, (180, 256, 448, 3), dtype=np.uint8)

    def interrupt(done: int, total: int) -> None:
        if done:
            raise KeyboardInterrupt

    with d.client() as c:
        if framed:
            with pytest.raises(DeadlineExceeded):
                c.encode(grain, preset="veryslow", timeout=1.5, request_id="interrupted")
        else:
            with pytest.raises(KeyboardInterrupt):
                c.encode(grain, preset="medium", on_progress=interrupt, request_id="interrupted")
        _settled(c)
    line = next(x for x in d.log().splitlines() if "request_id=interrupted status=" in x)
    assert "status=CANCELLED" in line or "status=DEADLINE_EXCEEDED" in line, line
    assert " frames=" not in line, line  # no exact count is claimed
    frames = re.search(r" frames_at_least=(\d+) ", line)
    assert frames and 0 < int(frames.group(1)) < 180, line


def test_a_streamed_encode_whose_progress_callback_raises_is_stopped(  # type: ignore[no-untyped-def]
    make_daemon, connect, twin: str
) -> None:
    """A video larger than half the pool goes as a stream: Ctrl-C in its progress callback
    (an error, on the async twin, whose loop must go on) stops the daemon's encode at
    once, as it does for one sent as one request, rather than leaving the call open with
    the encode running on and its replies unread until the client closes."""
    d = make_daemon()  # 64 MiB: a video over 32 MiB goes as a stream
    grain = np.random.default_rng(5).integers(0, 256, (120, 256, 448, 3), dtype=np.uint8)
    stop = KeyboardInterrupt if twin == "sync" else RuntimeError

    def interrupt(done: int, total: int) -> None:
        if done:
            raise stop("stop")

    with connect(d) as c:
        started = time.monotonic()
        with pytest.raises(stop):
            c.encode(grain, preset="medium", on_progress=interrupt, request_id="stopped")
        while "request_id=stopped status=" not in d.log():
            assert time.monotonic() - started < 10, d.log()[-2000:]
            time.sleep(0.05)
        assert c.status().active_encodes == 0
    line = next(x for x in d.log().splitlines() if "request_id=stopped status=" in x)
    assert "status=CANCELLED" in line, line
    frames = re.search(r" frames_at_least=(\d+) ", line)
    assert frames and 0 < int(frames.group(1)) < 120, line


def test_the_log_line_is_documented_as_it_is_written() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    assert "`frames=N`" in text and "`frames_at_least=N`" in text and "lower" in text
