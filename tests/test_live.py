"""A live LL-HLS/CMAF package, against the real daemon: written as a stream's chunks come,
whole before any playlist names it, closed with ENDLIST, refused where it cannot be."""

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
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import m3u8
import numpy as np
import pytest

from client import AlreadyExists, InvalidArgument, Live
from client.patterns import moving_pattern

from .helpers import Daemon, decode

FPS = 24


def playlist(folder: Path) -> m3u8.M3U8 | None:
    path = folder / "index.m3u8"
    return m3u8.loads(path.read_text()) if path.exists() else None


def check_named_files_are_whole(folder: Path, seen: dict[str, bytes]) -> int:
    """Every file the playlist names exists, and never changes once named; how many
    parts it names."""
    text = (folder / "index.m3u8").read_text()
    named = [line.split('URI="')[1].split('"')[0] for line in text.splitlines() if 'URI="' in line]
    named += [line for line in text.splitlines() if line and not line.startswith("#")]
    for name in named:
        data = (folder / name).read_bytes()
        assert seen.setdefault(name, data) == data, f"{name} changed after it was named"
    return text.count("#EXT-X-PART:")


def check_rules(pl: m3u8.M3U8, frames: int, segment_s: float, part_s: float) -> None:
    """The playlist tags' rules (RFC 8216bis) that a player counts on."""
    assert pl.media_sequence == 0
    assert pl.is_endlist
    assert pl.part_inf is not None and math.isclose(pl.part_inf.part_target, part_s)
    assert pl.server_control.part_hold_back >= 2 * pl.part_inf.part_target
    assert all(round(s.duration) <= pl.target_duration for s in pl.segments)
    assert pl.target_duration == math.ceil(segment_s)
    assert math.isclose(sum(s.duration for s in pl.segments), frames / FPS, abs_tol=1e-3)
    assert pl.segment_map and pl.segment_map[0].uri == "init.mp4"


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


def test_a_stream_is_watchable_while_it_is_made(daemon: Daemon) -> None:
    folder = daemon.output_dir / "watch"
    seen: dict[str, bytes] = {}
    parts_while_open = 0
    video = moving_pattern(108, 96, 128)
    chunks = [video[i : i + 12] for i in range(0, 108, 12)]
    live = Live("watch", segment_s=1, part_s=0.5)  # first named with 3 s of segments
    with daemon.client() as c, c.stream(fps=FPS, path="watch.mp4", live=live) as s:
        for chunk in chunks:
            s.write(chunk)
            time.sleep(0.15)  # a generator between chunks
            if (folder / "index.m3u8").exists():
                parts_while_open = check_named_files_are_whole(folder, seen)
                pl = playlist(folder)
                assert pl is not None and not pl.is_endlist
    assert parts_while_open >= 2, "parts appeared while the stream was open"
    result = s.result
    assert result.frames == 108
    pl = playlist(folder)
    assert pl is not None
    check_rules(pl, 108, 1.0, 0.5)
    assert [s.duration for s in pl.segments if s.uri] == [1.0, 1.0, 1.0, 1.0, 0.5]
    check_named_files_are_whole(folder, seen)
    if shutil.which("ffprobe"):
        assert probe_frames(folder / "index.m3u8") == 108
    # One encode: the package and the MP4 hold the same pictures, bit for bit.
    mp4 = decode(daemon.output_dir / "watch.mp4")[0]
    assert np.array_equal(package_frames(folder), mp4)
    with av.open(str(daemon.output_dir / "watch.mp4")) as container:
        base = container.streams.video[0].time_base
        keyframes = [round(p.pts * base * FPS) for p in container.demux(video=0) if p.is_keyframe]
    assert keyframes == [0, 24, 48, 72, 96]  # a keyframe a segment, and only there


def test_a_part_is_named_as_its_last_packet_leaves_the_encoder(tmp_path: Path) -> None:
    """The encoder the daemon runs, with its package: when the packet that completes a
    part comes out of the encoder, the part is in the playlist before `encode()` returns,
    not when later frames come; a part's file is whole before it is named."""
    from sidecar.codec.catalogue import CodecSpec
    from sidecar.codec.encoder import VideoEncoder
    from sidecar.codec.frames import Limits, check_geometry
    from sidecar.pipeline.output.live import LiveLayout, LivePackage

    geometry = check_geometry(64, 48, "rgb24", Fraction(FPS), Limits(1000, 4096, 4096, 1 << 34))
    package = LivePackage(LiveLayout(tmp_path, Fraction(FPS), 24, 6, 1 << 30))
    codec = CodecSpec().resolve().for_live(24)
    encoder = VideoEncoder(str(tmp_path / "v.mp4"), geometry, codec, 1, live=package)
    named_after: list[int] = []
    for index, frame in enumerate(moving_pattern(120, 48, 64)):
        before = package.parts_written
        encoder.encode(frame)
        if package.parts_written > before and (tmp_path / "index.m3u8").exists():
            text = (tmp_path / "index.m3u8").read_text()
            segment, part = divmod(package.parts_written - 1, 4)
            assert f"s{segment:05d}.p{part}.m4s" in text or f"s{segment:05d}.m4s" in text
            named_after.append(index)
    encoder.close()
    assert named_after, "parts were named while frames still came"
    assert playlist(tmp_path).is_endlist  # type: ignore[union-attr]


def test_a_whole_video_gets_a_package_beside_its_bytes(daemon: Daemon) -> None:
    video = moving_pattern(60, 96, 128)
    with daemon.client() as c:
        result = c.encode(video, live=Live("whole", segment_s=1, part_s=0.5))
    pl = playlist(daemon.output_dir / "whole")
    assert pl is not None
    check_rules(pl, 60, 1.0, 0.5)
    assert np.array_equal(package_frames(daemon.output_dir / "whole"), decode(result.data)[0])


def test_a_stopped_stream_closes_its_package_shorter(daemon: Daemon) -> None:
    folder = daemon.output_dir / "stopped"
    with daemon.client() as c:
        with (
            pytest.raises(RuntimeError, match="generator broke"),
            c.stream(fps=FPS, path="stopped.mp4", live=Live("stopped", segment_s=1)) as s,
        ):
            s.write(moving_pattern(120, 64, 64))
            deadline = time.monotonic() + 10
            while (pl := playlist(folder)) is None or not pl.segments[0].uri:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            raise RuntimeError("generator broke")
        deadline = time.monotonic() + 10
        while not ((pl := playlist(folder)) is not None and pl.is_endlist):
            assert time.monotonic() < deadline, "the package was not closed"
            time.sleep(0.02)
    assert len(pl.segments) >= 1, pl.dumps()
    assert not (daemon.output_dir / "stopped.mp4").exists()  # the MP4 is all or nothing
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    frames = package_frames(folder)
    assert 72 <= len(frames) <= 120, pl.dumps()


@pytest.mark.parametrize(
    ("live", "codec", "error", "words"),
    [
        (Live("bad", part_s=1.5), "", InvalidArgument, "at most half a segment"),
        (Live("bad", segment_s=0.5), "", InvalidArgument, "1-10 seconds"),
        (Live("bad", part_s=5), "", InvalidArgument, "0.1-2 seconds"),
        (Live("../out"), "", InvalidArgument, "'..'"),
        (Live("/etc/x"), "", InvalidArgument, "outside the output root"),
        (Live("vp9"), "vp9", InvalidArgument, "H.264"),
    ],
)
def test_what_cannot_be_packaged_is_refused(
    daemon: Daemon, live: Live, codec: str, error: type[Exception], words: str
) -> None:
    with daemon.client() as c, pytest.raises(error, match=words) as info:
        c.encode(moving_pattern(4, 64, 64), live=live, codec=codec, container=codec and "webm")
    assert getattr(info.value, "field", "live").startswith("live")


def test_a_package_is_not_replaced_unless_asked(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.encode(moving_pattern(4, 64, 64), live="again")
        with pytest.raises(AlreadyExists, match="holds a package"):
            c.encode(moving_pattern(4, 64, 64), live="again")
        c.encode(moving_pattern(30, 64, 64), live=Live("again", overwrite=True))
    pl = playlist(daemon.output_dir / "again")
    assert pl is not None and math.isclose(sum(s.duration for s in pl.segments), 30 / FPS)


def test_raw_live_fields_are_answered(daemon: Daemon) -> None:
    """The new fields as any client may send them, on gRPC and the framed socket: a
    clear answer each time, never INTERNAL, nothing written outside the root."""
    import grpc
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from sidecar.api.v1 import sidecar_pb2 as pb
    from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

    from .helpers import RawFramed

    channel = grpc.insecure_channel(f"unix:{daemon.socket}")
    stub = pb_grpc.VideoSidecarStub(channel)
    token = stub.Attach(pb.AttachRequest(client_name="fuzz")).client_token
    codes: dict[str, int] = {}
    before = set(Path(daemon.output_dir).parent.iterdir())

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        folder=st.one_of(
            st.text(max_size=40), st.binary(max_size=20).map(lambda b: b.decode("latin-1"))
        ),
        segment=st.floats(allow_nan=True, allow_infinity=True),
        part=st.floats(allow_nan=True, allow_infinity=True),
        framed=st.booleans(),
    )
    def ask(folder: str, segment: float, part: float, framed: bool) -> None:
        lease = stub.Lease(pb.LeaseRequest(client_token=token, size=64 * 64 * 3, wait_ms=5000))
        request = pb.EncodeRequest(
            client_token=token,
            video=pb.VideoDescriptor(
                width=64, height=64, pixel_format=pb.PIXEL_FORMAT_RGB24,
                fps=pb.Rational(num=24, den=1),
                ranges=[pb.FrameRange(lease_id=lease.lease_id, frame_count=1)],
            ),
            live=pb.LivePackage(folder=folder, segment_s=segment, part_s=part, overwrite=True),
        )  # fmt: skip
        if framed:
            conn = RawFramed(f"{daemon.socket}.framed")
            conn.send(pb.FramedRequest(encode=request).SerializeToString())
            reply = conn.reply()
            conn.close()
            assert reply is not None
            code = str(reply.error.code) if reply.HasField("error") else "OK"
        else:
            try:
                list(stub.Encode(request, timeout=30))
                code = "OK"
            except grpc.RpcError as err:
                code = err.code().name
        assert code not in ("INTERNAL", "UNKNOWN", "2", "13"), (folder, segment, part)
        codes[code] = codes.get(code, 0) + 1
        with contextlib.suppress(grpc.RpcError):
            stub.Release(pb.ReleaseRequest(client_token=token, lease_id=lease.lease_id))

    ask()
    channel.close()
    assert set(Path(daemon.output_dir).parent.iterdir()) == before  # nothing beside the root
    assert len(codes) >= 2, codes


def test_the_package_plays_from_the_playlist_with_pyav(daemon: Daemon) -> None:
    """FFmpeg's own HLS demuxer reads the finished package: the frame count and time."""
    with daemon.client() as c:
        c.encode(moving_pattern(50, 64, 96), live="hls")
    with av.open(str(daemon.output_dir / "hls" / "index.m3u8")) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == 50
    # B-frames: the fragments' negative composition offsets (CMAF's trun version 1) put
    # the first frame at 0 for a browser; FFmpeg's demuxer shifts the whole video by the
    # encoder's delay instead (two frames here). The frames are evenly spaced either way.
    first, last = float(frames[0].time), float(frames[-1].time)
    assert 0 <= first <= 2 / FPS + 1e-3
    assert last - first == pytest.approx(49 / FPS, abs=1e-3)


PAGE = """<!doctype html><html><body><video id=v muted playsinline></video>
<canvas id=c width=16 height=16></canvas><script>
const v = document.getElementById('v'), c = document.getElementById('c').getContext('2d');
const report = (what, extra) => fetch('/report', {method: 'POST', body: JSON.stringify(
  Object.assign({what, t: v.currentTime, d: v.duration}, extra || {}))});
const seen = [];
let advancing = false;
v.src = 'PLAYLIST';
v.ontimeupdate = () => {
  if (v.currentTime > 0.5 && !advancing) { advancing = true; report('advancing'); }
  c.drawImage(v, 0, 0, 16, 16);
  const p = c.getImageData(8, 8, 1, 1).data;
  seen.push([v.currentTime, p[0], p[1], p[2]]);
};
v.onended = () => report('ended', {seen});
v.onerror = () => report('error', {message: v.error && v.error.message});
v.play().catch(e => report('error', {message: String(e)}));
</script></body></html>"""

PALETTE = [
    (230, 40, 40), (40, 200, 60), (40, 80, 230), (230, 220, 40),
    (200, 40, 200), (40, 220, 220), (240, 240, 240), (120, 60, 20),
]  # fmt: skip


def test_a_browser_watches_the_stream_while_it_is_made(daemon: Daemon) -> None:
    """Chromium's own HLS player (no script library) plays the playlist while the stream
    is still open; the finished package plays to its end: the duration is the video's,
    and each second shows that second's colour."""
    chromium = next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
    )
    if chromium is None:
        pytest.skip("needs Chromium (Debian: apt-get install chromium)")
    seconds = len(PALETTE)
    video = np.empty((seconds * FPS, 96, 128, 3), np.uint8)
    for i in range(len(video)):
        video[i] = PALETTE[i // FPS]
    reports: queue.Queue[dict[str, Any]] = queue.Queue()
    root = daemon.output_dir

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            if self.path == "/page.html":
                body = PAGE.replace("PLAYLIST", "browser/index.m3u8").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        def end_headers(self) -> None:
            self.send_header("Cache-Control", "no-cache")  # a live playlist is re-read
            super().end_headers()

        def do_POST(self) -> None:
            reports.put(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/page.html"
    browsers: list[tuple[subprocess.Popen[bytes], str]] = []

    def open_page() -> None:
        profile = tempfile.mkdtemp(prefix="vsd-chromium-")
        process = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={profile}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        browsers.append((process, profile))

    def close_pages() -> None:
        while browsers:
            process, profile = browsers.pop()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
            shutil.rmtree(profile, ignore_errors=True)

    try:
        live = Live("browser", segment_s=1, part_s=0.25)
        with daemon.client() as c, c.stream(fps=FPS, live=live) as s:
            for start in range(0, len(video), 6):  # about real time: a quarter second a chunk
                s.write(video[start : start + 6])
                time.sleep(0.25)
                if not browsers and (root / "browser" / "index.m3u8").exists():
                    open_page()  # a viewer comes as soon as there is something to watch
            watching = reports.get(timeout=30)
            assert watching["what"] == "advancing", watching  # while the stream is open
        close_pages()
        open_page()  # the finished package, as a later viewer sees it
        last = reports.get(timeout=60)
        if last["what"] == "advancing":
            last = reports.get(timeout=60)
        assert last["what"] == "ended", last
        assert last["d"] == pytest.approx(seconds, abs=0.05)
        checked = 0
        for t, *rgb in last["seen"]:
            second, into = divmod(t, 1.0)
            if 0.2 < into < 0.8 and int(second) < seconds:
                assert np.abs(np.array(rgb) - PALETTE[int(second)]).max() < 40, (t, rgb)
                checked += 1
        assert checked >= 3
    finally:
        close_pages()
        server.shutdown()
        server.server_close()


def test_the_cli_writes_a_package(daemon: Daemon, tmp_path: Path) -> None:
    from .helpers import daemon_command

    source = tmp_path / "v.npy"
    np.save(source, moving_pattern(30, 64, 64))
    args = ["encode", str(source), "-o", str(tmp_path / "v.mp4"), "--socket", daemon.socket]
    args += ["--live", "cli", "--live-segment", "1", "--live-part", "0.25"]
    done = subprocess.run([*daemon_command(), *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    pl = playlist(daemon.output_dir / "cli")
    assert pl is not None
    check_rules(pl, 30, 1.0, 0.25)
    assert len(decode(tmp_path / "v.mp4")[0]) == 30


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Live(3), "live.folder"),  # type: ignore[arg-type]
        (lambda: Live("x", segment_s="2"), "live.segment_s"),  # type: ignore[arg-type]
        (lambda: Live("x", part_s=float("nan")), "live.part_s"),
        (lambda: Live("x", overwrite=1), "live.overwrite"),  # type: ignore[arg-type]
    ],
)
def test_live_checks_its_own_types(make: Any, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        make()


def test_live_takes_a_folder_or_a_live(daemon: Daemon) -> None:
    with daemon.client() as c, pytest.raises(InvalidArgument, match="a folder or a Live"):
        c.encode(moving_pattern(2, 32, 32), live=5)  # type: ignore[arg-type]
    with daemon.client() as c:
        c.encode(moving_pattern(2, 32, 32), live=Path("as-path"))
    assert playlist(daemon.output_dir / "as-path") is not None
