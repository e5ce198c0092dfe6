"""The daemon's counters after ordinary traffic: routine outcomes apart from errors, totals
that add up, and an encode its client cancelled logged with the frames it had encoded."""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

import numpy as np
import pytest

from client import FrameRange, NotFound
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
            raise RuntimeError("stop")  # the client cancels its stream
        k = _settled(c).counters
    assert k["requests"] == 3 and k["encodes_ok"] == 1, k
    assert k["encodes_failed"] == 2 and k["encodes_cancelled"] == 1, k
    assert k["errors"] == {"NOT_FOUND": 1}, k  # a lease never granted is an error still
    human = run(["status", "--socket", d.socket]).stdout
    assert "totals   3 requests: 1 ok, 1 failed, 1 cancelled, 0 in flight" in human, human


def test_an_encode_its_client_cancelled_logs_the_frames_it_encoded(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """As Ctrl-C in the client does: the log says how far the encode got, not frames=0."""
    d = make_daemon(framed_socket=False)
    grain = np.random.default_rng(3).integers(0, 256, (90, 256, 448, 3), dtype=np.uint8)

    def interrupt(done: int, total: int) -> None:
        if done:
            raise KeyboardInterrupt

    with d.client() as c:
        with pytest.raises(KeyboardInterrupt):
            c.encode(grain, preset="medium", on_progress=interrupt, request_id="interrupted")
        _settled(c)
    line = next(x for x in d.log().splitlines() if "request_id=interrupted status=" in x)
    assert "status=CANCELLED" in line, line
    frames = re.search(r"frames=(\d+)", line)
    assert frames and int(frames.group(1)) > 0, line
