"""A client that keeps calling never loses its leases to the TTL; a silent one does."""

from __future__ import annotations

import contextlib
import time

import grpc
import numpy as np
import pytest

from client import DeadlineExceeded, FailedPrecondition, Reason, ResourceExhausted
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc


def test_calls_renew_leases_and_silence_reclaims_them(make_daemon) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon(lease_ttl=1.5)
    with grpc.insecure_channel(f"unix:{d.socket}") as channel:
        s = pb_grpc.VideoSidecarStub(channel)
        busy = s.Attach(pb.AttachRequest(client_name="busy")).client_token
        quiet = s.Attach(pb.AttachRequest(client_name="quiet")).client_token
        held = s.Lease(pb.LeaseRequest(client_token=busy, size=4096))
        lost = s.Lease(pb.LeaseRequest(client_token=quiet, size=4096))
        deadline = time.monotonic() + 4.0  # well past the TTL
        while time.monotonic() < deadline:  # working: leasing and releasing other regions
            other = s.Lease(pb.LeaseRequest(client_token=busy, size=4096))
            s.Release(pb.ReleaseRequest(client_token=busy, lease_id=other.lease_id))
            time.sleep(0.3)
        s.Release(pb.ReleaseRequest(client_token=busy, lease_id=held.lease_id))
        with pytest.raises(grpc.RpcError) as err:
            s.Release(pb.ReleaseRequest(client_token=quiet, lease_id=lost.lease_id))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


# -- leases handed over in results --------------------------------------------------------


def test_a_client_sending_now_and_then_keeps_at_most_one_spare(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    """Requests further apart than half the TTL (a generation server's pace): the spare of
    each is too old to use. It goes back, and none piles up under the client's calls."""
    d = make_daemon(lease_ttl=2)
    clip = np.zeros((4, 64, 64, 3), np.uint8)
    with connect(d) as c, d.client() as watcher:
        held = []
        for _ in range(5):
            c.encode(clip)
            time.sleep(1.2)
            held.append(watcher.status().pool["active_leases"])
    assert max(held) <= 1, held  # 1, 2, 3, 4, 5 before: each renewed by the next call


def callback_that_breaks(*_: object) -> None:
    raise RuntimeError("a bug in the caller's progress bar")


@pytest.mark.parametrize("callback", ["on_progress", "on_chunk"])
def test_a_callback_that_raises_leaves_no_lease_behind(  # type: ignore[no-untyped-def]
    make_daemon, connect, callback: str
) -> None:
    d = make_daemon()
    clip = np.zeros((20, 256, 320, 3), np.uint8)
    with connect(d) as c, d.client() as watcher:
        for _ in range(6):  # more than the pool holds leases of this size
            with pytest.raises(RuntimeError, match="progress bar"):
                c.encode(clip, **{callback: callback_that_breaks})
            assert watcher.status().pool["active_leases"] == 0
        assert c.encode(clip).frames == 20


def test_release_after_the_daemon_restarted_is_not_an_error(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon()
    with connect(d) as c:
        lease = c.lease(4096)
        assert d.stop() == 0
        d.start()
        c.release(lease)  # it went with the daemon that granted it
        assert c.encode(np.zeros((2, 64, 64, 3), np.uint8)).frames == 2


def test_an_inline_client_cannot_lease(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon()
    with connect(d, transport="inline") as c, d.client() as watcher:
        with pytest.raises(FailedPrecondition, match="inline"):
            c.lease(4096)
        assert watcher.status().pool["active_leases"] == 0
        assert c.encode(np.zeros((2, 64, 64, 3), np.uint8)).frames == 2


def test_deadlines_that_fall_as_results_come_leave_no_lease_for_good(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    """A deadline at any point of an encode: a result already on its way may carry the
    next request's lease. The client gives back what it got; what it never read expires
    a TTL after it was granted, however busy the client stays."""
    d = make_daemon(lease_ttl=2)
    clip = np.zeros((20, 256, 320, 3), np.uint8)
    small = np.zeros((2, 64, 64, 3), np.uint8)
    with connect(d) as c, d.client() as watcher:
        for step in range(1, 17):
            with contextlib.suppress(DeadlineExceeded):
                c.encode(clip, timeout=0.02 * step)
        deadline = time.monotonic() + 3.0  # a TTL and then some, the client busy all along
        while time.monotonic() < deadline:
            c.encode(small)
            time.sleep(0.2)
        assert watcher.status().pool["active_leases"] <= 1  # at most the spare just granted


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])
def test_encodes_cancelled_at_any_moment_leave_no_lease_for_good(make_daemon, framed: bool) -> None:  # type: ignore[no-untyped-def]
    """asyncio cancels (`wait_for`) landing anywhere in an encode, the lease step too: a
    lease granted in a reply the client gave up on is freed when its connection ends (the
    framed socket), released by its request's tag (a Lease over gRPC), or expires a TTL
    after it was granted (a spare in a result lost over gRPC), and the client, still busy,
    holds no more than its spare."""
    import asyncio
    import random

    from client import AsyncSidecarClient

    d = make_daemon(framed_socket=framed, lease_ttl=2)
    video = np.zeros((30, 240, 320, 3), np.uint8)

    async def main() -> int:
        async with AsyncSidecarClient(d.socket) as c:
            await c.encode(video[:1])
            rng = random.Random(7)
            for _ in range(60):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(c.encode(video), rng.uniform(0, 0.004))
            # Busy past the TTL: every call would renew a lease it still held.
            busy_until = time.monotonic() + (0.5 if framed else 2.5)
            while time.monotonic() < busy_until:
                await c.encode(video[:2])
            return int((await c.status()).pool["active_leases"])

    assert asyncio.run(main()) <= 1


def test_a_call_waits_for_room_no_longer_than_its_timeout(make_daemon, connect) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon(max_lease_wait=20)
    with connect(d) as c, d.client() as hog:
        held = [hog.lease(16 * 1024 * 1024) for _ in range(4)]  # the whole pool
        t0 = time.monotonic()
        # The documented error, which says what to do: ResourceExhausted, POOL_EXHAUSTED.
        with pytest.raises(ResourceExhausted, match="timeout of 1 s passed while waiting") as e:
            c.encode(np.zeros((4, 64, 64, 3), np.uint8), timeout=1.0)
        assert e.value.reason is Reason.POOL_EXHAUSTED and "the wait of" in str(e.value)
        assert time.monotonic() - t0 < 5  # 20 s, the daemon's cap, before
        t0 = time.monotonic()
        with pytest.raises(ResourceExhausted) as e, c.stream(fps=24, timeout=1.0) as s:
            s.write(np.zeros((4, 64, 64, 3), np.uint8))
        assert e.value.reason is Reason.POOL_EXHAUSTED
        assert time.monotonic() - t0 < 5
        with connect(d, lease_wait=1.0) as brief, pytest.raises(ResourceExhausted):
            brief.encode(np.zeros((4, 64, 64, 3), np.uint8), timeout=30.0)  # its whole wait
        for lease in held:
            hog.release(lease)


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])
def test_leases_cancelled_at_any_moment_are_not_held_for_good(make_daemon, framed: bool) -> None:  # type: ignore[no-untyped-def]
    """`lease()` itself cancelled at random moments while the client keeps calling: a
    Lease whose reply was lost must not stay held under the client's other calls."""
    import asyncio
    import random

    from client import AsyncSidecarClient

    d = make_daemon(framed_socket=framed)

    async def main() -> tuple[int, int]:
        async with AsyncSidecarClient(d.socket) as c:
            await c.release(await c.lease(4096))
            rng = random.Random(11)
            got = 0
            for _ in range(120):
                try:
                    lease = await asyncio.wait_for(c.lease(4096), rng.uniform(0, 0.003))
                except asyncio.TimeoutError:
                    continue
                got += 1
                await c.release(lease)
            await c.release(await c.lease(4096))  # a call from the client: it is busy
            await asyncio.sleep(0.3)
            return got, int((await c.status()).pool["active_leases"])

    got, held = asyncio.run(main())
    assert held == 0, (got, held)


def test_a_lease_is_released_by_its_requests_tag(make_daemon) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon()
    with grpc.insecure_channel(f"unix:{d.socket}") as channel:
        s = pb_grpc.VideoSidecarStub(channel)
        token = s.Attach(pb.AttachRequest(client_name="tags")).client_token
        s.Lease(pb.LeaseRequest(client_token=token, size=4096, tag="first"))
        s.Release(pb.ReleaseRequest(client_token=token, tag="first"))
        s.Release(pb.ReleaseRequest(client_token=token, tag="never-sent"))  # OK: names none
        with pytest.raises(grpc.RpcError) as err:  # ... and the request, if it comes, fails
            s.Lease(pb.LeaseRequest(client_token=token, size=4096, tag="never-sent"))
        assert err.value.code() == grpc.StatusCode.CANCELLED
        held = s.Lease(pb.LeaseRequest(client_token=token, size=4096, tag="second"))
        for bad in (
            pb.ReleaseRequest(client_token=token, lease_id=held.lease_id, tag="second"),
            pb.ReleaseRequest(client_token=token, tag="not a tag"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                s.Release(bad)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "tag" in (err.value.details() or "")
        s.Release(pb.ReleaseRequest(client_token=token, lease_id=held.lease_id))
        assert s.Status(pb.StatusRequest()).pool.active_leases == 0


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])
def test_a_lease_cancelled_twice_is_not_held_for_good(make_daemon, framed: bool) -> None:  # type: ignore[no-untyped-def]
    """Cancelled again while it cleans up (anyio cancels at every await): the release that
    gives back what the call may have been granted still runs to its end."""
    import asyncio

    from client import AsyncSidecarClient

    d = make_daemon(framed_socket=framed)

    async def main() -> int:
        async with AsyncSidecarClient(d.socket) as c:
            await c.release(await c.lease(4096))
            for i in range(80):
                task = asyncio.create_task(c.lease(1 << 20, wait=1))
                await asyncio.sleep(0.0005 * (i % 8))
                task.cancel()
                await asyncio.sleep(0)  # the cleanup has started
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await c.release(await task)
            await c.release(await c.lease(4096))  # busy: its calls would renew a lost lease
            await asyncio.sleep(0.3)
            return int((await c.status()).pool["active_leases"])

    assert asyncio.run(main()) == 0


def test_results_given_up_on_free_their_leases_when_the_framed_connection_ends(  # type: ignore[no-untyped-def]
    make_daemon, connect
) -> None:
    """A deadline that falls as the result comes, on the framed socket: the spare and the
    output's lease in the reply nobody read are freed when the client closes that
    connection, not a TTL later (the default 30 s, during which they filled the pool)."""
    import random

    d = make_daemon()
    clip = np.random.default_rng(1).integers(0, 255, (16, 256, 448, 3), np.uint8)
    with connect(d) as c, d.client() as watcher:
        t0 = time.monotonic()
        for _ in range(3):
            c.encode(clip)
        median = (time.monotonic() - t0) / 3
        rng = random.Random(5)
        for _ in range(30):
            with contextlib.suppress(DeadlineExceeded):
                c.encode(clip, timeout=median * rng.uniform(0.5, 1.3))
        time.sleep(0.3)
        assert watcher.status().pool["active_leases"] <= 1  # the newest spare at most
