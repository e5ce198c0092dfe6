"""Frames as diffusers pipelines hand them over, through `encode` and the drop-in
`export_to_video`, against diffusers' own code: its `VideoProcessor.postprocess_video`
makes the frames from a VAE-like [-1, 1] video, for `output_type` np, pt and pil, and each
goes in as it is. The decoded video must match the frames diffusers' `export_to_video`
would have been given."""

from __future__ import annotations

import fractions
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from client import InvalidArgument, InvalidVideo, export_to_video
from client.patterns import moving_pattern

from .conftest import new_prefix
from .helpers import SHM_DIR, Daemon, decode, psnr

# In the test extra (CI has it); a GPU host without it runs the CUDA tests, not these.
VideoProcessor = pytest.importorskip("diffusers.video_processor").VideoProcessor

T, H, W = 9, 128, 192
OUTPUT_TYPES = ("np", "pt", "pil")


@pytest.fixture(scope="module")
def vae_video() -> torch.Tensor:
    """What a VAE decodes: (1, 3, T, H, W) float32 in [-1, 1]."""
    rgb = moving_pattern(T, H, W, noise=2.0).astype(np.float32) / 127.5 - 1
    return torch.from_numpy(rgb).permute(3, 0, 1, 2)[None].contiguous()


@pytest.fixture(scope="module")
def given(vae_video: torch.Tensor) -> np.ndarray:
    """The uint8 frames diffusers' export_to_video makes of the pipeline's np output."""
    frames = VideoProcessor().postprocess_video(vae_video, output_type="np")[0]
    return (frames * 255).astype(np.uint8)


def pipeline_frames(vae_video: torch.Tensor, output_type: str) -> Any:
    """`pipe(...).frames`, as a pipeline returns it."""
    return VideoProcessor().postprocess_video(vae_video, output_type=output_type)


@pytest.mark.parametrize("output_type", OUTPUT_TYPES)
@pytest.mark.parametrize("which", ["frames", "frames[0]"])
def test_pipeline_outputs_encode_as_they_are(
    daemon: Daemon, vae_video: torch.Tensor, given: np.ndarray, output_type: str, which: str
) -> None:
    frames = pipeline_frames(vae_video, output_type)
    video = frames if which == "frames" else frames[0]
    with daemon.client() as sidecar:
        result = sidecar.encode(video, fps=16)
    decoded, _ = decode(result.data or b"")
    assert decoded.shape == given.shape
    assert psnr(decoded, given) >= 35, (output_type, which)


@pytest.mark.parametrize("output_type", OUTPUT_TYPES)
def test_pipeline_outputs_export_to_video(
    daemon: Daemon, vae_video: torch.Tensor, given: np.ndarray, output_type: str, tmp_path: Path
) -> None:
    frames = pipeline_frames(vae_video, output_type)
    out = tmp_path / f"{output_type}.mp4"
    returned = export_to_video(frames[0], str(out), fps=16, socket=daemon.socket)
    assert returned == str(out)  # the path, as diffusers returns it
    decoded, facts = decode(out)
    assert psnr(decoded, given) >= 35
    assert facts["rate"] == 16 and len(decoded) == T
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary left


def test_lists_of_arrays_and_tensors(daemon: Daemon, given: np.ndarray) -> None:
    """A list of (H, W, C) arrays in [0, 1] or uint8, of (C, H, W) or (H, W, C) tensors:
    each decodes to the frames given."""
    floats = [frame.astype(np.float32) / 255 for frame in given]
    tensors_chw = [torch.from_numpy(frame).permute(2, 0, 1) for frame in floats]
    tensors_hwc = [torch.from_numpy(frame) for frame in given]
    with daemon.client() as sidecar:
        for video in (floats, list(given), tuple(given), tensors_chw, tensors_hwc):
            decoded, _ = decode(sidecar.encode(video, fps=16).data or b"")
            assert psnr(decoded, given) >= 35


def test_a_vae_output_goes_with_its_range(
    daemon: Daemon, vae_video: torch.Tensor, given: np.ndarray
) -> None:
    """The VAE's own tensor, bf16 too: sent with value_range=(-1, 1), refused without."""
    with daemon.client() as sidecar:
        for video in (vae_video, vae_video.to(torch.bfloat16)):
            with pytest.raises(InvalidVideo, match=r"value_range=\(-1, 1\)"):
                sidecar.encode(video)
            decoded, _ = decode(sidecar.encode(video, value_range=(-1, 1)).data or b"")
            assert psnr(decoded, given) >= 35


@pytest.mark.parametrize("output_type", OUTPUT_TYPES)
def test_a_batch_of_videos_is_refused_naming_frames_0(
    daemon: Daemon, vae_video: torch.Tensor, output_type: str
) -> None:
    frames = pipeline_frames(torch.cat([vae_video, vae_video]), output_type)
    with daemon.client() as sidecar, pytest.raises(InvalidVideo, match=r"frames\[0\]"):
        sidecar.encode(frames)


def test_frames_that_differ_are_refused_naming_the_first(daemon: Daemon, given: np.ndarray) -> None:
    images = pipeline_frames(torch.zeros(1, 3, 4, H, W), "pil")[0]
    cases = [
        ([*images[:2], images[2].convert("L")], r"frames\[2\] is a PIL 'L' image"),
        ([*images[:3], images[3].resize((W // 2, H))], r"frames\[3\] is 96x128"),
        ([given[0], given[1].astype(np.float32)], r"frames\[1\] is float32"),
        ([given[0], images[0]], r"frames\[1\] is a Image"),
        ([images[0].convert("CMYK")], "convert"),
        ([], "empty"),
        (images[0], r"\[image\]"),
    ]
    with daemon.client() as sidecar:
        for video, message in cases:
            with pytest.raises(InvalidVideo, match=message):
                sidecar.encode(video)


def test_a_stream_takes_lists_chunk_by_chunk(daemon: Daemon, given: np.ndarray) -> None:
    images = pipeline_frames(torch.from_numpy(given).permute(3, 0, 1, 2)[None] / 127.5 - 1, "pil")
    with daemon.client() as sidecar, sidecar.stream(fps=16) as s:
        s.write(images[0][:4])
        s.write([frame.astype(np.float32) / 255 for frame in given[4:]])
    assert s.result is not None
    decoded, _ = decode(s.result.data or b"")
    assert psnr(decoded, given) >= 35


# -- paths and numbers as Python users pass them --------------------------------------------


def test_paths_as_python_users_pass_them(daemon: Daemon, given: np.ndarray) -> None:
    with daemon.client() as sidecar:
        result = sidecar.encode(given, path=Path("jobs") / "a.mp4")
        assert Path(result.path or "") == daemon.output_dir / "jobs" / "a.mp4"
        inside = daemon.output_dir / "jobs" / "b.mp4"
        assert Path(sidecar.encode(given, path=str(inside)).path or "") == inside
        with pytest.raises(InvalidArgument, match="outside the output root"):
            sidecar.encode(given, path="/tmp/elsewhere.mp4")
        with pytest.raises(InvalidArgument, match=r"'\.\.'"):
            sidecar.encode(given, path=str(daemon.output_dir / ".." / "c.mp4"))


@pytest.mark.parametrize(
    ("fps", "rate"),
    [
        (np.float32(16), fractions.Fraction(16)),
        (np.int64(24), fractions.Fraction(24)),
        (fractions.Fraction(30000, 1001), fractions.Fraction(30000, 1001)),
        (Decimal("12.5"), fractions.Fraction(25, 2)),
        (29.97, fractions.Fraction(2997, 100)),
    ],
)
def test_fps_as_any_real_number(daemon: Daemon, given: np.ndarray, fps: Any, rate: Any) -> None:
    with daemon.client() as sidecar:
        data = sidecar.encode(given[:2], fps=fps).data or b""
    assert decode(data)[1]["rate"] == rate


WRONG = [
    ("fps", "x"), ("fps", None), ("path", 5), ("path", b"x.mp4"), ("crf", "x"),
    ("crf", 1.5), ("preset", 5), ("profile", 5), ("bitrate", 1.5), ("gop", "x"),
    ("threads", -1), ("extra", 5), ("request_id", 5), ("timeout", "x"), ("container", 5),
    ("codec", 5), ("overwrite", "yes"), ("layout", 5), ("value_range", "x"),
    ("value_range", (0, float("nan"))), ("pixel_format", 5), ("thumbnail", "x"),
    ("sprite_sheet", 5), ("sample_rate", "x"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), WRONG, ids=str)
def test_every_wrong_type_is_named(
    daemon: Daemon, given: np.ndarray, name: str, value: Any
) -> None:
    extra = {"audio": np.zeros(1600, np.float32)} if name == "sample_rate" else {}
    with daemon.client() as sidecar, pytest.raises(InvalidArgument) as refused:
        sidecar.encode(given[:2], **{name: value, **extra})
    assert name in str(refused.value)


# -- the drop-in ----------------------------------------------------------------------------


def test_export_to_video_as_diffusers_is_called(
    daemon: Daemon, given: np.ndarray, tmp_path: Path
) -> None:
    out = tmp_path / "clip.mp4"
    for _ in range(2):  # the same script run again replaces its file, as diffusers does
        assert export_to_video(list(given), out, 16, socket=daemon.socket) == str(out)
    with pytest.raises(InvalidArgument, match="exists"):
        export_to_video(list(given), out, socket=daemon.socket, overwrite=False)
    temp = export_to_video(given, socket=daemon.socket)  # no path: a temporary .mp4
    assert temp.endswith(".mp4") and len(decode(temp)[0]) == T
    os.unlink(temp)
    export_to_video(given, tmp_path / "q.mp4", quality=9, socket=daemon.socket)
    export_to_video(given, tmp_path / "r.mp4", bitrate="200k", socket=daemon.socket)
    assert (tmp_path / "q.mp4").stat().st_size > out.stat().st_size  # higher quality: larger
    thumbs = export_to_video(given, tmp_path / "t.mp4", socket=daemon.socket, thumbnail=True)
    assert Path(thumbs).with_suffix(".thumbnail.jpg").exists()


def test_export_to_video_refuses_what_it_cannot_write(
    daemon: Daemon, given: np.ndarray, tmp_path: Path
) -> None:
    cases = [
        ({"output_video_path": tmp_path / "missing" / "x.mp4"}, "output_video_path"),
        ({"output_video_path": tmp_path / "x.gif"}, "output_video_path"),
        ({"output_video_path": 5}, "output_video_path"),
        ({"quality": 11}, "quality"),
        ({"quality": "high"}, "quality"),
        ({"bitrate": "fast"}, "bitrate"),
        ({"macro_block_size": 0}, "macro_block_size"),
        ({"fps": "x"}, "fps"),
    ]
    for kwargs, name in cases:
        arguments = {"output_video_path": tmp_path / "ok.mp4", **kwargs}
        with pytest.raises(InvalidArgument, match=name):
            export_to_video(given, socket=daemon.socket, **arguments)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, nothing left


def test_quality_and_bitrate_map_as_imageio_ffmpeg_does() -> None:
    from client._export import bits_per_second, crf_of

    assert [crf_of(q, "libx264", "fast") for q in (0, 5, 10)] == [44, 18, 0]
    assert crf_of(5) == 22  # balanced: where veryfast makes what medium makes at 25
    assert crf_of(5, video=(832, 480, 81)) == 22 and crf_of(5, video=(448, 256, 17)) == 24
    assert crf_of(5, "vp9") == 31 and crf_of(5, "h265") == 25
    assert bits_per_second("800k") == 800_000 and bits_per_second("2.5M") == 2_500_000
    assert bits_per_second(1_000_000) == 1_000_000


# -- a daemon started for the caller ----------------------------------------------------------

SCRIPT = """
import logging, sys, numpy as np
from client import export_to_video
from client.patterns import moving_pattern
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
export_to_video(list(moving_pattern(4, 64, 96)), sys.argv[1], fps=8)
print("written")
"""


def test_a_daemon_is_started_when_none_answers_and_stops_when_idle(tmp_path: Path) -> None:
    socket = tmp_path / "run" / "sidecar.sock"
    prefix = new_prefix()
    env = {
        **os.environ,
        "VIDEO_SIDECAR_SOCKET": str(socket),
        "VIDEO_SIDECAR_SHM_PREFIX": prefix,
        "VIDEO_SIDECAR_OUTPUT_DIR": str(tmp_path / "root"),
        "VIDEO_SIDECAR_ENCODER_PROCESSES": "0",
        "VIDEO_SIDECAR_SLABS": "2",
        "VIDEO_SIDECAR_SLAB_SIZE": "8MiB",
        "VIDEO_SIDECAR_IDLE_EXIT": "4",
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }

    def run(*names: str) -> list[subprocess.CompletedProcess[str]]:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", SCRIPT, str(tmp_path / name)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in names
        ]
        return [subprocess.CompletedProcess(p.args, p.wait(60), *p.communicate()) for p in procs]

    first = run("a.mp4", "b.mp4")  # two callers at once: one daemon
    assert all(r.returncode == 0 and "written" in r.stdout for r in first), first
    started = [r for r in first if "started one" in r.stderr]
    assert len(started) == 1, [r.stderr for r in first]
    assert "stops by itself when idle" in started[0].stderr
    (again,) = run("c.mp4")  # warm: found, not started
    assert again.returncode == 0 and "started one" not in again.stderr
    for name in ("a.mp4", "b.mp4", "c.mp4"):
        assert len(decode(tmp_path / name)[0]) == 4
    # gRPC removes its socket as it stops listening, a moment before the slabs go.
    deadline = time.monotonic() + 20
    while (socket.exists() or any(SHM_DIR.glob(f"{prefix}.*"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not socket.exists(), "the daemon did not stop by itself"
    assert sorted(SHM_DIR.glob(f"{prefix}.*")) == []
    log = (tmp_path / "state" / "video-sidecar" / "autostart.log").read_text()
    assert "--idle-exit" in log and "stopped" in log
