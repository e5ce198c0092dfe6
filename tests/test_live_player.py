"""A live package played in headless Chromium, against the real daemon: while the stream
that makes it is still open, then finished, to its end. Chromium's own HLS player, and
hls.js (vendored: tests/data/hls.js-1.7.4/), each from a local HTTP server of the output
root, as a static server or CDN serves it."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from client import Live

from .helpers import Daemon
from .live_helpers import CHROMIUM, FPS, NO_CHROMIUM, PALETTE, Viewers, check_colours, palette_video

# Plays or stops against the clock: alone under xdist (see conftest).
pytestmark = pytest.mark.exclusive

RATE = 48000


def watch(daemon: Daemon, player: str, name: str, audio: bool = False) -> dict[str, Any]:
    """Stream PALETTE's seconds about in real time into a package `name`; a page with
    `player` opens the playlist as soon as it exists and must see the video advance
    before the stream closes. Then a fresh page plays the finished package: its report
    at `ended` (duration, colours seen, audio bytes decoded). With `audio`, a tone goes
    with the stream's opening and the page plays the multivariant playlist."""
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    video = palette_video(96, 128)
    root = daemon.output_dir
    live = Live(name, segment_s=1, part_s=0.25)
    source = live.multivariant_playlist if audio else live.playlist
    stream: dict[str, Any] = {}
    if audio:
        t = np.arange(len(video) * RATE // FPS) / RATE
        tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        stream = {"audio": tone, "sample_rate": RATE}
    viewers = Viewers(root, player, source)
    try:
        with daemon.client() as c, c.stream(fps=FPS, live=live, **stream) as s:
            for start in range(0, len(video), 6):  # about real time: a quarter second a chunk
                s.write(video[start : start + 6])
                time.sleep(0.25)
                if not viewers.pages and (root / source).exists():
                    viewers.open_page()  # a viewer comes as soon as there is something to watch
            watching = viewers.reports.get(timeout=30)
            assert watching["what"] == "advancing", watching  # while the stream is open
        time.sleep(1)  # the live page goes on past the stream's end, without an error
        while not viewers.reports.empty():
            got = viewers.reports.get()
            assert got["what"] != "error", (name, got["message"], got["t"], got["d"])
        viewers.close_pages()
        viewers.open_page()  # the finished package, as a later viewer sees it
        last = viewers.report(timeout=60)
        assert last["what"] == "ended", {k: v for k, v in last.items() if k != "seen"}
        assert last["d"] == pytest.approx(len(PALETTE), abs=1.5 / FPS)
        assert check_colours(last["seen"]) >= 3
        return last
    finally:
        viewers.close()


def test_chromiums_own_player_watches_the_stream_while_it_is_made(daemon: Daemon) -> None:
    """Chromium's own HLS player (no script library) plays the playlist while the stream
    is still open; the finished package plays to its end: the duration is the video's,
    and each second shows that second's colour."""
    watch(daemon, "native", "native")


def test_hls_js_watches_the_stream_while_it_is_made(daemon: Daemon) -> None:
    """hls.js in low-latency mode, over Chromium's Media Source Extensions: the same."""
    assert watch(daemon, "hls.js", "hlsjs")["audio"] == 0


def test_hls_js_plays_the_audio_rendition_with_the_video(daemon: Daemon) -> None:
    """With audio: hls.js plays the multivariant playlist, video and audio renditions
    together, live and then to the end, decoding the audio."""
    assert watch(daemon, "hls.js", "hlsjs-audio", audio=True)["audio"] > 0
