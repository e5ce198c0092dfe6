"""The command line: demo, status, serve failures."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from client._video import ArrayVideo
from client.patterns import moving_pattern
from sidecar.tools.tool import ProgressBar

from .conftest import new_prefix
from .helpers import SHM_DIR, Daemon, daemon_command


def run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*daemon_command(), *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})}, check=False,
    )  # fmt: skip


def test_demo_starts_a_daemon_and_writes_a_valid_mp4(tmp_path: Path) -> None:
    prefix = new_prefix()
    env = {
        "VIDEO_SIDECAR_SHM_PREFIX": prefix,
        "VIDEO_SIDECAR_OUTPUT_DIR": str(tmp_path / "out"),
        "VIDEO_SIDECAR_SOCKET": str(tmp_path / "s.sock"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    result = run(["demo", "--frames", "30", "--width", "320", "--height", "192"], env)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"^wrote (\S+\.mp4)$", result.stdout, re.M)
    assert match, result.stdout
    path = Path(match.group(1))
    assert path == (tmp_path / "out" / "demo" / "demo.mp4").resolve() and path.is_file()
    # The daemon it started logged to a file, named in the output, not to the terminal.
    log = tmp_path / "state" / "video-sidecar" / f"{prefix}.log"
    assert f"log {log}" in result.stdout and "serving on" in log.read_text()
    assert "sidecar.face.server" not in result.stdout + result.stderr
    for stage in ("lease", "copy into slabs", "encode", "daemon total"):
        assert stage in result.stdout
    assert not list(SHM_DIR.glob(f"{prefix}*")), "the demo's daemon left segments"
    assert not (tmp_path / "s.sock").exists()


def test_demo_output_passes_ffprobe(daemon: Daemon) -> None:
    """An independent decoder agrees: codec, size and every frame."""
    if not shutil.which("ffprobe"):
        pytest.skip("ffprobe is not installed (apt-get install ffmpeg)")
    args = ["demo", "--socket", daemon.socket, "--frames", "30", "--width", "320"]
    result = run([*args, "--height", "192", "-o", "probe.mp4", "--overwrite"])
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"^wrote (\S+\.mp4)$", result.stdout, re.M)
    assert match, result.stdout
    probe = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=codec_name,width,height,nb_read_frames", "-of", "json", match.group(1)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    stream = json.loads(probe.stdout)["streams"][0]
    assert stream["codec_name"] == "h264"
    assert (stream["width"], stream["height"]) == (320, 192)
    assert int(stream["nb_read_frames"]) == 30


def test_demo_uses_a_running_daemon(daemon: Daemon) -> None:
    result = run(
        ["demo", "--socket", daemon.socket, "--frames", "4", "--width", "64", "--height", "64"]
    )
    assert result.returncode == 0, result.stderr
    assert "starting a daemon" not in result.stdout
    assert str(daemon.output_dir.resolve()) in result.stdout


def test_status_json(daemon: Daemon) -> None:
    result = run(["status", "--json", "--socket", daemon.socket])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["pool"]["total_bytes"] == 4 * 16 * 1024 * 1024
    assert report["pool"]["leased_bytes"] == 0
    human = run(["status", "--socket", daemon.socket])
    assert human.returncode == 0 and "pool" in human.stdout


def test_status_counts_live_clients_and_names_the_daemons_paths(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """Clients that came and went are not live: the count says which are, and the daemon
    names its output root and pool, so that nobody guesses them from local defaults."""
    d = make_daemon(lease_ttl=3)
    for _ in range(3):  # came, encoded, went
        with d.client() as c:
            c.encode(moving_pattern(2, 32, 32))
    with d.client() as holder:
        leases = [holder.lease(4096)]
        for _ in range(3):  # the three called over a lease TTL ago: not live
            time.sleep(1.1)
            leases.append(holder.lease(4096))  # a call: the holder's leases live on
        report = json.loads(run(["status", "--json", "--socket", d.socket]).stdout)
        assert (report["live_clients"], report["clients_attached"]) == (1, 4)
        assert report["output_dir"] == str(d.output_dir.resolve())
        assert (report["shm_dir"], report["shm_prefix"]) == (str(SHM_DIR), d.prefix)
        leases.append(holder.lease(4096))
        human = run(["status", "--socket", d.socket]).stdout
        assert "1 live" in human and "4 attached" in human, human
        assert f"output   {d.output_dir.resolve()}" in human, human
        assert f"{SHM_DIR}/{d.prefix}" in human, human
        for lease in leases:
            holder.release(lease)
    config = run(["config", "--socket", d.socket]).stdout
    assert config.startswith("# What `video-sidecar serve` would start with here"), config


def test_status_without_daemon(tmp_path: Path) -> None:
    sock = str(tmp_path / "none.sock")
    result = run(["status", "--socket", sock], timeout=60)
    assert result.returncode == 1
    assert f"no daemon answers at {sock}" in result.stderr
    assert f"`video-sidecar serve --socket {sock}`" in result.stderr


def test_too_small_shm_is_a_clear_startup_error() -> None:
    daemon = Daemon(new_prefix(), slabs=1024, slab_size="1TiB")
    try:
        with pytest.raises(RuntimeError, match="exited with status 1"):
            daemon.start()
        log = daemon.log()
        assert "slab pool needs" in log and "--shm-size" in log
        assert daemon.segments() == []
    finally:
        daemon.cleanup()


def test_bad_flag_value() -> None:
    result = run(["serve", "--slabs", "0"])
    assert result.returncode == 2 and "slabs must be 1 to 1024" in result.stderr


def test_sigterm_leaves_nothing(make_daemon) -> None:
    d = make_daemon()
    assert len(d.segments()) == 5
    assert d.stop() == 0
    assert d.segments() == [] and not os.path.exists(d.socket)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_closed_terminal_or_ctrl_c_leaves_nothing(make_daemon, sig: int) -> None:  # type: ignore[no-untyped-def]
    """SIGHUP (the terminal `serve` ran in went away) shuts down as SIGTERM does."""
    d = make_daemon(encoder_processes=1)
    with d.client() as c:
        assert c.encode(moving_pattern(2, 32, 32)).frames == 2
    d.process.send_signal(sig)
    assert d.process.wait(30) == 0
    assert d.segments() == [] and not os.path.exists(d.socket)
    assert (
        "sidecar.face.server: shutting down" in d.log()
        and "sidecar.face.server: stopped" in d.log()
    )


def test_sigkill_then_restart_sweeps_stale_segments(make_daemon) -> None:
    d = make_daemon()
    stale = d.segments()
    d.kill()
    assert d.segments() == stale  # SIGKILL leaves them behind
    d.start()
    fresh = d.segments()
    assert not set(stale) & (set(fresh) - {f"{d.prefix}.lock"})
    assert "removed 4 stale segments" in d.log()


def test_python_m_sidecar_works() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "--version"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and "video-sidecar" in out.stdout


def test_diffusion_worker_example(daemon: Daemon) -> None:
    pytest.importorskip("torch")
    example = Path(__file__).resolve().parent.parent / "examples" / "diffusion_worker.py"
    result = subprocess.run(
        [sys.executable, str(example), "--frames", "12", "--height", "64", "--width", "96",
         "--chunk", "4", "--socket", daemon.socket],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "whole video:" in result.stdout and "streamed:" in result.stdout


def test_progress_bar_lines() -> None:
    assert ProgressBar.line(120, 240, width=10) == "[#####     ] 120/240 frames"
    assert ProgressBar.line(240, 240, width=10) == "[##########] 240/240 frames"
    assert ProgressBar.line(114, 0, width=10) == "[          ] 114 frames"  # no "114/0"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_of_a_streamed_video_has_its_total(
    make_daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = make_daemon(slabs=2, slab_size="1MiB")  # the 4.4 MB video is streamed
    copy_into = ArrayVideo.copy_into

    def slow_copy(self: ArrayVideo, *args: Any) -> None:
        time.sleep(0.3)  # progress arrives while the copies go on
        copy_into(self, *args)

    monkeypatch.setattr(ArrayVideo, "copy_into", slow_copy)
    terminal = _Terminal()
    bar = ProgressBar(terminal, after=0)
    with d.client() as c:
        c.encode(moving_pattern(40, 144, 256), on_progress=bar)
    bar.close()
    shown = [line for line in terminal.getvalue().strip().split("\r") if line]
    assert len(shown) > 1 and all(line.endswith("/40 frames") for line in shown), shown
    assert shown[-1] == ProgressBar.line(40, 40)
