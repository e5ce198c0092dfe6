"""`video-sidecar encode` takes frames as pipelines leave them: a directory of images (a
list of PIL images saved one by one) and a .pt list of frame tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import PIL.Image
import torch

from client.patterns import moving_pattern

from .helpers import Daemon, decode, psnr
from .test_cli_errors import cli, one_line_error

FRAMES = moving_pattern(12, 64, 96)


def test_a_directory_of_frames_in_name_order(daemon: Daemon, tmp_path: Path) -> None:
    frames = tmp_path / "frames"
    frames.mkdir()
    for i, frame in enumerate(FRAMES):  # frame_2 before frame_10, as a person names them
        PIL.Image.fromarray(frame).save(frames / f"frame_{i}.png")
    (frames / "notes.txt").write_text("not a frame")
    result = cli(["encode", str(frames), "-o", "out.mp4", "--socket", daemon.socket,
                  "--fps", "8"], tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    decoded, facts = decode(tmp_path / "out.mp4")
    assert len(decoded) == len(FRAMES) and facts["rate"] == 8
    assert psnr(decoded, FRAMES) >= 35  # in order: a shuffled video would score far lower


def test_a_pt_list_of_frame_tensors(daemon: Daemon, tmp_path: Path) -> None:
    torch.save([torch.from_numpy(f).permute(2, 0, 1) / 255 for f in FRAMES], tmp_path / "f.pt")
    result = cli(["encode", "f.pt", "-o", "out.mp4", "--socket", daemon.socket], tmp_path)
    assert result.returncode == 0, result.stderr
    assert psnr(decode(tmp_path / "out.mp4")[0], FRAMES) >= 35


def test_frames_that_cannot_be_used_are_one_line(daemon: Daemon, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_line_error(cli(["encode", str(empty), "--socket", daemon.socket], tmp_path), 2)
    assert "holds no PNG, JPEG or WebP images" in line
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    PIL.Image.fromarray(FRAMES[0]).save(mixed / "a.png")
    PIL.Image.fromarray(FRAMES[1][:32]).save(mixed / "b.png")
    line = one_line_error(cli(["encode", str(mixed), "--socket", daemon.socket], tmp_path), 2)
    assert "frames[1] is 96x32" in line
    torch.save([1, 2], tmp_path / "n.pt")
    line = one_line_error(cli(["encode", "n.pt", "--socket", daemon.socket], tmp_path), 2)
    assert "not a tensor or a list of tensors" in line
    signed = np.broadcast_to(np.linspace(-1, 1, 96, dtype=np.float32)[:, None], (12, 64, 96, 3))
    np.save(tmp_path / "v.npy", np.ascontiguousarray(signed))  # a gradient over [-1, 1]
    line = one_line_error(cli(["encode", "v.npy", "--socket", daemon.socket], tmp_path), 2)
    assert "--value-range -1,1" in line
