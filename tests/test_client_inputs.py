"""What `encode` makes of its input: layouts read from shapes, float ranges, progress
totals for streamed videos, and output chunks handed back while encoding."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest

from client import InvalidArgument, InvalidVideo, OutOfRange
from client._convert import check_range, frames_view
from client._layout import guess_layout
from client._video import ArrayVideo
from client.patterns import moving_pattern

from .helpers import decode, psnr

H, W = 48, 64  # real frames; the sides 1, 3 and 4 below are tiny ones

# (shape, the layout read, or the candidates an InvalidVideo must name)
LAYOUT_TABLE: list[tuple[tuple[int, ...], str | tuple[str, ...]]] = [
    # (1|3|4, 1|3|4, H, W): TCHW or CTHW
    ((1, 1, H, W), "TCHW"),  # one gray frame either way
    ((1, 3, H, W), "TCHW"),  # one RGB frame, not three gray ones
    ((1, 4, H, W), "TCHW"),
    ((3, 1, H, W), "CTHW"),  # one RGB frame, not three gray ones
    ((4, 1, H, W), "CTHW"),
    ((3, 3, H, W), ("TCHW", "CTHW")),
    ((3, 4, H, W), ("TCHW", "CTHW")),
    ((4, 3, H, W), ("TCHW", "CTHW")),
    ((4, 4, H, W), ("TCHW", "CTHW")),
    ((10, 3, H, W), "TCHW"),
    ((3, 10, H, W), "CTHW"),  # the one reading with 1, 3 or 4 channels
    # (1|3|4, H, W, 1|3|4): the CTHW reading has frames 1, 3 or 4 pixels wide
    *(((t, H, W, c), "THWC") for t in (1, 3, 4) for c in (1, 3, 4)),
    ((10, H, W, 3), "THWC"),
    # tiny frames: every reading has a side of 4 pixels or less
    ((4, 3, 4, 3), ("THWC", "TCHW", "CTHW")),
    ((3, 3, H, 3), ("THWC", "TCHW", "CTHW")),
    ((1, 3, H, 3), ("THWC", "TCHW", "CTHW")),
    ((3, 4, H, 3), ("THWC", "TCHW", "CTHW")),
    ((3, H, 3, 3), ("THWC", "CTHW")),
    ((3, 3, 3, 3), ("THWC", "TCHW", "CTHW")),
    ((10, 4, 4, 3), ("THWC", "TCHW")),
    ((10, 8, 8, 3), "THWC"),  # 8x8 frames are real: TCHW would be 8 channels anyway
    # tiny frames in the one reading left: refused, saying what they would be
    ((1, 1, 1, 1), ("1 frame of 1x1 gray", "layout='THWC'")),
    ((4, H, W, 2), (f"{H} frames of 2x{W} RGBA", "layout='CTHW' if that is meant")),
    ((5, 2, 2, 3), ("5 frames of 2x2 RGB", "layout='THWC' if that is meant")),
    # no channel axis at all
    ((2, 2, H, W), ()),
    ((10, H, W, 5), ()),
    # 5-D with B=1: (B, C, T, H, W) as VAEs return it, (B, T, C, H, W) and (B, T, H, W, C)
    # as diffusers' pipe(...).frames holds it (pt, np); RGB beats RGBA, then BCTHW
    ((1, 3, 16, H, W), "BCTHW"),
    ((1, 3, 1, H, W), "BCTHW"),  # one RGB frame
    ((1, 4, 1, H, W), "BCTHW"),
    ((1, 1, 1, H, W), "BCTHW"),
    ((1, 1, 16, H, W), "BCTHW"),
    ((1, 3, 3, H, W), "BCTHW"),  # the 5-D tie-break: never (B, T, C, H, W)
    ((1, 3, 4, H, W), "BCTHW"),  # a VAE's chunk of 4 frames
    ((1, 4, 3, H, W), "BTCHW"),  # a pipeline's 4 RGB frames, not 3 RGBA ones
    ((1, 1, 3, H, W), "BTCHW"),  # one RGB frame, not 3 gray ones
    ((1, 16, 3, H, W), "BTCHW"),  # the only reading: diffusers' pt output
    ((1, 16, H, W, 3), "BTHWC"),  # diffusers' np output
    ((1, 3, H, W, 3), "BTHWC"),  # BCTHW's frames would be 3 pixels wide
    ((1, 4, 3, 4, 3), "BCTHW"),  # tiny frames: every reading fits, so BCTHW's does
    ((1, 16, 17, H, W), ()),  # 16 channels
    ((2, 3, 16, H, W), ("batch",)),
    ((3, 3, 3, H, W), ("batch",)),
    # 3-D: one image wants a time axis, gray frames a channel axis
    ((3, H, W), ("video[None]", "layout='TCHW'")),
    ((H, W, 3), ("add a time axis, video[None]",)),
    ((10, H, W), ("add a channel axis, video[..., None]",)),
]


def virtual(shape: tuple[int, ...], dtype: str = "uint8", value: float = 0) -> np.ndarray:
    """An array of `shape` that takes no memory."""
    return np.broadcast_to(np.array(value, dtype), shape)


@pytest.mark.parametrize(("shape", "expected"), LAYOUT_TABLE, ids=str)
def test_layout_is_read_only_when_the_shape_has_one_reading(
    shape: tuple[int, ...], expected: str | tuple[str, ...]
) -> None:
    if isinstance(expected, str):
        assert guess_layout(shape) == expected
        video = virtual(shape)
        assert frames_view(video, None).shape == frames_view(video, expected).shape
        return
    with pytest.raises(InvalidVideo) as info:
        frames_view(virtual(shape), None)
    message = str(info.value)
    for name in expected:
        assert name in message, message
    if len(expected) > 1 and set(expected) <= {"THWC", "TCHW", "CTHW"}:
        assert "ambiguous" in message and "layout=" in message
        assert all(f"'{name}'" in message for name in expected)  # as layout= takes it


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_ambiguous_shapes_are_refused_by_encode(client: Any, kind: str) -> None:
    torch = pytest.importorskip("torch")
    data = moving_pattern(3, H, W).transpose(0, 3, 1, 2).copy()  # (3, 3, H, W): TCHW
    video = torch.from_numpy(data) if kind == "tensor" else data
    with pytest.raises(InvalidVideo, match=r"ambiguous.*layout='TCHW' or 'CTHW'"):
        client.encode(video)
    assert client.encode(video, layout="TCHW").frames == 3
    one = video[:1]  # (1, 3, H, W): one RGB frame
    frames, _ = decode(client.encode(one, crf=18).data or b"")
    assert frames.shape == (1, H, W, 3) and psnr(frames, data[:1].transpose(0, 2, 3, 1)) >= 40


def test_vae_chunks_are_bcthw(client: Any) -> None:
    torch = pytest.importorskip("torch")
    rgb = torch.from_numpy(moving_pattern(8, H, W)).permute(3, 0, 1, 2)[None]  # (1, 3, 8, H, W)
    with client.stream(fps=24) as s:
        for chunk in (rgb[:, :, :1], rgb[:, :, 1:4], rgb[:, :, 4:8]):  # 1, 3 and 4 frames
            s.write(chunk)
    assert s.result is not None and s.result.frames == 8
    frames, _ = decode(s.result.data or b"")
    assert psnr(frames, moving_pattern(8, H, W)) >= 40
    as_pipelines_give = rgb.permute(0, 2, 1, 3, 4)  # (1, 8, 3, H, W): (B, T, C, H, W)
    again, _ = decode(client.encode(as_pipelines_give).data or b"")
    assert psnr(again, moving_pattern(8, H, W)) >= 40


# -- float ranges --------------------------------------------------------------------------


SIGNED = (6, 144, 256)  # frames large enough to hold dark parts (below 0 in [-1, 1])


@pytest.fixture(scope="module")
def signed() -> np.ndarray:
    """A float32 video in [-1, 1]."""
    return moving_pattern(*SIGNED).astype(np.float32) / 127.5 - 1


def test_signed_video_with_the_default_range_is_refused(client: Any, signed: np.ndarray) -> None:
    """[-1, 1] read as [0, 1] loses the lower half: refused, naming the fix; read in its
    own range, it comes back right."""
    with pytest.raises(InvalidVideo, match=r"value_range=\(-1, 1\)") as refused:
        client.encode(signed)
    assert "was read in value_range=(0, 1)" in str(refused.value)
    assert "they range from -0.78 to 0.78" in str(refused.value)  # the values it saw
    right = client.encode(signed, value_range=(-1, 1))
    frames, _ = decode(right.data or b"")
    assert psnr(frames, moving_pattern(*SIGNED)) >= 40


def test_a_few_stray_values_are_clipped_and_counted(
    client: Any, signed: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")
    unsigned = (signed + 1) / 2
    overshoot = np.clip(unsigned * 1.4 - 0.2, -0.03, 1.03)  # a model's small overshoot
    stray = unsigned.copy()
    stray[:, ::50, ::50] = -0.5  # well out, but on well under 1% of the samples
    with caplog.at_level(logging.DEBUG, logger="client"):
        client.encode(unsigned)
        assert not caplog.records  # nothing outside: nothing to say
        client.encode(overshoot)
        client.encode(torch.from_numpy(unsigned).to(torch.bfloat16).permute(0, 3, 1, 2))
        client.encode(moving_pattern(2, H, W))  # uint8: nothing to check
        client.encode(stray)
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said[0][0] == logging.DEBUG and "clipped" in said[0][1]  # overshoot: noise
    assert said[-1][0] == logging.INFO  # well out: said where a server logs
    assert "(-0.5 to 0.89)" in said[-1][1] and "clipped" in said[-1][1]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_signed_cpu_tensor_is_refused(client: Any, signed: np.ndarray, dtype: str) -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.from_numpy(signed).to(getattr(torch, dtype)).permute(3, 0, 1, 2)[None]
    with pytest.raises(InvalidVideo, match=r"value_range=\(-1, 1\)"):
        client.encode(tensor)
    client.encode(tensor, value_range=(-1, 1))


def test_a_stream_checks_each_chunk(client: Any, signed: np.ndarray) -> None:
    """A stream whose later chunk comes in another range is refused at that chunk: the
    first in range is no licence for the rest."""
    unsigned = (signed + 1) / 2
    with pytest.raises(InvalidVideo, match=r"value_range=\(-1, 1\)"), client.stream() as s:
        s.write(unsigned[:2])
        s.write(signed[2:4])
    with client.stream(value_range=(-1, 1)) as s:
        for first in range(0, 6, 2):
            s.write(signed[first : first + 2])
    assert s.result is not None and s.result.frames == 6


def test_range_refusals_name_the_fix() -> None:
    levels = moving_pattern(4, H, W).astype(np.float32)
    with pytest.raises(InvalidVideo, match="divide by 255"):
        check_range(levels, (0, 1), None)
    with pytest.raises(InvalidVideo, match="divide by 255"):
        check_range(levels, (-1, 1), None)
    assert check_range(levels / 255, (0, 1), None).beyond == 0
    assert check_range(levels / 255, (-1, 1), None).beyond == 0  # inside: cannot tell
    nan = np.full((2, H, W, 3), np.nan, np.float32)
    assert check_range(nan, (0, 1), None).clipped == 0  # NaN is documented: it becomes 0


def test_range_check_reads_a_bounded_sample() -> None:
    """A 10,000-frame 4K video (virtual: broadcast, no memory) is checked in a blink."""
    shape = (10_000, 2160, 3840, 3)
    began = time.perf_counter()
    with pytest.raises(InvalidVideo):
        check_range(virtual(shape, "float32", -1), (0, 1), None)
    assert check_range(virtual(shape, "float32", 0.5), (0, 1), None).clipped == 0
    assert time.perf_counter() - began < 1.0


@pytest.mark.cuda
def test_signed_cuda_tensor_is_refused(client: Any, signed: np.ndarray) -> None:
    import torch

    gpu = torch.from_numpy(signed).cuda().to(torch.bfloat16)
    with pytest.raises(InvalidVideo, match=r"value_range=\(-1, 1\)"):
        client.encode(gpu)
    client.encode(gpu, value_range=(-1, 1))
    gpu_list = [frame for frame in gpu]  # a list of (H, W, C) CUDA tensors
    with pytest.raises(InvalidVideo, match=r"value_range=\(-1, 1\)"):
        client.encode(gpu_list)
    frames, _ = decode(client.encode(gpu_list, value_range=(-1, 1)).data or b"")
    assert psnr(frames, moving_pattern(*SIGNED)) >= 38


# -- progress and output chunks ------------------------------------------------------------


def test_streamed_video_reports_its_total(
    make_daemon, connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = make_daemon(slabs=2, slab_size="1MiB")  # 110 KiB frames: 9 a lease, 18 in the pool
    video = moving_pattern(40, 144, 256)  # 4.4 MB: more than half the pool, so streamed
    seen: list[tuple[int, int]] = []
    copy_into = ArrayVideo.copy_into

    def slow_copy(self: ArrayVideo, *args: Any) -> None:
        time.sleep(0.3)  # a slow producer: the daemon reports progress while it waits
        copy_into(self, *args)

    monkeypatch.setattr(ArrayVideo, "copy_into", slow_copy)
    with connect(d) as c:
        result = c.encode(video, on_progress=lambda done, total: seen.append((done, total)))
        assert c.status().counters["leases_granted"] >= 4  # it went as a stream
    assert result.frames == 40
    assert len(seen) > 1 and {total for _, total in seen} == {40}
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == 40


def test_progress_of_a_stream_has_its_total_at_the_end(client: Any) -> None:
    seen: list[tuple[int, int]] = []
    with client.stream(fps=24, on_progress=lambda *p: seen.append(p)) as s:
        s.write(moving_pattern(4, H, W))
    assert seen[-1] == (4, 4)
    assert all(total in (0, 4) for _, total in seen)


@pytest.mark.parametrize("container", ["mp4", "fmp4", "webm"])
def test_encode_hands_back_chunks(client: Any, container: str) -> None:
    pieces: list[bytes] = []
    result = client.encode(moving_pattern(24, H, W), container=container, on_chunk=pieces.append)
    assert pieces and b"".join(pieces) == result.data


def test_encode_to_a_file_hands_back_no_chunks(client: Any) -> None:
    pieces: list[bytes] = []
    result = client.encode(
        moving_pattern(4, H, W), path="chunks/none.mp4", overwrite=True, on_chunk=pieces.append
    )
    assert result.path and pieces == []


def test_streamed_encode_hands_back_chunks(make_daemon, connect) -> None:
    d = make_daemon(slabs=2, slab_size="1MiB")
    video = moving_pattern(40, 144, 256)
    pieces: list[bytes] = []
    with connect(d) as c:
        result = c.encode(video, container="fmp4", gop=6, on_chunk=pieces.append)
    assert len(pieces) > 1 and b"".join(pieces) == result.data
    frames, _ = decode(result.data or b"")
    assert frames.shape == video.shape


def test_unknown_keywords_still_name_encode(client: Any, twin: str) -> None:
    name = {"sync": "SidecarClient", "async": "AsyncSidecarClient"}[twin]
    with pytest.raises(TypeError, match=rf"^{name}\.encode\(\) got an unexpected .* 'on_chunks'"):
        client.encode(moving_pattern(2, H, W), on_chunks=print)


# -- parameters of the wrong type or beyond what a request can hold ------------------------

BAD_PARAMETERS = [
    ({"fps": float("nan")}, "fps"),
    ({"fps": float("inf")}, "fps"),
    ({"fps": None}, "fps"),
    ({"fps": ("a", 1)}, "fps"),
    ({"fps": (1, 2, 3)}, "fps"),
    ({"fps": (24, 0)}, "fps"),
    ({"fps": 1e-9}, "fps"),
    ({"fps": True}, "fps"),
    ({"crf": 20.5}, "crf"),
    ({"crf": "20"}, "crf"),
    ({"crf": 2**40}, "crf"),
    ({"gop": 1.0}, "gop"),
    ({"threads": -1}, "threads"),
    ({"threads": 2**40}, "threads"),
    ({"timeout": -1}, "timeout"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": float("nan")}, "timeout"),
    ({"timeout": "5"}, "timeout"),
    ({"container": 4}, "container"),
    ({"path": b"x.mp4"}, "path"),
    ({"overwrite": "yes"}, "overwrite"),
    ({"extra": ["crf"]}, "extra"),
    ({"on_progress": "print"}, "on_progress"),
]


@pytest.mark.parametrize(("kwargs", "name"), BAD_PARAMETERS, ids=lambda v: repr(v)[:30])
def test_a_parameter_a_request_cannot_hold_is_invalid_argument(
    client: Any, kwargs: dict[str, Any], name: str
) -> None:
    """The client's own exception, naming the parameter, in both twins alike; never a
    TypeError or ValueError from protobuf or gRPC. The daemon judges the rest."""
    clip = np.zeros((2, 32, 32, 3), np.uint8)
    with pytest.raises(InvalidArgument, match=name):
        client.encode(clip, **kwargs)
    assert client.encode(clip).frames == 2


def test_lease_sizes_and_waits_a_request_cannot_hold(client: Any) -> None:
    for nbytes, error in ((-1, OutOfRange), (0, OutOfRange), (1.5, InvalidArgument)):
        with pytest.raises(error):
            client.lease(nbytes)
    with pytest.raises(InvalidArgument, match="wait"):
        client.lease(4096, wait=-1)
    client.release(client.lease(4096, wait=0))


def test_encode_leased_refuses_what_a_request_cannot_hold(client: Any) -> None:
    from client import FrameRange

    lease = client.lease(64 * 64 * 3)
    try:
        for ranges, size, name in (
            ([FrameRange(lease, 1.0)], 64, "frame_count"),  # type: ignore[arg-type]
            ([lease], 64, "FrameRange"),
            ([FrameRange(lease, 1)], 64.0, "width"),
        ):
            with pytest.raises(InvalidArgument, match=name):
                client.encode_leased(ranges, width=size, height=64)
        assert client.encode_leased([FrameRange(lease, 1)], width=64, height=64).frames == 1
    finally:
        client.release(lease)
