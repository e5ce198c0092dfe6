"""Steady traffic never waits for an encoder open: back to back and concurrent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from fractions import Fraction
from types import SimpleNamespace
from typing import Any, cast

import pytest

from client.patterns import moving_pattern
from sidecar.codec.frames import PIXEL_FORMATS, Geometry
from sidecar.pipeline.encoding.warm import EncoderKey, WarmEncoder, WarmPool


@pytest.mark.exclusive
def test_back_to_back_requests_find_a_ready_encoder(make_daemon) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon(warm_encoders=4)
    clip = moving_pattern(4, 128, 96)
    with d.client() as c:
        outputs = [c.encode(clip).data for _ in range(10)]  # no pause between them
        counters = c.status().counters
    assert len(set(outputs)) == 1  # a ready encoder changes nothing but time
    # The first opens cold; each one taken starts the next opening while it encodes.
    assert counters["warm_misses"] <= 2, counters
    assert counters["warm_hits"] >= 8, counters


def test_open_ms_is_what_the_request_spent_getting_its_encoder(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """A ready encoder costs the request nothing, and its own open is reported as
    `open_ms`; a wait for one still opening is counted there too (ways.ReadyEncoder),
    so the stages never add up to more than the daemon's own time."""
    clip = moving_pattern(1, 768, 1344)
    ready = make_daemon(warm_encoders=2, encoder_processes=0)
    cold = make_daemon(warm_encoders=0, encoder_processes=0)
    with ready.client() as c:
        spaced = []
        for _ in range(4):
            time.sleep(0.3)  # time enough for the next one to open
            spaced.append(c.encode(clip).timings.open_ms)
        back_to_back = [c.encode(clip).timings for _ in range(10)]
    with cold.client() as c:
        own = [c.encode(clip).timings.open_ms for _ in range(3)]
    assert min(spaced[1:]) < 0.5, spaced
    assert min(own) > 0.5, own  # x264 and the container, opened in the request
    for t in back_to_back:  # stages and waits, all inside the daemon's own time
        stages = t.open_ms + t.convert_ms + t.encode_ms + t.mux_ms + t.finalize_ms
        assert stages <= t.daemon_ms + 0.01, t


def test_concurrent_clients_each_find_one(make_daemon) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon(warm_encoders=8, max_concurrent_encodes=4)
    clip = moving_pattern(4, 128, 96)
    errors: list[BaseException] = []
    go = threading.Barrier(4)

    def work() -> None:
        try:
            with d.client() as c:
                go.wait()
                for _ in range(8):
                    assert c.encode(clip).frames == 4
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with d.client() as c:
        counters = c.status().counters
    total = counters["warm_hits"] + counters["warm_misses"]
    assert total == 32
    # Misses only while the pool learns the concurrency (a few per client at most).
    assert counters["warm_misses"] <= 12, counters


class FakeWarm:
    """Stands in for an open encoder: the pool only queues and discards them."""

    def __init__(self, threads: int) -> None:
        self.threads, self.ready_at, self.discarded = threads, time.monotonic(), False

    def discard(self) -> None:
        self.discarded = True


def key(width: int) -> EncoderKey:
    geometry = Geometry(width, 64, PIXEL_FORMATS["rgb24"], Fraction(24))
    return EncoderKey(geometry, "libx264", (), None, "SLICE", 0)


def settle(pool: WarmPool, opened: list[FakeWarm], count: int) -> None:
    """Wait until `count` encoders were opened and handed to the pool."""
    deadline = time.monotonic() + 10
    while len(opened) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # the pool files each one right after its opener returns


def recording_opener(opened: list[FakeWarm]) -> Callable[[int], WarmEncoder]:
    """An opener that records each encoder it opens, with a share of 16 threads."""

    def opener(concurrency: int) -> WarmEncoder:
        opened.append(FakeWarm(16 // concurrency))
        return cast(WarmEncoder, opened[-1])

    return opener


def test_ready_encoders_follow_concurrency_within_capacity() -> None:
    pool = WarmPool(capacity=3)
    pool.start()
    gate = threading.Event()
    opened: list[FakeWarm] = []

    def opener(concurrency: int) -> WarmEncoder:
        gate.wait(10)
        opened.append(FakeWarm(16 // concurrency))
        return cast(WarmEncoder, opened[-1])

    a = key(64)
    try:
        assert pool.checkout(a, opener) is None  # cold: a miss; the next one waits for later
        assert pool.checkout(a, opener) is None  # two at once: the pool wants two ready
        gate.set()
        settle(pool, opened, 2)
        assert [w.threads for w in opened] == [8, 8]  # both opened for the 2 at once
        pool.checkin(a)
        pool.checkin(a)
        assert pool.checkout(a, opener) is opened[0]  # a hit, and one more starts opening
        pool.checkin(a)
        settle(pool, opened, 3)
        for width in (128, 160, 192, 224):  # more settings than room for them
            pool.checkout(key(width), opener)
            pool.checkin(key(width))
        settle(pool, opened, 7)
        ready = [w for w in opened[1:] if not w.discarded]
        assert len(ready) <= 3, len(ready)  # never more than the capacity
        assert (pool.hits, pool.misses) == (1, 6)
    finally:
        gate.set()
        pool.close()
    assert all(w.discarded for w in opened[1:])  # closing discards every ready one


def test_spaced_traffic_opens_after_the_answer() -> None:
    """A lone request leaves the next opening until it is answered; one that finds the
    opening still under way makes the pool open at once from then on."""
    pool = WarmPool(capacity=2)
    pool.start()
    opened: list[FakeWarm] = []
    opener = recording_opener(opened)

    a = key(64)
    try:
        assert pool.checkout(a, opener) is None
        time.sleep(0.1)
        assert opened == []  # nothing opens while the request runs
        pool.checkin(a)
        pool.answered(a)
        settle(pool, opened, 1)
        time.sleep(0.1)  # spaced out
        assert pool.checkout(a, opener) is opened[0]  # ready, and it waited: still spaced
        time.sleep(0.1)
        assert len(opened) == 1  # the next one waits for the answer again
        pool.checkin(a)
        pool.answered(a)
        settle(pool, opened, 2)
    finally:
        pool.close()


def test_a_new_setting_takes_the_room_of_the_oldest() -> None:
    """A full pool makes room for a new shape: the oldest ready encoder of another
    setting goes, so a server that moves to a new shape is not left opening cold."""
    pool = WarmPool(capacity=2)
    pool.start()
    opened: list[FakeWarm] = []
    opener = recording_opener(opened)

    try:
        for width in (64, 96):  # two settings fill the pool
            pool.checkout(key(width), opener)
            pool.checkin(key(width))
            pool.answered(key(width))
            settle(pool, opened, len(opened) + 1)
        assert [w.discarded for w in opened] == [False, False]
        new = key(128)
        for _ in range(3):  # back to back on a third setting
            pool.checkout(new, opener)
            pool.checkin(new)
            pool.answered(new)
            settle(pool, opened, len(opened) + 1)
        assert opened[0].discarded  # the oldest made room
        assert pool.checkout(new, opener) is not None  # and the new shape finds one ready
        pool.checkin(new)
    finally:
        pool.close()


def test_back_to_back_opens_as_the_encode_ends_and_the_next_waits_for_it() -> None:
    """One client back to back: the next encoder opens when this encode ends (not during
    it), and a request that finds it still opening waits for it instead of opening its
    own."""
    pool = WarmPool(capacity=2)
    pool.start()
    gate = threading.Event()
    calls: list[float] = []
    opened: list[FakeWarm] = []

    def opener(concurrency: int) -> WarmEncoder:
        calls.append(time.monotonic())
        gate.wait(10)
        opened.append(FakeWarm(16))
        return cast(WarmEncoder, opened[-1])

    a = key(64)
    try:
        assert pool.checkout(a, opener) is None
        pool.checkin(a)
        assert pool.checkout(a, opener) is None  # right after the last one ended: steady
        time.sleep(0.05)
        assert calls == []  # nothing opens while this request encodes
        pool.checkin(a)  # its encode ended: the next one starts opening now
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(calls) == 1
        threading.Timer(0.02, gate.set).start()
        t0 = time.monotonic()
        warm = pool.checkout(a, opener)  # finds it opening: waits for it
        assert warm is not None and warm is opened[0]
        assert time.monotonic() - t0 >= 0.015
        pool.checkin(a)
        assert (pool.hits, pool.misses) == (1, 2)
    finally:
        gate.set()
        pool.close()


def test_a_kept_converter_is_primed_once_and_changes_no_byte(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An encoder process hands the colour converter of one encoder to the next of the
    same settings: the next opens without setting swscale up again, and encodes the
    same bytes as an encoder with a converter of its own."""
    import os

    from sidecar.codec.catalogue import CodecSpec
    from sidecar.codec.colour import FrameConverter
    from sidecar.pipeline.encoding.warm import open_in_memory
    from sidecar.pipeline.processes.main import Worker
    from sidecar.pipeline.processes.ready import KEPT_CONVERTERS

    geometry = Geometry(96, 64, PIXEL_FORMATS["rgb24"], Fraction(24))
    codec = CodecSpec().resolve("mp4")
    image = moving_pattern(1, 64, 96, noise=4.0)[0]

    def encoded(converter: FrameConverter | None) -> bytes:
        warm = open_in_memory(geometry, codec, 2, "SLICE", converter, prime=True)
        try:
            warm.encoder.encode(image)
            warm.encoder.close()
            return os.pread(warm.memfd, os.fstat(warm.memfd).st_size, 0)
        finally:
            warm.discard()

    kept = FrameConverter(geometry, 2)
    assert not kept.primed
    first = encoded(kept)
    assert kept.primed
    converted = 0
    frame = FrameConverter.frame

    def counting(self: FrameConverter, img):  # type: ignore[no-untyped-def]
        nonlocal converted
        converted += 1
        return frame(self, img)

    monkeypatch.setattr(FrameConverter, "frame", counting)
    assert encoded(kept) == first
    assert converted == 1  # the frame itself: no blank one to prime
    assert encoded(None) == first

    worker = Worker(cast(Any, None), [])
    jobs = [
        SimpleNamespace(geometry=Geometry(96, 64 + 2 * n, geometry.layout, geometry.fps), threads=2)
        for n in range(KEPT_CONVERTERS + 1)
    ]
    made = [worker.ready.converter(cast(Any, job)) for job in jobs]
    assert worker.ready.converter(cast(Any, jobs[-1])) is made[-1]
    assert len(worker.ready.converters) == KEPT_CONVERTERS  # the oldest settings' went
    assert worker.ready.converter(cast(Any, jobs[0])) is not made[0]
