"""Graceful shutdown: NOT_SERVING, new work refused, in-flight encodes finish, slabs go."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

from client import SidecarUnavailable
from client.patterns import moving_pattern


def test_sigterm_drains_then_unlinks(make_daemon) -> None:
    d = make_daemon(shutdown_grace=30)
    video = moving_pattern(60, 288, 512)
    outcome: dict[str, object] = {}

    def long_encode() -> None:
        with d.client() as c:
            try:
                outcome["result"] = c.encode(video, preset="slow", threads=1)
            except Exception as exc:  # the assertion below reports it
                outcome["error"] = exc

    worker = threading.Thread(target=long_encode)
    with d.client() as probe:
        probe.status()  # attached and mapped before the encode starts: it must see it run
        worker.start()
        deadline = time.monotonic() + 10
        while probe.status().active_encodes == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert probe.status().active_encodes == 1, d.log()
        d.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        time.sleep(0.3)
        assert probe.health() == "NOT_SERVING", d.log()
        with pytest.raises(SidecarUnavailable, match="shutting down"):
            try:
                probe.encode(moving_pattern(2, 32, 32))
            except SidecarUnavailable as exc:
                assert "shutting down" in str(exc), (outcome, d.log())
                raise
        assert d.segments(), "slabs stay while an encode runs"
    worker.join(60)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].frames == 60  # type: ignore[attr-defined]
    assert d.process.wait(30) == 0  # type: ignore[union-attr]
    assert d.segments() == []


def test_streams_in_flight_get_the_grace_period(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A stream still sending chunks when SIGINT comes finishes: it may still lease."""
    d = make_daemon(shutdown_grace=30)
    chunk = moving_pattern(8, 96, 128)
    with d.client() as c, c.stream(fps=24) as s:
        s.write(chunk)
        # In flight: the daemon has the stream (its first chunk may still be on the way
        # when write returns, and a stream it never saw is not one it owes a grace to).
        deadline = time.monotonic() + 10
        while c.status().active_encodes == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        d.process.send_signal(signal.SIGINT)  # type: ignore[union-attr]
        for _ in range(10):  # a second and more of chunks, after the signal
            time.sleep(0.1)
            s.write(chunk)
    assert s.result.frames == 88
    assert d.process.wait(30) == 0  # type: ignore[union-attr]
    log = d.log()
    assert "status=OK frames=88" in log, log[-2000:]
    assert d.segments() == []


def test_second_signal_forces_the_exit(make_daemon) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon(shutdown_grace=120)
    video = np.random.default_rng(0).integers(0, 255, (120, 288, 512, 3), dtype=np.uint8)
    errors: list[Exception] = []

    def long_encode() -> None:
        with d.client() as c:
            try:
                c.encode(video, preset="veryslow", threads=1, crf=0)
            except Exception as exc:  # checked below
                errors.append(exc)

    worker = threading.Thread(target=long_encode)
    with d.client() as probe:
        probe.status()  # attached and mapped before the encode starts: it must see it run
        worker.start()
        deadline = time.monotonic() + 10
        while probe.status().active_encodes == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    d.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    time.sleep(0.5)
    t0 = time.monotonic()
    d.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert d.process.wait(30) == 0  # type: ignore[union-attr]
    assert time.monotonic() - t0 < 2.5  # prompt: the encoder is aborted, not awaited
    worker.join(30)
    assert len(errors) == 1 and isinstance(errors[0], SidecarUnavailable), errors
    assert errors[0].reason == "SHUTTING_DOWN"  # not "cancelled by the client"
    assert "stopped" in str(errors[0])
    assert d.segments() == []
