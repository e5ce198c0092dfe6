"""Bad input gets the right status, loses nothing, and the daemon keeps serving."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from client import (
    AlreadyExists,
    FailedPrecondition,
    FrameRange,
    InvalidArgument,
    InvalidVideo,
    Lease,
    NotFound,
    OutOfRange,
    Reason,
    RequestError,
    ResourceExhausted,
    SidecarError,
)
from client.patterns import moving_pattern
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

from .helpers import Daemon, decode, psnr

W, H = 64, 48
FRAME = W * H * 3


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    return moving_pattern(4, H, W)


@pytest.fixture
def lease(client: Any, frames: np.ndarray) -> Iterator[Lease]:
    """A lease holding 4 good rgb24 frames."""
    lease = client.lease(frames.nbytes)
    lease.array[: frames.nbytes] = frames.reshape(-1)
    yield lease
    client.release(lease)


def encode(client: Any, ranges: list[FrameRange], **kw: object) -> object:
    opts: dict[str, object] = {"width": W, "height": H, "pixel_format": "rgb24"}
    opts.update(kw)
    return client.encode_leased(ranges, **opts)


def wire(daemon: Daemon) -> Iterator[Any]:
    """A bare stub on the daemon, for what the client never sends."""
    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        yield pb_grpc.VideoSidecarStub(channel)


def assert_refused(err: SidecarError, code: grpc.StatusCode, reason: Reason | None) -> None:
    assert err.code is code and err.reason is reason, (err.code, err.reason)


def assert_still_serving(client: Any, lease: Lease, frames: np.ndarray) -> None:
    """The rejected request lost nothing: the same lease still encodes correctly."""
    result = client.encode_leased([FrameRange(lease.id, frame_count=4)], width=W, height=H)
    decoded, _ = decode(result.data or b"")
    assert psnr(decoded, frames) >= 40


BAD_DESCRIPTORS = {
    "frame count past the lease": ({"frame_count": 5}, {}, "frame_count"),
    "offset past the lease": ({"frame_count": 4, "offset": 4096}, {}, "frame_count"),
    "negative offset": ({"frame_count": 1, "offset": -1}, {}, "offset"),
    "negative frame count": ({"frame_count": -3}, {}, "frame_count"),
    "zero frames": ({"frame_count": 0}, {}, "frame_count"),
    "row stride too small": ({"frame_count": 1, "row_stride": W * 3 - 1}, {}, "row_stride"),
    "frame stride overlaps": ({"frame_count": 2, "frame_stride": FRAME - 1}, {}, "frame_stride"),
    "huge stride": ({"frame_count": 2, "frame_stride": 2**62}, {}, "frame_stride"),
    "shape wider than the data": ({"frame_count": 4}, {"width": W * 2}, "frame_count"),
    "odd width for yuv420p": (
        {"frame_count": 1},
        {"width": W - 1, "pixel_format": "yuv420p"},
        "width",
    ),
    "odd height": ({"frame_count": 1}, {"height": H - 1}, "height"),
    "zero width": ({"frame_count": 1}, {"width": 0}, "width"),
    "bad fps": ({"frame_count": 1}, {"fps": (0, 1)}, "fps"),
    "unknown codec": ({"frame_count": 1}, {"codec": "mpeg1"}, "codec"),
    "bad preset": ({"frame_count": 1}, {"preset": "warp-speed"}, "codec"),
    "crf out of range": ({"frame_count": 1}, {"crf": 99}, "crf"),
    "escaping path": ({"frame_count": 1}, {"path": "../x.mp4"}, "path"),
    "absolute path": ({"frame_count": 1}, {"path": "/tmp/x.mp4"}, "path"),
    "empty-named path": ({"frame_count": 1}, {"path": "dir/"}, "path"),
}


@pytest.mark.parametrize("name", BAD_DESCRIPTORS)
def test_bad_descriptor(client: Any, lease: Lease, frames: np.ndarray, name: str) -> None:
    range_fields, request_fields, field = BAD_DESCRIPTORS[name]
    with pytest.raises(InvalidArgument, match=field) as info:
        encode(client, [FrameRange(lease, **range_fields)], **request_fields)
    assert_refused(info.value, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_REQUEST)
    assert_still_serving(client, lease, frames)


def test_unknown_pixel_format_enum(
    daemon: Daemon, client: Any, lease: Lease, frames: np.ndarray
) -> None:
    request = pb.EncodeRequest(
        client_token=client.attach().client_token,
        video=pb.VideoDescriptor(
            width=W,
            height=H,
            pixel_format=99,  # type: ignore[arg-type]
            fps=pb.Rational(num=24, den=1),
            ranges=[pb.FrameRange(lease_id=lease.id, frame_count=1)],
        ),
    )
    for stub in wire(daemon):
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Encode(request))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "pixel_format" in (info.value.details() or "")
    assert_still_serving(client, lease, frames)


def test_unknown_lease(client: Any, lease: Lease, frames: np.ndarray) -> None:
    with pytest.raises(NotFound) as info:
        encode(client, [FrameRange("0" * 32, frame_count=1)])
    assert_refused(info.value, grpc.StatusCode.NOT_FOUND, Reason.LEASE_NOT_FOUND)
    with pytest.raises(NotFound):
        encode(client, [FrameRange("not-even-hex", frame_count=1)])
    assert_still_serving(client, lease, frames)


def test_one_bad_range_takes_no_lease(client: Any, lease: Lease, frames: np.ndarray) -> None:
    good = FrameRange(lease.id, frame_count=4)
    with pytest.raises(NotFound):
        encode(client, [good, FrameRange("f" * 32, frame_count=1)])
    assert_still_serving(client, lease, frames)


def test_consumed_lease_is_gone(client: Any, frames: np.ndarray) -> None:
    lease = client.lease(frames.nbytes)
    lease.array[: frames.nbytes] = frames.reshape(-1)
    encode(client, [FrameRange(lease.id, frame_count=4)])
    with pytest.raises(NotFound):
        encode(client, [FrameRange(lease.id, frame_count=4)])
    client.release(lease)  # already freed: not an error


def test_lease_of_another_client_is_invisible(
    daemon: Daemon, connect, client: Any, lease: Lease, frames: np.ndarray
) -> None:
    with connect(daemon) as other:
        with pytest.raises(NotFound):
            other.encode_leased([FrameRange(lease.id, frame_count=4)], width=W, height=H)
        other.release(lease)  # not an error to the client, and it frees nothing
        token = other.attach().client_token
    for stub in wire(daemon):  # what the daemon answered, under the client's silence
        with pytest.raises(grpc.RpcError) as info:
            stub.Release(pb.ReleaseRequest(client_token=token, lease_id=lease.id))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert_still_serving(client, lease, frames)


def test_unknown_token_is_reattached(client: Any, frames: np.ndarray) -> None:
    """A stale token (as after a daemon restart) is replaced transparently."""
    client.attach()
    # The client's state, not its API: the only way to a stale token without restarting
    # the daemon (tests/test_faults.py restarts it for real).
    core = client._core
    stale = core.attachment
    core.attachment = type(stale)(**{**stale.__dict__, "client_token": "f" * 32})
    result = client.encode(frames)
    assert result.frames == 4
    assert client.attach().client_token != "f" * 32


def test_existing_output_is_kept(client: Any, twin: str, frames: np.ndarray) -> None:
    first = client.encode(frames, path=f"keep/{twin}.mp4")
    with pytest.raises(AlreadyExists) as info:
        client.encode(frames[:2], path=f"keep/{twin}.mp4")
    assert_refused(info.value, grpc.StatusCode.ALREADY_EXISTS, Reason.OUTPUT_EXISTS)
    assert os.path.getsize(first.path or "") == first.size_bytes
    replaced = client.encode(frames[:2], path=f"keep/{twin}.mp4", overwrite=True)
    assert replaced.frames == 2


def test_a_file_in_the_way_of_the_output_is_an_output_error(
    client: Any, twin: str, daemon: Daemon, frames: np.ndarray
) -> None:
    """The output root's own state (a file where a directory should be, a directory where
    the file should be): FAILED_PRECONDITION / OUTPUT_ERROR, as an unwritable one is."""
    daemon.output_dir.mkdir(exist_ok=True)
    daemon.output_dir.joinpath(f"job-{twin}.mp4").write_bytes(b"keep")
    daemon.output_dir.joinpath(f"dir-{twin}").mkdir()
    for path in (f"job-{twin}.mp4/x.mp4", f"dir-{twin}"):
        with pytest.raises(FailedPrecondition, match="directory") as info:
            client.encode(frames, path=path, overwrite=True)
        assert_refused(info.value, grpc.StatusCode.FAILED_PRECONDITION, Reason.OUTPUT_ERROR)
    assert daemon.output_dir.joinpath(f"job-{twin}.mp4").read_bytes() == b"keep"
    assert client.encode(frames).frames == len(frames)


def test_symlink_escape(
    client: Any, twin: str, daemon: Daemon, frames: np.ndarray, tmp_path
) -> None:
    daemon.output_dir.joinpath(f"link-{twin}").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(InvalidArgument, match="link") as info:
        client.encode(frames, path=f"link-{twin}/x.mp4")
    assert info.value.reason is Reason.INVALID_REQUEST
    assert list(tmp_path.iterdir()) == []


def test_lease_larger_than_a_slab(client: Any) -> None:
    with pytest.raises(OutOfRange) as info:
        client.lease(16 * 1024 * 1024 + 1)
    assert_refused(info.value, grpc.StatusCode.OUT_OF_RANGE, Reason.OUT_OF_RANGE)


def test_pool_exhausted_after_bounded_wait(client: Any) -> None:
    held = [client.lease(16 * 1024 * 1024) for _ in range(4)]
    try:
        with pytest.raises(ResourceExhausted, match="no room") as info:
            client.lease(4096, wait=0.3)
        assert_refused(info.value, grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.POOL_EXHAUSTED)
    finally:
        for lease in held:
            client.release(lease)
    client.release(client.lease(4096, wait=0))


def test_client_side_checks(client: Any) -> None:
    with pytest.raises(InvalidVideo, match="dtype"):
        client.encode(np.zeros((2, H, W, 3), np.int32))
    with pytest.raises(InvalidVideo, match="shape"):
        client.encode(np.zeros((2, H, W), np.uint8))
    with pytest.raises(InvalidVideo, match="layout"):
        client.encode(np.zeros((3, 3, H, 3), np.uint8))
    with pytest.raises(InvalidVideo, match="batch"):
        client.encode(np.zeros((2, 3, 4, H, W), np.uint8))
    with pytest.raises(InvalidVideo, match="value_range"):
        client.encode(np.zeros((2, H, W, 3), np.float32), value_range=(0, 255))
    with pytest.raises(InvalidVideo, match="even"):
        client.encode(np.zeros((2, H, W - 1, 3), np.uint8), pixel_format="yuv420p")
    with pytest.raises(InvalidVideo, match="pixel_format"):
        client.encode(np.zeros((2, H, W, 3), np.uint8), pixel_format="yuv444p")
    with pytest.raises(InvalidVideo) as info:
        client.encode([[1, 2, 3]])
    # Raised in the client: no reason from the daemon.
    assert_refused(info.value, grpc.StatusCode.INVALID_ARGUMENT, None)
    with pytest.raises(InvalidArgument, match="container") as info:
        client.encode(np.zeros((2, H, W, 3), np.uint8), container="avi")
    assert type(info.value) is InvalidArgument and info.value.reason is None


def test_unknown_keywords_name_the_method(client: Any, twin: str) -> None:
    name = {"sync": "SidecarClient", "async": "AsyncSidecarClient"}[twin]
    video = np.zeros((2, H, W, 3), np.uint8)
    with pytest.raises(TypeError, match=rf"^{name}\.encode\(\) got an unexpected .* 'crff'"):
        client.encode(video, crff=20)
    with pytest.raises(TypeError, match=rf"^{name}\.stream\(\) got an unexpected"):
        client.stream(fps=24, bitrat=5)
    with pytest.raises(TypeError, match=rf"^{name}\.encode_leased\(\) got an unexpected"):
        client.encode_leased([], width=W, height=H, preset_="fast")


def test_errors_are_counted(client: Any, lease: Lease) -> None:
    """Each refusal is counted under its status code, whatever else the module's daemon
    served (this test sends its own; under xdist the module's tests run on several)."""
    before = client.status().counters["errors"]
    for range_fields, request_fields, field in BAD_DESCRIPTORS.values():
        with pytest.raises(InvalidArgument, match=field):
            encode(client, [FrameRange(lease, **range_fields)], **request_fields)
    for unknown in ("0" * 32, "not-even-hex"):
        with pytest.raises(NotFound):
            encode(client, [FrameRange(unknown, frame_count=1)])
    after = client.status().counters["errors"]
    added = {code: after.get(code, 0) - before.get(code, 0) for code in after}
    assert added.get("INVALID_ARGUMENT") == len(BAD_DESCRIPTORS)
    assert added.get("NOT_FOUND") == 2


def test_request_errors_share_a_base() -> None:
    for cls in (InvalidArgument, NotFound, OutOfRange, ResourceExhausted, AlreadyExists):
        assert issubclass(cls, RequestError)


PRINTABLE_NOT = ["a\x1b[31mred.mp4", "two\nlines.mp4", "tab\there.mp4", "z\u200bw.mp4"]


@pytest.mark.parametrize("name", PRINTABLE_NOT, ids=["escape", "newline", "tab", "zero-width"])
def test_output_paths_are_printable(client: Any, twin: str, name: str, frames: np.ndarray) -> None:
    with pytest.raises(InvalidArgument, match="printable") as info:
        client.encode(frames, path=name)
    assert info.value.reason is Reason.INVALID_REQUEST
    fine = client.encode(frames, path=f"écrit/ビデオ-{twin}.mp4", overwrite=True)
    assert fine.frames == len(frames)


def test_every_encode_request_is_counted_refused_ones_too(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """`requests` in the status counts each encode request the daemon received, as
    `video_sidecar_requests_total` does: those refused before any check of their video
    (an undecodable message, a bad request id, a stream without a header) as well."""
    import grpc

    from sidecar.api.v1 import sidecar_pb2 as pb
    from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

    d = make_daemon()
    with grpc.insecure_channel(f"unix:{d.socket}") as channel, d.client() as c:
        s = pb_grpc.VideoSidecarStub(channel)
        before = c.status().counters["requests"]
        refused = [
            lambda: list(s.Encode(pb.EncodeRequest(request_id="has space"))),
            lambda: list(s.Encode(pb.EncodeRequest(request_id="\x1b[2J"))),
            lambda: list(s.EncodeStream(iter([pb.StreamRequest(end=pb.StreamEnd())]))),
            lambda: list(
                channel.unary_stream("/video_sidecar.v1.VideoSidecar/Encode")(b"\xff\xff")
            ),
        ]
        for call in refused:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        c.encode(np.zeros((2, H, W, 3), np.uint8))
        assert c.status().counters["requests"] == before + len(refused) + 1
