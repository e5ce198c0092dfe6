"""Graceful shutdown: NOT_SERVING, new work refused, in-flight encodes finish, slabs go."""

from __future__ import annotations

import itertools
import signal
import threading
import time

import pytest

from client import SidecarUnavailable
from client.patterns import moving_pattern

from .helpers import decode, wait_until


def test_sigterm_drains_then_unlinks(make_daemon) -> None:
    d = make_daemon(shutdown_grace=30)
    video = moving_pattern(60, 288, 512)
    chunk = moving_pattern(4, 64, 64)
    outcome: dict[str, object] = {}

    def long_encode() -> None:
        with d.client() as c:
            try:
                outcome["result"] = c.encode(video, preset="veryslow", threads=1)
            except Exception as exc:  # the assertion below reports it
                outcome["error"] = exc

    worker = threading.Thread(target=long_encode)
    # A stream this test holds open keeps the daemon draining for as long as the checks
    # take, on a machine of any speed; the one-call encode is the other kind in flight.
    with d.client() as probe, d.client() as streamer, streamer.stream(fps=24) as held:
        held.write(chunk)
        deadline = time.monotonic() + 10  # the daemon has the stream once it frees the chunk
        while probe.status().pool["active_leases"] and time.monotonic() < deadline:
            time.sleep(0.02)
        worker.start()  # a stream between chunks holds no encode slot
        while probe.status().active_encodes == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert probe.status().active_encodes == 1, d.log()
        d.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while probe.health() != "NOT_SERVING" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert probe.health() == "NOT_SERVING", d.log()
        with pytest.raises(SidecarUnavailable, match="shutting down"):
            try:
                probe.encode(moving_pattern(2, 32, 32))
            except SidecarUnavailable as exc:
                assert "shutting down" in str(exc), (outcome, d.log())
                raise
        assert d.segments(), "slabs stay while an encode runs"
        held.write(chunk)  # a stream in flight may still send
        worker.join(60)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].frames == 60  # type: ignore[attr-defined]
    assert held.result.frames == 8
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


@pytest.mark.exclusive
def test_second_signal_forces_the_exit(make_daemon) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon(shutdown_grace=120, slabs=8)  # 128 MiB: the 53 MB video is one request
    video = moving_pattern(240, 288, 512)  # seconds at this preset, on a fast core too
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


def test_videos_waiting_for_room_finish_after_the_signal(make_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A video larger than the pool travels as a stream that waits for room for each
    chunk, and a second video waits for room whole: with both waiting at the signal,
    SIGTERM lets both finish, each written to its file, while a new client is refused in
    words that name the stop. The room is held by hand until after the signal (an
    encode of these takes a fraction of a second: a wait left to the encodes' pace is
    too short to signal into reliably)."""
    d = make_daemon(shutdown_grace=60, slabs=2, slab_size="8MiB")
    big = moving_pattern(96, 384, 512)  # 57 MB through a 16 MiB pool
    small = moving_pattern(12, 384, 512)  # 7 MB: waits whole
    outcome: dict[str, object] = {}

    def send(name: str, video: object) -> None:
        with d.client(client_name=name) as c:
            try:
                outcome[name] = c.encode(video, path=f"{name}.mp4", preset="veryfast")
            except Exception as exc:  # the assertions below report it
                outcome[name] = exc

    workers = [
        threading.Thread(target=send, args=(n, v)) for n, v in (("big", big), ("small", small))
    ]
    with d.client() as holder, d.client() as probe:
        held = [holder.lease(8 << 20), holder.lease(8 << 20)]  # the whole pool

        def waiting() -> set[str]:
            return {w["client"] for w in probe.status().lease_waiters}

        for worker in workers:
            worker.start()
        assert wait_until(lambda: waiting() == {"big", "small"}, 30), waiting()
        d.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert wait_until(lambda: probe.health() == "NOT_SERVING", 30), "the signal was not taken"
        with pytest.raises(SidecarUnavailable, match="shutting down"), d.client() as late:
            late.encode(moving_pattern(2, 32, 32))
        assert waiting() == {"big", "small"}  # still waiting, not refused
        for lease in held:
            holder.release(lease)
        for worker in workers:
            worker.join(90)
    for name, count in (("big", 96), ("small", 12)):
        result = outcome[name]
        assert not isinstance(result, Exception), (name, result, d.log()[-3000:])
        assert result.frames == count  # type: ignore[attr-defined]
        assert len(decode(d.output_dir / f"{name}.mp4")[0]) == count
    assert d.process.wait(30) == 0  # type: ignore[union-attr]
    assert d.segments() == []
    assert not [p for p in d.output_dir.iterdir() if p.name.endswith(".part")]


def test_work_over_its_grace_is_stopped_in_words_that_say_so(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A Lease still waiting for room when the grace ends is refused, not dropped."""
    d = make_daemon(shutdown_grace=1, slabs=1, slab_size="4MiB")
    errors: list[Exception] = []
    with d.client() as holder:
        held = holder.lease(4 << 20)  # the whole pool, held by hand past the stop

        def wait_for_room() -> None:
            with d.client() as c:
                try:
                    with c.stream(fps=24) as s:
                        s.write(moving_pattern(4, 64, 64))
                except Exception as exc:  # checked below
                    errors.append(exc)

        waiter = threading.Thread(target=wait_for_room)
        waiter.start()
        deadline = time.monotonic() + 10
        while not holder.status().lease_waiters and time.monotonic() < deadline:
            time.sleep(0.01)
        d.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        waiter.join(30)
        del held
    assert d.process.wait(30) == 0  # type: ignore[union-attr]
    assert len(errors) == 1 and isinstance(errors[0], SidecarUnavailable), errors
    assert errors[0].reason == "SHUTTING_DOWN"
    assert "grace period ended" in str(errors[0])
    assert d.segments() == []


def test_the_stop_rule_tells_work_begun_from_new_work() -> None:
    """While draining: a whole video naming leases goes on, one naming none is new work;
    a stream goes on only for a client holding leases on their way (its first chunk)."""
    from sidecar.errors import ShuttingDown
    from sidecar.pipeline.admission.drain import Drain

    drain = Drain()
    for leases, stream, holding in itertools.product((0, 2), (False, True), (False, True)):
        drain.check_encode(leases=leases, stream=stream, holding=holding)  # serving: all
    drain.begin()
    drain.check_encode(leases=2, stream=False)
    drain.check_encode(leases=0, stream=True, holding=True)
    for leases, stream in ((0, False), (0, True), (2, True)):
        with pytest.raises(ShuttingDown, match="no new work"):
            drain.check_encode(leases=leases, stream=stream, holding=False)
