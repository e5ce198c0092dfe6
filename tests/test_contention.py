"""Several clients whose videos each need more than one slab, and together more than the
pool: every request succeeds, none waits on a timer (the hold-and-wait deadlock, where
each holds part of what it needs and waits for the rest, broken only by a lease wait)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import pytest

from client import ResourceExhausted, SidecarClient
from client.patterns import moving_pattern

from .helpers import Daemon

# 448x256 RGB: 344,064 bytes a frame, 24 frames to an 8 MiB slab. A 48-frame video takes
# two slabs, and four clients want eight of the pool's four.
SMALL_POOL = {"slabs": 4, "slab_size": "8MiB", "max_lease_wait": 30, "max_concurrent_encodes": 1}
H, W = 256, 448


def _limit(serial_s: float, clients: int) -> float:
    """The longest a request may take among `clients`: a few times its serial time for
    each, with a floor for a loaded machine; a 30 s lease wait is far past it."""
    return max(8.0, 3 * serial_s * clients)


def _serial(d: Daemon, send: Callable[[SidecarClient], Any]) -> float:
    with d.client() as c:
        send(c)  # warm: the first encode opens what later ones reuse
        t0 = time.monotonic()
        send(c)
        return time.monotonic() - t0


def _run_threads(
    d: Daemon, n: int, rounds: int, send: Callable[[SidecarClient, int], Any]
) -> tuple[list[float], list[BaseException]]:
    times: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(n)

    def worker(i: int) -> None:
        with d.client(client_name=f"w{i}") as c:
            start.wait()
            for _ in range(rounds):
                t0 = time.monotonic()
                try:
                    send(c, i)
                except BaseException as exc:  # counted, not raised: every failure shows
                    with lock:
                        errors.append(exc)
                with lock:
                    times.append(time.monotonic() - t0)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a client never finished"
    return times, errors


def _assert_idle(d: Daemon) -> None:
    with d.client() as c:
        deadline = time.monotonic() + 10
        while (s := c.status()).pool["active_leases"] or s.active_encodes:
            assert time.monotonic() < deadline, s
            time.sleep(0.05)
        assert s.lease_waiters == []


def test_whole_videos_of_two_slabs_each_from_threads_all_succeed(make_daemon) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon(**SMALL_POOL)
    videos = [moving_pattern(frames, H, W, seed=i) for i, frames in enumerate((36, 40, 44, 48))]
    serial = _serial(d, lambda c: c.encode(videos[-1]))
    times, errors = _run_threads(d, 5, 3, lambda c, i: c.encode(videos[i % len(videos)]))
    assert errors == [], errors[:3]
    assert max(times) <= _limit(serial, 5), (max(times), serial)
    _assert_idle(d)


def test_whole_videos_with_audio_all_succeed(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """The audio track's lease is granted with the frames', not held while waiting."""
    d = make_daemon(**SMALL_POOL)
    video = moving_pattern(40, H, W)
    tone = np.full((22050 * 2, 2), 0.1, np.float32)
    serial = _serial(d, lambda c: c.encode(video, audio=tone, sample_rate=22050))
    times, errors = _run_threads(
        d, 4, 2, lambda c, i: c.encode(video, audio=tone, sample_rate=22050)
    )
    assert errors == [], errors[:3]
    assert max(times) <= _limit(serial, 4), (max(times), serial)
    _assert_idle(d)


def _stream(c: SidecarClient, video: np.ndarray, chunk: int = 16) -> Any:
    with c.stream(fps=24) as s:
        for first in range(0, len(video), chunk):
            s.write(video[first : first + chunk])
    return s.result


def test_streams_larger_than_the_pool_all_succeed(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Six streams, some larger than the whole pool, on one encode slot: a stream waiting
    for its next chunk holds no slot, so the chunks others have sent get encoded."""
    d = make_daemon(**SMALL_POOL)
    short, long = moving_pattern(64, H, W), moving_pattern(112, H, W, seed=1)  # 112: 38.5 MB
    serial = _serial(d, lambda c: _stream(c, long))

    def send(c: SidecarClient, i: int) -> None:
        result = _stream(c, long if i % 2 else short)
        assert result.frames == (112 if i % 2 else 64)

    times, errors = _run_threads(d, 6, 2, send)
    assert errors == [], errors[:3]
    assert max(times) <= _limit(serial, 6), (max(times), serial)
    _assert_idle(d)


def test_whole_videos_and_videos_larger_than_the_pool_mixed(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """`encode` sends a video over half the pool as a stream by itself; beside whole
    videos of two slabs, none starves and none fails."""
    d = make_daemon(**SMALL_POOL)
    whole, large = moving_pattern(44, H, W), moving_pattern(120, H, W, seed=2)
    serial = _serial(d, lambda c: c.encode(large))

    def send(c: SidecarClient, i: int) -> None:
        video = large if i == 0 else whole
        assert c.encode(video).frames == len(video)

    times, errors = _run_threads(d, 5, 2, send)
    assert errors == [], errors[:3]
    assert max(times) <= _limit(serial, 5), (max(times), serial)
    _assert_idle(d)


def _encode_in_process(socket: str, frames: int, rounds: int) -> list[float]:
    video = moving_pattern(frames, H, W)
    times = []
    with SidecarClient(socket) as c:
        for _ in range(rounds):
            t0 = time.monotonic()
            c.encode(video)
            times.append(time.monotonic() - t0)
    return times


def test_whole_videos_from_processes_all_succeed(make_daemon) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon(**SMALL_POOL)
    serial = _serial(d, lambda c: c.encode(moving_pattern(48, H, W)))
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(4, mp_context=spawn) as pool:
        runs = [pool.submit(_encode_in_process, d.socket, 36 + 4 * i, 2) for i in range(4)]
        times = [t for run in runs for t in run.result(timeout=300)]
    # A spawned worker's first request also pays for its imports and attach.
    assert max(times) <= _limit(serial, 4) + 5, (max(times), serial)
    _assert_idle(d)


def test_a_waiter_is_refused_only_once_nothing_in_the_pool_moves(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Leases held by hand and kept: nothing moves, so a waiter is refused after the
    daemon's --max-lease-wait, naming the fix; the refusal is logged and counted."""
    d = make_daemon(slabs=2, slab_size="8MiB", max_lease_wait=1)
    with d.client(client_name="holder") as holder, d.client(client_name="waiter") as waiter:
        held = [holder.lease(8 * 1024 * 1024) for _ in range(2)]
        t0 = time.monotonic()
        with pytest.raises(Exception, match="nothing in the pool moved") as err:
            waiter.encode(moving_pattern(8, H, W))
        assert 0.8 < time.monotonic() - t0 < 5
        assert "--slabs" in str(err.value)
        status = waiter.status()
        assert status.counters["lease_refusals"] == {"stall": 1}
        for lease in held:
            holder.release(lease)
    assert "lease refused (stall): client=waiter" in d.log()


def test_a_stream_left_for_a_refused_lease_is_logged_for_that(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Not as CANCELLED: the stream ended because its next chunk found no room."""
    d = make_daemon(slabs=2, slab_size="8MiB", max_lease_wait=1)
    chunk = moving_pattern(20, H, W)
    with d.client(client_name="holder") as holder, d.client() as c:
        with (
            pytest.raises(Exception, match="nothing in the pool moved"),
            c.stream(fps=24, request_id="left-for-room") as s,
        ):
            s.write(chunk)
            deadline = time.monotonic() + 10
            while c.status().pool["active_leases"]:  # its chunk encoded and freed
                assert time.monotonic() < deadline
                time.sleep(0.05)
            held = [holder.lease(8 * 1024 * 1024) for _ in range(2)]
            s.write(chunk)
        for lease in held:
            holder.release(lease)
    deadline = time.monotonic() + 5
    while "request_id=left-for-room status=" not in d.log():
        assert time.monotonic() < deadline, d.log()[-2000:]
        time.sleep(0.05)
    line = next(x for x in d.log().splitlines() if "request_id=left-for-room status=" in x)
    assert "status=RESOURCE_EXHAUSTED" in line and "lease wait ran out" in line, line


def test_status_shows_the_waiters_in_order(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """While the pool is held, waiters show in status (the API and the command line)."""
    from .test_cli import run

    d = make_daemon(slabs=2, slab_size="8MiB", max_lease_wait=3)
    with d.client(client_name="holder") as holder:
        held = [holder.lease(8 * 1024 * 1024) for _ in range(2)]
        refused: list[BaseException] = []

        def wait_for_room() -> None:
            with d.client(client_name="first") as first:
                try:
                    first.lease(4096)
                except ResourceExhausted as exc:  # nothing moves: refused after 3 s
                    refused.append(exc)

        waiting = threading.Thread(target=wait_for_room)
        waiting.start()
        with d.client() as c:
            deadline = time.monotonic() + 5
            while not (waiters := c.status().lease_waiters):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert waiters[0]["client"] == "first" and waiters[0]["bytes"] == 4096
            human = run(["status", "--socket", d.socket])
            assert "waiting  1. first: 4KiB in 1 region(s)" in human.stdout, human.stdout
        waiting.join(10)
        assert len(refused) == 1
        for lease in held:
            holder.release(lease)


def _left_for_room(d: Daemon, request_id: str) -> str:
    """The encode line the daemon logged for `request_id`."""
    deadline = time.monotonic() + 5
    while f"request_id={request_id} status=" not in d.log():
        assert time.monotonic() < deadline, d.log()[-2000:]
        time.sleep(0.05)
    return next(x for x in d.log().splitlines() if f"request_id={request_id} status=" in x)


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])
def test_streams_of_one_client_left_for_refused_leases_are_each_logged_for_that(  # type: ignore[no-untyped-def]
    make_daemon, framed: bool
) -> None:
    """Two streams of one client, both refused room for their next chunk ("stall"): each
    is logged RESOURCE_EXHAUSTED, neither CANCELLED, and the client is told the fix."""
    d = make_daemon(slabs=2, slab_size="8MiB", max_lease_wait=1, framed_socket=framed)
    chunk = moving_pattern(10, H, W)
    sent, held_now = threading.Barrier(3), threading.Event()
    refused: list[BaseException] = []

    def stream(c: SidecarClient, i: int) -> None:
        try:
            with c.stream(fps=24, request_id=f"left-{i}") as s:
                s.write(chunk)
                sent.wait(10)
                held_now.wait(10)
                s.write(chunk)
        except ResourceExhausted as exc:
            refused.append(exc)

    with d.client(client_name="holder") as holder, d.client() as c:
        threads = [threading.Thread(target=stream, args=(c, i)) for i in range(2)]
        for t in threads:
            t.start()
        sent.wait(10)
        deadline = time.monotonic() + 10
        while c.status().pool["active_leases"]:  # both first chunks encoded and freed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        held = [holder.lease(8 * 1024 * 1024) for _ in range(2)]
        held_now.set()
        for t in threads:
            t.join(30)
        for lease in held:
            holder.release(lease)
    assert len(refused) == 2, refused
    for i in range(2):
        line = _left_for_room(d, f"left-{i}")
        assert "status=RESOURCE_EXHAUSTED" in line and "lease wait ran out" in line, line
    for exc in refused:
        assert "nothing in the pool moved" in str(exc) and "--max-lease-wait" in str(exc), exc


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])
def test_a_wait_for_room_that_ran_out_names_its_fix(make_daemon, framed: bool) -> None:  # type: ignore[no-untyped-def]
    """A client's own lease_wait over ("wait"): the refusal says what to change."""
    d = make_daemon(slabs=2, slab_size="8MiB", max_lease_wait=30, framed_socket=framed)
    chunk = moving_pattern(10, H, W)
    with d.client(client_name="holder") as holder, d.client(lease_wait=0.5) as c:
        with (
            pytest.raises(ResourceExhausted, match="wait of") as err,
            c.stream(fps=24, request_id="waited") as s,
        ):
            s.write(chunk)
            deadline = time.monotonic() + 10
            while c.status().pool["active_leases"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            held = [holder.lease(8 * 1024 * 1024) for _ in range(2)]
            s.write(chunk)
        for lease in held:
            holder.release(lease)
    assert "lease_wait" in str(err.value) and "--slabs" in str(err.value), err.value
    line = _left_for_room(d, "waited")
    assert "status=RESOURCE_EXHAUSTED" in line and "lease wait ran out" in line, line
