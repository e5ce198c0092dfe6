"""Where a reply, a refusal and a disconnect meet, no lease changes hands by accident.

Two promises, each under a wide window: many clients at once, refusals and disconnects
among valid work, against the real daemon.

- A refused request leaves every lease it named as it was: its client can still use it.
- A Lease waiting for room on a framed connection that its client closes is never left
  granted: the room goes back to the pool.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

from .conftest import running_daemon
from .helpers import Daemon, RawFramed, decode

W, H, N = 64, 48, 2  # a small video: 18 KiB of RGB
FRAMES = W * H * 3 * N
FPS = pb.Rational(num=24, den=1)


def _video(*ranges: pb.FrameRange, width: int = W) -> pb.VideoDescriptor:
    return pb.VideoDescriptor(
        width=width, height=H, pixel_format=pb.PIXEL_FORMAT_RGB24, fps=FPS, ranges=ranges
    )


def _range(lease_id: str, offset: int = 0, count: int = N) -> pb.FrameRange:
    return pb.FrameRange(lease_id=lease_id, offset=offset, frame_count=count)


class Worker:
    """One attached client on its own channel."""

    def __init__(self, socket: str, name: str) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.stub = pb_grpc.VideoSidecarStub(self.channel)
        self.token = self.stub.Attach(
            pb.AttachRequest(client_name=name, pid=os.getpid())
        ).client_token

    def lease(self, size: int = FRAMES) -> str:
        request = pb.LeaseRequest(client_token=self.token, size=size, wait_ms=20_000)
        return str(self.stub.Lease(request).lease_id)

    def encode(self, video: pb.VideoDescriptor, **fields: object) -> grpc.StatusCode | bytes:
        """The call's status code if refused, else the MP4 it returned."""
        request = pb.EncodeRequest(client_token=self.token, video=video, **fields)  # type: ignore[arg-type]
        try:
            data = b""
            for event in self.stub.Encode(request, timeout=60):
                if event.HasField("result"):
                    data = event.result.data or data
                elif event.HasField("chunk"):
                    data += event.chunk.data
            return data
        except grpc.RpcError as err:
            return err.code()

    def stream(self, *messages: pb.StreamRequest) -> grpc.StatusCode | None:
        try:
            for _ in self.stub.EncodeStream(iter(messages), timeout=60):
                pass
        except grpc.RpcError as err:
            return err.code()
        return None

    def header(self) -> pb.StreamRequest:
        return pb.StreamRequest(
            header=pb.StreamHeader(
                client_token=self.token,
                width=W,
                height=H,
                pixel_format=pb.PIXEL_FORMAT_RGB24,
                fps=FPS,
            )
        )


def _chunk(lease_id: str, offset: int = 0, count: int = N) -> pb.StreamRequest:
    return pb.StreamRequest(chunk=pb.StreamChunk(range=_range(lease_id, offset, count)))


def _refusals(
    w: Worker, other: Worker, kept: str, busy: str, spent: str
) -> list[Callable[[], object]]:
    """Requests that name `kept` (a valid lease of `w`) and must each be refused. `spent`
    is the lease of a stream's first chunk, which that stream takes."""
    gone = "0" * 32
    return [
        lambda: w.encode(_video(_range(kept), _range(gone))),  # a valid lease, then an unknown
        lambda: w.encode(_video(_range(kept), _range(kept, offset=FRAMES))),  # outside it
        lambda: w.encode(_video(_range(kept), _range(busy))),  # then one in another encode
        lambda: w.encode(_video(_range(kept), width=W + 1)),  # odd width
        lambda: w.encode(
            _video(_range(kept)), output=pb.OutputSpec(file=pb.FileOutput(path="../x.mp4"))
        ),
        lambda: w.encode(_video(_range(kept)), codec=pb.CodecOptions(preset="ludicrous")),
        lambda: other.encode(_video(_range(kept))),  # not its lease
        lambda: w.stream(w.header(), _chunk(kept, offset=FRAMES)),  # a chunk outside it
        lambda: w.stream(w.header(), _chunk(spent), _chunk(kept)),  # over the frame limit
        lambda: w.stream(w.header(), _chunk(busy)),  # a chunk in another encode
    ]


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    # A stream of two chunks of N frames is over the limit.
    limits = {"max_frames": 2 * N - 1, "max_concurrent_encodes": 2}
    with running_daemon(slabs=2, slab_size="4MiB", **limits) as d:
        yield d


def _pool(socket: str) -> pb.PoolStatus:
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        return pb_grpc.VideoSidecarStub(channel).Status(pb.StatusRequest()).pool


def test_a_refused_request_leaves_every_lease_it_named(daemon: Daemon) -> None:
    clients = 8
    rounds = 6
    failures: list[str] = []

    def worker(index: int) -> None:
        w = Worker(daemon.socket, f"racer-{index}")
        other = Worker(daemon.socket, f"thief-{index}")
        for _ in range(rounds):
            kept, busy, spent = w.lease(), w.lease(), w.lease()
            # `busy` goes into a real encode while the refusals race it.
            with ThreadPoolExecutor(4) as pool:
                valid = pool.submit(w.encode, _video(_range(busy)))
                outcomes = list(
                    pool.map(lambda call: call(), _refusals(w, other, kept, busy, spent))
                )
                made = valid.result()
            for outcome in outcomes:
                if not isinstance(outcome, grpc.StatusCode) or outcome == grpc.StatusCode.OK:
                    failures.append(f"a request that had to be refused was not: {outcome!r}")
            assert isinstance(made, bytes) and len(decode(made)[0]) == N
            # Every refusal left `kept` as it was: its client encodes from it still.
            again = w.encode(_video(_range(kept)))
            if not isinstance(again, bytes):
                failures.append(f"the valid lease was gone after its refusals: {again}")
        w.channel.close()
        other.channel.close()

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, range(clients)))
    assert failures == [], failures[:5]
    pool_status = _pool(daemon.socket)
    assert (pool_status.active_leases, pool_status.leased_bytes) == (0, 0)


def test_a_lease_left_waiting_for_room_goes_back_to_the_pool(daemon: Daemon) -> None:
    """The pool is filled; framed clients ask for room and close at once, some right
    before room comes; then the room is freed. Nothing they asked for stays granted."""
    holder = Worker(daemon.socket, "holder")
    status = holder.stub.Status(pb.StatusRequest())
    slab = status.pool.slab_size
    held = [holder.lease(slab), holder.lease(slab)]  # the whole pool
    framed_path = f"{daemon.socket}.framed"
    errors: list[BaseException] = []

    def ask_and_leave(index: int, leave_after: float) -> None:
        try:
            leave(index, leave_after)
        except BaseException as exc:
            errors.append(exc)

    def leave(index: int, leave_after: float) -> None:
        conn = RawFramed(framed_path)
        token = holder.stub.Attach(pb.AttachRequest(client_name=f"leaver-{index}")).client_token
        request = pb.LeaseRequest(client_token=token, size=128 * 1024, wait_ms=10_000)
        conn.send(pb.FramedRequest(lease=request).SerializeToString())
        time.sleep(leave_after)
        conn.close()

    for round_ in range(3):
        # Half leave before the room comes, half just as it does.
        leavers = [
            threading.Thread(target=ask_and_leave, args=(i, 0.05 if i % 2 else 0.3))
            for i in range(12)
        ]
        for t in leavers:
            t.start()
        time.sleep(0.3)
        for lease_id in held:
            holder.stub.Release(pb.ReleaseRequest(client_token=holder.token, lease_id=lease_id))
        for t in leavers:
            t.join()
        assert errors == []
        deadline = time.monotonic() + 3
        while _pool(daemon.socket).active_leases and time.monotonic() < deadline:
            time.sleep(0.05)
        pool_status = _pool(daemon.socket)
        assert (pool_status.active_leases, pool_status.leased_bytes) == (0, 0), round_
        held = [holder.lease(slab), holder.lease(slab)]
    for lease_id in held:
        holder.stub.Release(pb.ReleaseRequest(client_token=holder.token, lease_id=lease_id))
    holder.channel.close()
