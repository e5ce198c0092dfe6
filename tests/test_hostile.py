"""Hostile and careless requests over raw gRPC (no project client) against the real daemon:
undecodable bytes, leases shared by audio and video, empty streams, request ids, and the
error model every answer carries."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.vocabulary import ERROR_DOMAIN, ERROR_KEY, Reason

from .helpers import Daemon, decode, output_of

SERVICE = "/video_sidecar.v1.VideoSidecar/"
UNARY = ("Attach", "Lease", "Release", "Status")
GARBAGE = [
    b"\xff\xff\xff\xff",
    b"\x0a\x02\xff\xfe",  # field 1 (a string) holding invalid UTF-8
    b"\x08",  # a varint tag with no value
    b"\x12\x80\x80\x80\x80\x10",  # a length far past the end
]
W, H, FRAMES = 64, 48, 6
FRAME_BYTES = W * H * 3


@pytest.fixture(scope="module")
def channel(daemon: Daemon) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"unix:{daemon.socket}") as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> pb_grpc.VideoSidecarStub:
    return pb_grpc.VideoSidecarStub(channel)


@pytest.fixture(scope="module")
def token(stub: pb_grpc.VideoSidecarStub) -> str:
    return str(stub.Attach(pb.AttachRequest(client_name="hostile")).client_token)


def rpc_error(call: object) -> grpc.RpcError:
    """Run a call (a response, or an iterator of them) and return the error it ends with."""
    try:
        if not isinstance(call, (bytes, pb.AttachResponse)) and hasattr(call, "__iter__"):
            for _ in call:  # type: ignore[attr-defined]
                pass
    except grpc.RpcError as err:
        return err
    raise AssertionError("the call succeeded")


def reason_of(err: grpc.RpcError) -> tuple[str, error_details_pb2.ErrorInfo]:
    """Our trailer, and the ErrorInfo from the standard rich error model; they must agree."""
    ours = dict(err.trailing_metadata() or ())[ERROR_KEY]  # type: ignore[attr-defined]
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, "no google.rpc.Status in the trailers"
    assert status.code == err.code().value[0]  # type: ignore[attr-defined]
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.domain == ERROR_DOMAIN and info.reason == ours
    return ours, info


def frames(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (1, H, W, 3), dtype=np.uint8)
    return np.concatenate([np.roll(base, 2 * i, axis=2) for i in range(FRAMES)])


def lease(stub: pb_grpc.VideoSidecarStub, token: str, size: int) -> pb.LeaseResponse:
    return stub.Lease(pb.LeaseRequest(client_token=token, size=size, wait_ms=5000))


def write(daemon: Daemon, stub: pb_grpc.VideoSidecarStub, token: str, lz, data) -> None:  # type: ignore[no-untyped-def]
    """Write into a lease as a client would: through the slab file the daemon named."""
    att = stub.Attach(pb.AttachRequest(client_name="peek"))
    slab = att.slabs[lz.slab_id]
    with open(Path(att.shm_dir) / slab.shm_name, "r+b") as f:
        f.seek(lz.offset)
        f.write(bytes(data))


def released(stub: pb_grpc.VideoSidecarStub, token: str, lease_id: str) -> bool:
    try:
        stub.Release(pb.ReleaseRequest(client_token=token, lease_id=lease_id))
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
        return False
    return True


def video(lease_id: str, count: int = FRAMES) -> pb.VideoDescriptor:
    return pb.VideoDescriptor(
        width=W,
        height=H,
        pixel_format=pb.PIXEL_FORMAT_RGB24,
        fps=pb.Rational(num=24, den=1),
        ranges=[pb.FrameRange(lease_id=lease_id, offset=0, frame_count=count)],
    )


# -- undecodable bytes ---------------------------------------------------------------------


# StatusRequest has no fields, so GARBAGE[1] is a well-formed unknown field 1 there.
UNARY_GARBAGE = [(m, d) for m in UNARY for d in GARBAGE if (m, d) != ("Status", GARBAGE[1])]


@pytest.mark.parametrize(("method", "data"), UNARY_GARBAGE)
def test_undecodable_unary_request_is_invalid_argument(channel, method: str, data: bytes) -> None:
    call = channel.unary_unary(SERVICE + method)
    with pytest.raises(grpc.RpcError) as info:
        call(data, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid" in info.value.details()
    assert reason_of(info.value)[0] == Reason.INVALID_REQUEST.value


@pytest.mark.parametrize("data", GARBAGE)
def test_undecodable_encode_request_is_invalid_argument(channel, data: bytes) -> None:
    err = rpc_error(channel.unary_stream(SERVICE + "Encode")(data, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


@pytest.mark.parametrize("position", [0, 1])
@pytest.mark.parametrize("data", GARBAGE)
def test_undecodable_stream_message_is_invalid_argument(
    channel, stub, token: str, position: int, data: bytes
) -> None:
    header = pb.StreamRequest(
        header=pb.StreamHeader(
            client_token=token,
            width=W,
            height=H,
            pixel_format=pb.PIXEL_FORMAT_RGB24,
            fps=pb.Rational(num=24, den=1),
        )
    ).SerializeToString()
    messages = [header, data] if position else [data]
    err = rpc_error(channel.stream_stream(SERVICE + "EncodeStream")(iter(messages), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_daemon_serves_after_garbage(stub) -> None:
    assert stub.Status(pb.StatusRequest()).pool.slabs > 0


# -- the error model -----------------------------------------------------------------------


def test_error_carries_reason_and_field(stub, token: str) -> None:
    bad = pb.EncodeRequest(client_token=token, video=video("ab" * 16))
    bad.video.width = -4
    err = rpc_error(stub.Encode(bad, timeout=10))
    reason, info = reason_of(err)
    assert reason == "INVALID_REQUEST" and info.metadata["field"] == "video.width"

    err = rpc_error(stub.Encode(pb.EncodeRequest(client_token="nobody", video=video("x"))))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert reason_of(err)[0] == "NOT_ATTACHED"


def test_proto_and_vocabulary_agree_on_reasons() -> None:
    names = {v.name.removeprefix("ERROR_REASON_") for v in pb.ErrorReason.DESCRIPTOR.values}
    assert names - {"UNSPECIFIED"} == {r.value for r in Reason}


# -- leases: all or nothing ----------------------------------------------------------------


def test_audio_and_video_may_share_a_lease(daemon, stub, token: str) -> None:
    """Audio after the frames in the same lease: accepted, encoded, lease freed after."""
    pcm = (np.sin(np.arange(12000) / 8) * 0.5).astype(np.float32)  # 0.25 s, 48 kHz mono
    audio_at = FRAMES * FRAME_BYTES
    lz = lease(stub, token, audio_at + pcm.nbytes)
    write(daemon, stub, token, lz, frames().tobytes() + pcm.tobytes())
    request = pb.EncodeRequest(
        client_token=token,
        video=video(lz.lease_id),
        audio=pb.AudioSpec(sample_rate=48000, channels=1, sample_format=pb.SAMPLE_FORMAT_F32),
        audio_data=[
            pb.AudioData(range=pb.AudioRange(lease_id=lz.lease_id, offset=audio_at, size=48000))
        ],
    )
    data = output_of(stub.Encode(request, timeout=30))
    got, _ = decode(data)
    assert len(got) == FRAMES
    assert not released(stub, token, lz.lease_id)  # consumed by the encode


def test_audio_lease_survives_a_refused_request(stub, token: str) -> None:
    audio_lease = lease(stub, token, 4096)
    request = pb.EncodeRequest(
        client_token=token,
        video=video("ab" * 16),  # no such lease: the request is refused
        audio=pb.AudioSpec(sample_rate=48000, channels=1, sample_format=pb.SAMPLE_FORMAT_F32),
        audio_data=[
            pb.AudioData(range=pb.AudioRange(lease_id=audio_lease.lease_id, offset=0, size=4096))
        ],
    )
    err = rpc_error(stub.Encode(request, timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    assert released(stub, token, audio_lease.lease_id)


def test_audio_lease_survives_a_busy_video_lease(daemon, stub, token: str) -> None:
    """The video lease is in another encode (a stream took it for its audio): nothing
    changes hands."""
    busy = lease(stub, token, FRAMES * FRAME_BYTES)
    mono = pb.AudioSpec(sample_rate=48000, channels=1, sample_format=pb.SAMPLE_FORMAT_F32)
    header = pb.StreamHeader(
        client_token=token, width=W, height=H, pixel_format=pb.PIXEL_FORMAT_RGB24,
        fps=pb.Rational(num=24, den=1), audio=mono,
        audio_data=[pb.AudioData(range=pb.AudioRange(lease_id=busy.lease_id, size=4096))],
    )  # fmt: skip
    outbox: queue.Queue[pb.StreamRequest | None] = queue.Queue()
    outbox.put(pb.StreamRequest(header=header))
    replies = stub.EncodeStream(iter(outbox.get, None), timeout=30)
    try:
        # The header's leases are taken before its encode is counted.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = stub.Status(pb.StatusRequest())
            if status.active_encodes + status.queued_encodes:
                break
            time.sleep(0.01)
        audio_lease = lease(stub, token, 4096)
        request = pb.EncodeRequest(
            client_token=token,
            video=video(busy.lease_id),
            audio=mono,
            audio_data=[
                pb.AudioData(range=pb.AudioRange(lease_id=audio_lease.lease_id, size=4096))
            ],
        )
        err = rpc_error(stub.Encode(request, timeout=10))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
        assert reason_of(err)[0] == "LEASE_BUSY"
        assert released(stub, token, audio_lease.lease_id)
    finally:
        outbox.put(pb.StreamRequest(chunk=pb.StreamChunk(inline=frames().tobytes())))
        outbox.put(pb.StreamRequest(end=pb.StreamEnd()))
        outbox.put(None)
        results = [e.result for e in replies if e.HasField("result")]
    assert results[0].frames == FRAMES
    assert not released(stub, token, busy.lease_id)  # freed with the stream


# -- empty streams -------------------------------------------------------------------------


@pytest.mark.parametrize("container", [pb.CONTAINER_MP4, pb.CONTAINER_FRAGMENTED_MP4])
@pytest.mark.parametrize("to_file", [False, True])
def test_stream_without_frames_is_refused(
    daemon, stub, token: str, container: int, to_file: bool
) -> None:
    audio_lease = lease(stub, token, 4096)
    output = pb.OutputSpec(container=container)
    if to_file:
        output.file.path = f"empty-{container}.mp4"
    header = pb.StreamHeader(
        client_token=token,
        width=W,
        height=H,
        pixel_format=pb.PIXEL_FORMAT_RGB24,
        fps=pb.Rational(num=24, den=1),
        output=output,
        audio=pb.AudioSpec(sample_rate=48000, channels=1, sample_format=pb.SAMPLE_FORMAT_F32),
        audio_data=[
            pb.AudioData(range=pb.AudioRange(lease_id=audio_lease.lease_id, offset=0, size=4096))
        ],
    )
    messages = [pb.StreamRequest(header=header), pb.StreamRequest(end=pb.StreamEnd())]
    err = rpc_error(stub.EncodeStream(iter(messages), timeout=30))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "before its first frame" in err.details()  # type: ignore[attr-defined]
    assert not list(daemon.output_dir.rglob("empty-*")), "a file was left behind"
    assert released(stub, token, audio_lease.lease_id), "the refused stream kept the lease"


# -- request ids ---------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["has space", "x" * 129, "tab\there", "é", "\x00"])
def test_bad_request_id_is_refused(stub, token: str, given: str) -> None:
    lz = lease(stub, token, FRAMES * FRAME_BYTES)
    request = pb.EncodeRequest(client_token=token, request_id=given, video=video(lz.lease_id))
    err = rpc_error(stub.Encode(request, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert reason_of(err)[1].metadata["field"] == "request_id"
    assert released(stub, token, lz.lease_id)


def test_request_id_is_kept_or_made_up(daemon, stub, token: str) -> None:
    ids = []
    for given in ("job-42/a:b", ""):
        lz = lease(stub, token, FRAMES * FRAME_BYTES)
        write(daemon, stub, token, lz, frames().tobytes())
        request = pb.EncodeRequest(client_token=token, request_id=given, video=video(lz.lease_id))
        ids += [e.result.request_id for e in stub.Encode(request) if e.HasField("result")]
    assert ids[0] == "job-42/a:b"
    assert 1 <= len(ids[1]) <= 128 and ids[1] != ids[0]


def square(lease_id: str, side: int, count: int) -> pb.VideoDescriptor:
    """`count` rgb24 frames of side x side at the start of a lease."""
    described = video(lease_id, count)
    described.width = described.height = side
    return described


@pytest.mark.parametrize("count", [1, 2, 3])
def test_short_h265_clips_always_mux(daemon, stub, token: str, count: int) -> None:
    """x265's B-frames gave 2-frame clips timestamps the MP4 muxer refused (INTERNAL)."""
    rng = np.random.default_rng(count)
    for _ in range(6):
        clip = rng.integers(0, 255, (count, 64, 64, 3), dtype=np.uint8)
        lz = lease(stub, token, clip.nbytes)
        write(daemon, stub, token, lz, clip.tobytes())
        request = pb.EncodeRequest(
            client_token=token,
            video=square(lz.lease_id, 64, count),
            codec=pb.CodecOptions(codec="h265"),
        )
        data = output_of(stub.Encode(request, timeout=30))
        got, facts = decode(data)
        assert len(got) == count and facts["codec"] == "hevc"


@pytest.mark.parametrize(
    ("width", "height", "field"), [(48, 64, "video.width"), (64, 40, "video.height")]
)
def test_h265_under_its_coding_unit_is_refused(
    daemon, stub, token: str, width: int, height: int, field: str
) -> None:
    """x265 corrupts its heap now and then on frames 40 or 48 pixels wide (glibc aborted
    the process in 2 runs of 5): such frames are refused before any encoder sees them,
    the lease stays the client's, and the daemon serves on."""
    lz = lease(stub, token, FRAMES * FRAME_BYTES)
    described = video(lz.lease_id)
    described.width, described.height = width, height
    for codec in ("h265", "hevc", "libx265"):
        request = pb.EncodeRequest(
            client_token=token, video=described, codec=pb.CodecOptions(codec=codec)
        )
        err = rpc_error(stub.Encode(request, timeout=10))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert reason_of(err)[1].metadata["field"] == field
        assert "h265 needs 64x64 at least" in err.details()  # type: ignore[attr-defined]
    assert released(stub, token, lz.lease_id)
    h264 = pb.EncodeRequest(
        client_token=token, video=video(lease(stub, token, FRAMES * FRAME_BYTES).lease_id)
    )
    assert [e for e in stub.Encode(h264, timeout=30) if e.HasField("result")]


def test_av1_under_four_pixels_names_the_side(stub, token: str) -> None:
    """SVT-AV1 refuses a side of 2 pixels when it opens; said up front, the error names
    the side, not the options."""
    lz = lease(stub, token, FRAMES * FRAME_BYTES)
    described = video(lz.lease_id)
    described.width, described.height = 2, 16
    request = pb.EncodeRequest(
        client_token=token, video=described, codec=pb.CodecOptions(codec="av1")
    )
    err = rpc_error(stub.Encode(request, timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert reason_of(err)[1].metadata["field"] == "video.width"
    assert "av1 needs 4x4 at least" in err.details()  # type: ignore[attr-defined]
    assert released(stub, token, lz.lease_id)


def test_an_encode_stopped_by_its_calls_deadline_answers_deadline_exceeded() -> None:
    """The daemon's own timer for a call's deadline may fire before the client's: the
    encode it stops answers DEADLINE_EXCEEDED, which the client reads as its deadline,
    not CANCELLED, a cancel the client never made."""
    import asyncio

    from sidecar.errors import Cancelled, DeadlinePassed, ShuttingDown
    from sidecar.face.calls import CallEnd
    from sidecar.face.status_codes import status_of

    async def main() -> None:
        with CallEnd(0.01) as timed:
            await asyncio.sleep(0.05)
            assert timed.ended and timed.event().is_set()
            answer = timed.why(Cancelled("cancelled by the client"))
            assert isinstance(answer, DeadlinePassed)
            assert status_of(answer) == grpc.StatusCode.DEADLINE_EXCEEDED
            assert answer.reason.proto == pb.ERROR_REASON_DEADLINE_EXCEEDED
            other = ShuttingDown("draining")  # other errors keep their own code
            assert timed.why(other) is other
        with CallEnd(5.0) as gone:  # the client went away before its deadline
            gone.end()
            cancel = Cancelled("cancelled by the client")
            assert gone.why(cancel) is cancel

    asyncio.run(main())
