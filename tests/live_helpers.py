"""What the live package's tests share: reading a package as a viewer does (its playlists
with the `m3u8` parser, its files, its frames), and headless Chromium pages that play it
from a local HTTP server, with Chromium's own HLS player or the vendored hls.js."""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .helpers import decode

# A test dependency (the `test` extra); a host without it (the GPU machine's bare Python)
# skips the live tests instead of failing to collect them.
m3u8 = pytest.importorskip("m3u8")

FPS = 24
# hls.js, vendored (tests/data/hls.js-1.7.4/README.md): nothing is fetched at run time.
HLS_JS = Path(__file__).resolve().parent / "data" / "hls.js-1.7.4" / "hls.min.js"
CHROMIUM = next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
)
NO_CHROMIUM = "needs Chromium (Debian: apt-get install chromium)"
PALETTE = [
    (230, 40, 40), (40, 200, 60), (40, 80, 230), (230, 220, 40),
    (200, 40, 200), (40, 220, 220), (240, 240, 240), (120, 60, 20),
]  # fmt: skip


def playlist(folder: Path, name: str = "index.m3u8") -> m3u8.M3U8 | None:
    path = folder / name
    return m3u8.loads(path.read_text()) if path.exists() else None


def check_named_files_are_whole(
    folder: Path, seen: dict[str, bytes], name: str = "index.m3u8"
) -> int:
    """Every file the playlist names exists, and never changes once named; how many
    parts it names."""
    text = (folder / name).read_text()
    named = [line.split('URI="')[1].split('"')[0] for line in text.splitlines() if 'URI="' in line]
    named += [line for line in text.splitlines() if line and not line.startswith("#")]
    for file in named:
        data = (folder / file).read_bytes()
        assert seen.setdefault(file, data) == data, f"{file} changed after it was named"
    return text.count("#EXT-X-PART:")


def check_rules(
    pl: m3u8.M3U8,
    frames: int,
    segment_s: float,
    part_s: float,
    init: str = "init.mp4",
    slack: float = 1e-3,
) -> None:
    """The playlist tags' rules (RFC 8216bis) that a player counts on."""
    assert pl.media_sequence == 0
    assert pl.is_endlist
    assert pl.part_inf is not None and math.isclose(pl.part_inf.part_target, part_s, abs_tol=1e-5)
    assert pl.server_control.part_hold_back >= 2 * pl.part_inf.part_target
    assert all(round(s.duration) <= pl.target_duration for s in pl.segments)
    assert all(p.duration <= pl.part_inf.part_target + slack for s in pl.segments for p in s.parts)
    assert pl.target_duration == math.ceil(segment_s)
    assert math.isclose(sum(s.duration for s in pl.segments), frames / FPS, abs_tol=slack)
    assert pl.segment_map and pl.segment_map[0].uri == init


def probe_frames(path: Path) -> int:
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0",
         "-show_entries", "stream=nb_read_frames", "-of", "csv=p=0", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return int(out.split()[0].strip(","))  # the stream, then the HLS program's copy


def package_frames(folder: Path) -> np.ndarray:
    """The package decoded as a player would: the init, then each segment in order."""
    pl = playlist(folder)
    assert pl is not None
    data = (folder / "init.mp4").read_bytes()
    data += b"".join((folder / s.uri).read_bytes() for s in pl.segments)
    return decode(data)[0]


def palette_video(height: int, width: int) -> np.ndarray:
    """A second of each PALETTE colour, at FPS."""
    video = np.empty((len(PALETTE) * FPS, height, width, 3), np.uint8)
    for i in range(len(video)):
        video[i] = PALETTE[i // FPS]
    return video


def check_colours(seen: list[list[float]]) -> int:
    """Each (time, r, g, b) a page saw well inside a second shows that second's colour;
    how many were checked."""
    checked = 0
    for t, *rgb in seen:
        second, into = divmod(t, 1.0)
        if 0.2 < into < 0.8 and int(second) < len(PALETTE):
            assert np.abs(np.array(rgb) - PALETTE[int(second)]).max() < 40, (t, rgb)
            checked += 1
    return checked


PAGE = """<!doctype html><html><body><video id=v playsinline></video>
<canvas id=c width=16 height=16></canvas>HEAD<script>
const v = document.getElementById('v'), c = document.getElementById('c').getContext('2d');
const report = (what, extra) => fetch('/report', {method: 'POST', body: JSON.stringify(
  Object.assign({what, t: v.currentTime, d: v.duration,
                 audio: v.webkitAudioDecodedByteCount}, extra || {}))});
const seen = [];
let advancing = false;
v.ontimeupdate = () => {
  if (v.currentTime > 0.5 && !advancing) { advancing = true; report('advancing'); }
  c.drawImage(v, 0, 0, 16, 16);
  const p = c.getImageData(8, 8, 1, 1).data;
  seen.push([v.currentTime, p[0], p[1], p[2]]);
};
v.onended = () => report('ended', {seen});
v.onerror = () => report('error', {message: v.error && v.error.message});
PLAYER
v.play().catch(e => report('error', {message: String(e)}));
</script></body></html>"""

PLAYERS = {
    # Chromium's own HLS player: no script library.
    "native": ("", "v.src = 'PLAYLIST';"),
    "hls.js": (
        "<script src='/vendor/hls.min.js'></script>",
        """const hls = new Hls({lowLatencyMode: true});
hls.on(Hls.Events.ERROR, (e, data) => {
  if (data.fatal) report('error', {message: data.type + ': ' + data.details + ': ' +
                                   (data.error ? data.error.message : data.reason)}); });
hls.loadSource('PLAYLIST');
hls.attachMedia(v);""",
    ),
}

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--no-first-run", "--disable-background-networking", "--disable-component-update",
    "--autoplay-policy=no-user-gesture-required", "--disable-background-media-suspend",
    "--disable-renderer-backgrounding", "--disable-background-timer-throttling",
)  # fmt: skip


class Viewers:
    """An HTTP server of the daemon's output root (as a static server or CDN would serve
    it), plus a player page and hls.js; headless Chromium pages that open the page and
    post what they saw (`reports`)."""

    def __init__(self, root: Path, player: str, source: str) -> None:
        assert CHROMIUM is not None
        self.chromium = CHROMIUM
        head, script = PLAYERS[player]
        page = PAGE.replace("HEAD", head).replace("PLAYER", script.replace("PLAYLIST", source))
        self.reports: queue.Queue[dict[str, Any]] = queue.Queue()
        self.pages: list[tuple[subprocess.Popen[bytes], str]] = []
        reports = self.reports

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self) -> None:
                served = {
                    "/page.html": (page.encode(), "text/html"),
                    "/vendor/hls.min.js": (HLS_JS.read_bytes(), "text/javascript"),
                }
                if self.path not in served:
                    super().do_GET()
                    return
                body, kind = served[self.path]
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def end_headers(self) -> None:
                self.send_header("Cache-Control", "no-cache")  # a live playlist is re-read
                super().end_headers()

            def do_POST(self) -> None:
                reports.put(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/page.html"

    def open_page(self) -> None:
        profile = tempfile.mkdtemp(prefix="vsd-chromium-")
        process = subprocess.Popen(
            [self.chromium, *FLAGS, f"--user-data-dir={profile}", self.url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.pages.append((process, profile))

    def close_pages(self) -> None:
        while self.pages:
            process, profile = self.pages.pop()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
            shutil.rmtree(profile, ignore_errors=True)

    def report(self, timeout: float, skip: str = "advancing") -> dict[str, Any]:
        """The next report other than `skip`."""
        while (got := self.reports.get(timeout=timeout))["what"] == skip:
            pass
        return got

    def close(self) -> None:
        self.close_pages()
        self.server.shutdown()
        self.server.server_close()
