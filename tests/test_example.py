"""`examples/diffusion_worker.py` run as its reader runs it: against a daemon already
serving, and starting one itself, its output files decoded."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import new_prefix
from .helpers import SHM_DIR, decode

pytest.importorskip("torch", reason="the example needs torch: pip install -e '.[torch]'")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "diffusion_worker.py"
SIZE = ["--frames", "12", "--height", "64", "--width", "96", "--chunk", "4"]


def run_example(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *SIZE, *args], cwd=cwd, capture_output=True, text=True,
        timeout=240, env={**os.environ, **(env or {})}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def check_outputs(stdout: str, output_root: Path, stream_out: Path) -> None:
    whole = re.search(r"^whole video: (\S+),", stdout, re.M)
    assert whole, stdout
    path = Path(whole.group(1))
    frames, facts = decode(path if path.is_absolute() else output_root / path)
    assert len(frames) == 12 and (facts["width"], facts["height"]) == (96, 64), facts
    streamed, facts = decode(stream_out)
    assert len(streamed) == 12 and (facts["width"], facts["height"]) == (96, 64), facts


def test_the_example_hands_its_videos_to_a_daemon_serving(daemon, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    stream_out = tmp_path / "streamed.mp4"
    stdout = run_example(["--socket", daemon.socket, "--stream-out", str(stream_out)], tmp_path)
    assert "starting one" not in stdout, stdout
    check_outputs(stdout, daemon.output_dir, stream_out)


def test_the_example_starts_a_daemon_with_its_log_in_a_file(tmp_path: Path) -> None:
    """Nothing at the socket: the example starts `video-sidecar serve`, whose log goes to
    a file and never into the example's output, and stops it at the end."""
    prefix, out = new_prefix(), tmp_path / "outputs"
    env = {"VIDEO_SIDECAR_SHM_PREFIX": prefix, "VIDEO_SIDECAR_OUTPUT_DIR": str(out),
           "VIDEO_SIDECAR_ENCODER_PROCESSES": "0"}  # fmt: skip
    log, stream_out = tmp_path / "daemon.log", tmp_path / "streamed.mp4"
    args = ["--socket", str(tmp_path / "s.sock"), "--daemon-log", str(log)]
    stdout = run_example([*args, "--stream-out", str(stream_out)], tmp_path, env)
    assert "starting one, its log in" in stdout, stdout
    assert "serving on" in log.read_text() and "serving on" not in stdout, stdout
    assert "INFO" not in stdout, stdout
    check_outputs(stdout, out, stream_out)
    assert sorted(SHM_DIR.glob(f"{prefix}.*")) == []  # stopped, its slabs removed
