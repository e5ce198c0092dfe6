"""An encode whose client has left stops within about 1 s on every path, the encoder's
final drain included (DESIGN.md section 4); and the daemon's ceiling on encoder cost.

x264 at placebo, looking 250 frames ahead, hands out no packet of a video of 200 frames
until its end: their whole encode is the final drain (`encoder.drain`), which took 50-65 s
for these frames of noise on the 2-core machine (each of its packets 0.3 s at most). The
client's deadline passes 3 s in, its frames in since the first second: before the drain
stopped between packets, the encode ran on to its end, or to its process's kill 10 s on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client import DeadlineExceeded, InvalidArgument
from client.patterns import moving_pattern
from sidecar.codec.catalogue import CodecSpec
from sidecar.codec.ceiling import CostCeiling, parse_max_lookahead, parse_max_preset
from sidecar.codec.encoder import VideoEncoder
from sidecar.codec.frames import Limits, check_geometry
from sidecar.config import Config
from sidecar.errors import Cancelled, InvalidRequest
from sidecar.pipeline.encoding.segments import SegmentCoder
from sidecar.pipeline.processes.handle import STOP_GRACE_S
from tests.helpers import Daemon, decode, psnr

FRAMES, HEIGHT, WIDTH = 200, 144, 256
# Plays or stops against the clock: alone under xdist (see conftest).
pytestmark = pytest.mark.exclusive

SLOW: dict[str, Any] = {"preset": "placebo", "extra": {"x264-params": "rc-lookahead=250"}}
RAISED = {"max_preset": "placebo", "max_lookahead": 250}  # the ceiling lets SLOW through
DEADLINE_S = 3.0  # the frames are in within a second; the drain runs on far past this
STOP_S = 1.5  # "about 1 s", with room for a busy 2-core machine
LIMITS = Limits(max_frames=1000, max_width=1024, max_height=1024, max_request_bytes=1 << 30)


@pytest.fixture(scope="module")
def noise() -> np.ndarray:
    rng = np.random.default_rng(11)
    return rng.integers(0, 256, (FRAMES, HEIGHT, WIDTH, 3), dtype=np.uint8)


def slow_daemon(make_daemon: Callable[..., Daemon], **options: Any) -> Daemon:
    return make_daemon(slab_size="32MiB", **RAISED, **options)


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def stop_time(c: Any, since: float, timeout: float = 90.0) -> tuple[float, Any]:
    """Seconds from `since` until the daemon runs no encode, and its status then."""
    deadline = since + timeout
    while time.monotonic() < deadline:
        status = c.status()
        if status.active_encodes == 0:
            return time.monotonic() - since, status
        time.sleep(0.02)
    raise AssertionError(f"the encode still ran {timeout:.0f} s after its client left")


def assert_stopped(c: Any, left: float) -> None:
    took, status = stop_time(c, left)
    assert took < STOP_S, f"the encode ran on {took:.2f} s after its client left"
    assert status.pool["active_leases"] <= 1, status.pool  # the client's spare at most


# -- the drain, in the encoder -------------------------------------------------------------


def slow_encoder(path: Path, frames: int = 100) -> VideoEncoder:
    """An encoder holding `frames` frames of 192x128 noise, not one packet out yet."""
    geometry = check_geometry(192, 128, "rgb24", Fraction(24), LIMITS)
    codec = CodecSpec(preset="placebo", extra=(("x264-params", "rc-lookahead=250"),)).resolve()
    encoder = VideoEncoder(str(path), geometry, codec, threads=2)
    rng = np.random.default_rng(5)
    for _ in range(frames):
        encoder.encode(rng.integers(0, 256, (128, 192, 3), dtype=np.uint8))
    return encoder


def test_the_drain_looks_for_a_stop_between_packets(tmp_path: Path) -> None:
    """All 100 packets wait for the drain (seconds of it); a stop after the second packet
    ends it there, before the rest are made."""
    encoder = slow_encoder(tmp_path / "out.mp4")
    calls = 0

    def check() -> None:
        nonlocal calls
        calls += 1
        if calls == 3:  # before the first packet, after the first and the second
            raise Cancelled("cancelled by the client")

    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        encoder.close(check)
    took = time.monotonic() - t0
    encoder.abort()
    assert calls == 3
    assert took < 1.5, took


def test_a_drain_nobody_stops_makes_the_same_file(tmp_path: Path) -> None:
    """Packets muxed one by one as the drain hands them over: the same video as the whole
    drained at once. (Compared decoded: x264's rate control is not bit-exact from run to
    run on a busy host, so the bytes are not.)"""
    outputs = []
    for name, check in (("plain.mp4", None), ("checked.mp4", lambda: None)):
        geometry = check_geometry(96, 64, "rgb24", Fraction(24), LIMITS)
        codec = CodecSpec(preset="medium", gop=12).resolve()
        encoder = VideoEncoder(str(tmp_path / name), geometry, codec, threads=2)
        for image in moving_pattern(30, 64, 96):
            encoder.encode(image)
        encoder.close(check)
        outputs.append(decode(tmp_path / name)[0])
    plain, checked = outputs
    assert plain.shape == checked.shape and plain.shape[0] == 30
    assert psnr(plain, checked) > 40


def test_a_segment_encoder_stops_in_its_drain(tmp_path: Path) -> None:
    """Segments (a long video on many cores) drain their own encoders: stopped between
    packets too."""
    encoder = slow_encoder(tmp_path / "whole.mp4", frames=0)
    coder = SegmentCoder(encoder, 2)
    rng = np.random.default_rng(6)
    images = rng.integers(0, 256, (100, 128, 192, 3), dtype=np.uint8)
    started = [0.0]

    def stopped() -> bool:  # once every frame is in: during the drain
        if not started[0]:
            return False
        return time.monotonic() - started[0] > 0.3

    def frame_at(index: int) -> np.ndarray:
        if index == len(images) - 1:
            started[0] = time.monotonic()
        image: np.ndarray = images[index]
        return image

    with pytest.raises(Cancelled):
        coder.encode(frame_at, 0, len(images), stopped)
    assert time.monotonic() - started[0] < 1.5
    encoder.abort()


# -- every path in the daemon --------------------------------------------------------------


def test_fragmented_mp4_stops_in_the_drain(
    make_daemon: Callable[..., Daemon], noise: np.ndarray
) -> None:
    """fMP4 streamed back: encoded on an encoder thread of the daemon."""
    d = slow_daemon(make_daemon)
    with d.client() as c:
        with pytest.raises(DeadlineExceeded):
            c.encode(noise, container="fmp4", timeout=DEADLINE_S, on_chunk=lambda b: None, **SLOW)
        assert_stopped(c, time.monotonic())


def test_mp4_with_audio_stops_in_the_drain_and_keeps_nothing(
    make_daemon: Callable[..., Daemon], noise: np.ndarray
) -> None:
    """An MP4 with audio, to a file: an encoder thread of the daemon; no file is left."""
    d = slow_daemon(make_daemon)
    pcm = np.zeros((FRAMES * 2000, 2), np.float32)  # 48 kHz, as long as the video
    with d.client() as c:
        with pytest.raises(DeadlineExceeded):
            c.encode(
                noise, audio=pcm, sample_rate=48000, path="stopped.mp4", timeout=DEADLINE_S, **SLOW
            )
        assert_stopped(c, time.monotonic())
    assert [p.name for p in d.output_dir.rglob("*") if p.is_file()] == []


def test_a_stream_stops_in_the_drain(make_daemon: Callable[..., Daemon], noise: np.ndarray) -> None:
    """A stream drains once it is closed; its deadline passes meanwhile."""
    d = slow_daemon(make_daemon)
    with d.client() as c:
        with pytest.raises(DeadlineExceeded), c.stream(fps=24, timeout=DEADLINE_S, **SLOW) as s:
            for start in range(0, FRAMES, 50):
                s.write(noise[start : start + 50])
        assert_stopped(c, time.monotonic())


def encoder_pids(daemon: Daemon) -> list[int]:
    """Pids of the daemon's encoder processes (their command line names its slabs)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"sidecar.pipeline.processes.main" in argv and any(
                daemon.prefix.encode() in a for a in argv
            ):
                pids.append(int(entry.name))
    return pids


def in_processes(c: Any) -> None:
    """Encodes small clips until the encoder processes take them."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        c.encode(moving_pattern(4, 64, 96))
        if c.status().counters["process_encodes"] >= 3:
            return
    raise AssertionError("no encode went to an encoder process")


def a_process_takes_the_next(c: Any) -> None:
    before = c.status().counters["process_encodes"]
    assert wait_for(
        lambda: (
            c.encode(moving_pattern(4, 64, 96)).frames == 4
            and c.status().counters["process_encodes"] > before
        ),
        timeout=20,
    )


def test_an_encoder_process_stops_in_the_drain(
    make_daemon: Callable[..., Daemon], noise: np.ndarray
) -> None:
    """An MP4 without audio goes to an encoder process: told to stop, it looks for the
    Stop between the drain's packets too, and then serves the next request."""
    d = slow_daemon(make_daemon, encoder_processes=1)
    seen: list[int] = []
    with d.client() as c:
        in_processes(c)
        with pytest.raises(DeadlineExceeded):
            c.encode(
                noise, timeout=DEADLINE_S, on_progress=lambda done, _: seen.append(done), **SLOW
            )
        assert_stopped(c, time.monotonic())
        assert seen and seen[-1] == FRAMES  # every frame was in: the drain had begun
        a_process_takes_the_next(c)


def test_a_process_that_does_not_stop_is_killed_within_a_second(
    make_daemon: Callable[..., Daemon], noise: np.ndarray
) -> None:
    """A process that does not answer the Stop (here SIGSTOPped: to the daemon, the same
    as one inside a long encoder call) is killed `STOP_GRACE_S` after it was told; only the
    cancelled request is lost, and another process takes the next."""
    d = make_daemon(encoder_processes=1, max_concurrent_encodes=1)
    with d.client() as c:
        in_processes(c)
        (pid,) = encoder_pids(d)
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(DeadlineExceeded):
                c.encode(noise[:30], timeout=1.0)
            assert_stopped(c, time.monotonic())
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        assert f"did not stop within {STOP_GRACE_S:.1f} s" in d.log()
        assert wait_for(lambda: encoder_pids(d) not in ([], [pid]), timeout=20)
        a_process_takes_the_next(c)


# -- the ceiling on encoder cost -----------------------------------------------------------


def refused(spec: CodecSpec, container: str = "mp4", **ceiling: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        spec.resolve(container, CostCeiling(**ceiling))
    return caught.value


def test_the_ceiling_refuses_slower_presets_naming_the_flag() -> None:
    error = refused(CodecSpec(preset="placebo"))
    assert error.field == "codec.preset"
    assert "--max-preset" in str(error) and "veryslow" in str(error)
    CodecSpec(preset="veryslow").resolve("mp4", CostCeiling())  # the default's top rung
    CodecSpec(preset="placebo").resolve("mp4", CostCeiling(max_preset="placebo"))
    assert refused(CodecSpec("h265", preset="slow"), max_preset="medium").field == "codec.preset"
    # SVT-AV1's research presets and VP9's best deadline count as placebo.
    assert refused(CodecSpec("av1", preset="1")).field == "codec.preset"
    CodecSpec("av1", preset="2").resolve("mp4", CostCeiling())
    assert refused(CodecSpec("vp9", preset="best"), "webm").field == "codec.preset"
    CodecSpec("vp9", preset="good").resolve("webm", CostCeiling())
    # Without a ceiling (a library caller, not the daemon): only the allow-list.
    CodecSpec(preset="placebo").resolve()


@pytest.mark.parametrize(
    ("codec", "extra", "field"),
    [
        ("h264", {"rc-lookahead": "61"}, "codec.extra[rc-lookahead]"),
        ("h264", {"x264-params": "rc-lookahead=250"}, "codec.extra[x264-params].rc-lookahead"),
        ("h265", {"x265-params": "rc-lookahead=61"}, "codec.extra[x265-params].rc-lookahead"),
        ("av1", {"svtav1-params": "lookahead=120"}, "codec.extra[svtav1-params].lookahead"),
    ],
)
def test_the_ceiling_refuses_longer_lookaheads(
    codec: str, extra: dict[str, str], field: str
) -> None:
    spec = CodecSpec(codec, extra=tuple(extra.items()))
    error = refused(spec)
    assert error.field == field
    assert "--max-lookahead" in str(error) and "60" in str(error)
    spec.resolve("mp4", CostCeiling(max_lookahead=250))


def test_the_ceiling_takes_what_is_under_it() -> None:
    extra = (("rc-lookahead", "60"), ("x264-params", "rc-lookahead=40:bframes=3"))
    CodecSpec(preset="slow", extra=extra).resolve("mp4", CostCeiling())
    vp9 = CodecSpec("vp9", extra=(("lag-in-frames", "25"),))
    vp9.resolve("webm", CostCeiling())
    assert refused(vp9, "webm", max_lookahead=10).field == "codec.extra[lag-in-frames]"


def test_the_ceiling_settings_are_flags_and_checked() -> None:
    parser = argparse.ArgumentParser()
    Config.add_arguments(parser)
    config = Config.load(parser.parse_args(["--max-preset", "Placebo"]), {})
    assert (config.max_preset, config.max_lookahead) == ("placebo", 60)
    env = {Config.env_name("max_lookahead"): "250"}
    assert Config.load(parser.parse_args([]), env).max_lookahead == 250
    with pytest.raises(ValueError, match="VIDEO_SIDECAR_MAX_PRESET"):
        Config.load(parser.parse_args([]), {Config.env_name("max_preset"): "warp"})
    with pytest.raises(ValueError, match="VIDEO_SIDECAR_MAX_LOOKAHEAD"):
        Config.load(parser.parse_args([]), {Config.env_name("max_lookahead"): "251"})
    assert parse_max_preset(" veryfast ") == "veryfast"
    assert parse_max_lookahead("0") == 0
    with pytest.raises(ValueError):
        CostCeiling(max_lookahead=-1)


def test_the_daemon_refuses_over_its_ceiling_and_keeps_serving(
    make_daemon: Callable[..., Daemon],
) -> None:
    """Refused before anything is taken: the client's leases stay its own."""
    d = make_daemon()
    clip = moving_pattern(4, 64, 96)
    with d.client() as c:
        with pytest.raises(InvalidArgument, match=r"codec\.preset.*--max-preset"):
            c.encode(clip, preset="placebo")
        with pytest.raises(InvalidArgument, match=r"rc-lookahead.*--max-lookahead"):
            c.encode(clip, extra={"x264-params": "rc-lookahead=250"})
        assert c.encode(clip, preset="veryslow").frames == 4
        assert c.status().pool["active_leases"] <= 1
    raised = make_daemon(max_preset="placebo")
    with raised.client() as c:
        assert c.encode(clip, preset="placebo").frames == 4
