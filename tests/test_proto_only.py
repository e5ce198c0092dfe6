"""A worker written from the proto alone, in any language, needs nothing of ours: the
generated messages, a gRPC channel, and the slabs mapped as Attach names them. This is
that worker in Python, against the real daemon: Attach, Lease, frames written into the
mapped slab, Encode by lease (the output inside the result, or in a lease of its own);
and EncodeStream with the frames inline."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

from .helpers import Daemon, decode

FPS = pb.Rational(num=24, den=1)


@pytest.fixture(scope="module")
def stub(daemon: Daemon) -> Iterator[pb_grpc.VideoSidecarStub]:
    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        yield pb_grpc.VideoSidecarStub(channel)


@pytest.fixture(scope="module")
def attached(stub: pb_grpc.VideoSidecarStub) -> Iterator[tuple[pb.AttachResponse, list[mmap.mmap]]]:
    """Attach, and map every slab once, as a worker does."""
    att = stub.Attach(pb.AttachRequest(client_name="proto-only", pid=os.getpid()))
    maps = []
    for slab in att.slabs:
        fd = os.open(Path(att.shm_dir) / slab.shm_name, os.O_RDWR)
        try:
            maps.append(mmap.mmap(fd, slab.size))
        finally:
            os.close(fd)
    yield att, maps
    for m in maps:
        m.close()


def video(width: int, height: int, count: int, seed: int = 0) -> np.ndarray:
    """Moving blocks: a video the encoder must work at, its frames told apart."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    base = base.repeat(8, axis=0).repeat(8, axis=1)
    return np.stack([np.roll(base, 4 * i, axis=1) for i in range(count)])


def encode_by_lease(
    stub: pb_grpc.VideoSidecarStub,
    att: pb.AttachResponse,
    maps: list[mmap.mmap],
    frames: np.ndarray,
) -> tuple[pb.EncodeResult, bytes]:
    """The whole exchange: lease, write, encode, collect the output however it came."""
    count, height, width, _ = frames.shape
    lease = stub.Lease(
        pb.LeaseRequest(client_token=att.client_token, size=frames.nbytes, wait_ms=10_000)
    )
    maps[lease.slab_id][lease.offset : lease.offset + frames.nbytes] = frames.tobytes()
    request = pb.EncodeRequest(
        client_token=att.client_token,
        video=pb.VideoDescriptor(
            width=width,
            height=height,
            pixel_format=pb.PIXEL_FORMAT_RGB24,
            fps=FPS,
            ranges=[pb.FrameRange(lease_id=lease.lease_id, offset=0, frame_count=count)],
        ),
    )
    chunks, result = [], None
    for event in stub.Encode(request, timeout=120):
        if event.HasField("chunk"):
            chunks.append(event.chunk.data)
        elif event.HasField("result"):
            result = event.result
    assert result is not None
    if result.HasField("data_lease"):  # the output is ours in this lease: copy, release
        out = result.data_lease
        data = bytes(maps[out.slab_id][out.offset : out.offset + result.size_bytes])
        stub.Release(pb.ReleaseRequest(client_token=att.client_token, lease_id=out.lease_id))
        return result, data
    return result, result.data or b"".join(chunks)


def test_encode_by_lease_small_output_in_the_result(stub, attached) -> None:
    att, maps = attached
    frames = video(128, 96, 12)
    result, data = encode_by_lease(stub, att, maps, frames)
    assert result.data and not result.HasField("data_lease")
    got, facts = decode(data)
    assert (len(got), facts["width"], facts["height"]) == (12, 128, 96)
    assert np.abs(got.astype(int) - frames).mean() < 12


def test_encode_by_lease_large_output_in_a_lease(stub, attached, daemon: Daemon) -> None:
    att, maps = attached
    frames = np.random.default_rng(1).integers(0, 256, (16, 480, 640, 3), dtype=np.uint8)
    result, data = encode_by_lease(stub, att, maps, frames)
    assert result.HasField("data_lease") and len(data) == result.size_bytes > 1024 * 1024
    got, _ = decode(data)
    assert len(got) == 16
    assert stub.Status(pb.StatusRequest()).pool.active_leases == 0  # all given back


def test_encode_stream_inline(stub, attached) -> None:
    att, _ = attached
    frames = video(160, 112, 10, seed=2)
    header = pb.StreamHeader(
        client_token=att.client_token,
        width=160,
        height=112,
        pixel_format=pb.PIXEL_FORMAT_RGB24,
        fps=FPS,
    )
    messages = [pb.StreamRequest(header=header)]
    for start in range(0, len(frames), 4):
        chunk = pb.StreamChunk(inline=frames[start : start + 4].tobytes())
        messages.append(pb.StreamRequest(chunk=chunk))
    messages.append(pb.StreamRequest(end=pb.StreamEnd()))
    chunks, result = [], None
    for event in stub.EncodeStream(iter(messages), timeout=120):
        if event.HasField("chunk"):
            chunks.append(event.chunk.data)
        elif event.HasField("result"):
            result = event.result
    assert result is not None and result.frames == 10
    got, facts = decode(result.data or b"".join(chunks))
    assert (len(got), facts["width"], facts["height"]) == (10, 160, 112)
    assert np.abs(got.astype(int) - frames).mean() < 12
