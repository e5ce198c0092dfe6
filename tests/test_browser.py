"""Every container the daemon writes, played by a real headless Chromium.

The daemon (a real one, driven over raw gRPC) encodes MP4, fragmented MP4 and WebM, with
and without audio; a page in Chromium plays each to its end. Whole files are played from
blob URLs; fragmented MP4 goes through Media Source Extensions, each `OutputChunk` the
daemon streams back appended to a `SourceBuffer` as it arrives, while the encode is still
running. The page reports what the browser saw (errors, duration, size, decoded frames,
audio tracks and decoded audio bytes, and where a tone burst starts when WebAudio decodes
the file) and the assertions are made here.

No driver library: Chromium opens a runner page served by a stdlib HTTP server on
127.0.0.1, which long-polls the server for jobs and posts each job's report back. Where no
Chromium is installed (Debian: `apt-get install chromium`) the browser tests skip; the
last test, which checks the fragmented MP4's edit lists with PyAV, runs anyway.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import av
import grpc
import numpy as np
import pytest

from client.patterns import moving_pattern
from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc

from .helpers import Daemon, psnr

# Plays or stops against the clock: alone under xdist (see conftest).
pytestmark = pytest.mark.exclusive

CHROMIUM = next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
)

FPS = 24
RATE = 48000
TONE_AT, TONE_LENGTH = 0.5, 0.25  # a 1 kHz burst, so the audio's start can be timed
AAC_PRIMING = 1024  # samples FFmpeg's AAC encoder puts ahead of the input
JOB_TIMEOUT_S = 60.0
CONTAINERS = {
    "mp4": pb.CONTAINER_MP4,
    "fmp4": pb.CONTAINER_FRAGMENTED_MP4,
    "webm": pb.CONTAINER_WEBM,
}


# -- what the daemon makes -----------------------------------------------------------------


def pattern(frames: int, height: int, width: int) -> np.ndarray:
    """Moving RGB gradients, (frames, height, width, 3) uint8."""
    t = np.arange(frames)[:, None, None]
    y = np.arange(height)[None, :, None]
    x = np.arange(width)[None, None, :]
    base = ((x + 2 * y + 8 * t) % 256).astype(np.uint8)
    return np.stack([base, np.roll(base, 17, axis=2), 255 - base], axis=-1)


def tone_burst(seconds: float) -> np.ndarray:
    """Mono f32 PCM: silence with a 1 kHz burst at TONE_AT (if the clip is that long)."""
    t = np.arange(round(seconds * RATE)) / RATE
    on = (t >= TONE_AT) & (t < TONE_AT + TONE_LENGTH)
    return np.where(on, 0.5 * np.sin(2 * np.pi * 1000 * t), 0.0).astype(np.float32)[:, None]


@dataclass
class Output:
    chunks: list[bytes] = field(default_factory=list)  # the OutputChunk payloads, in order
    result: Any = None

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


def encode(
    stub: pb_grpc.VideoSidecarStub,
    token: str,
    container: str,
    video: np.ndarray,
    audio: np.ndarray | None,
    *,
    pace_s: float = 0.0,
    codec: pb.CodecOptions | None = None,
    late_audio: bool = False,
    on_chunk: Callable[[bytes], object] | None = None,
    previews: pb.Previews | None = None,
) -> Output:
    """One EncodeStream with inline frames (6 a message, `pace_s` apart) and inline audio,
    sent with the header or (`late_audio`) with the end; `on_chunk` sees each OutputChunk's
    bytes as the daemon sends it."""
    height, width = video.shape[1:3]
    header = pb.StreamHeader(
        client_token=token,
        width=width,
        height=height,
        pixel_format=pb.PIXEL_FORMAT_RGB24,
        fps=pb.Rational(num=FPS, den=1),
        codec=codec,
        output=pb.OutputSpec(bytes=pb.BytesOutput(), container=CONTAINERS[container]),
        previews=previews,
    )
    if audio is not None:
        header.audio.CopyFrom(
            pb.AudioSpec(sample_rate=RATE, channels=1, sample_format=pb.SAMPLE_FORMAT_F32)
        )
    samples = [] if audio is None else [pb.AudioData(inline=audio.tobytes())]
    if not late_audio:
        header.audio_data.extend(samples)

    def requests() -> Iterator[pb.StreamRequest]:
        yield pb.StreamRequest(header=header)
        for start in range(0, len(video), 6):
            if start and pace_s:
                time.sleep(pace_s)
            yield pb.StreamRequest(chunk=pb.StreamChunk(inline=video[start : start + 6].tobytes()))
        yield pb.StreamRequest(end=pb.StreamEnd(audio_data=samples if late_audio else []))

    out = Output()
    for event in stub.EncodeStream(requests(), timeout=120):
        if event.HasField("chunk"):
            assert event.chunk.offset == sum(map(len, out.chunks))
            out.chunks.append(event.chunk.data)
            if on_chunk is not None:
                on_chunk(event.chunk.data)
        elif event.HasField("result"):
            out.result = event.result
    assert out.result is not None and out.result.frames == len(video)
    return out


# -- reading MP4 boxes ---------------------------------------------------------------------

PARENTS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts", b"moof", b"traf", b"mvex"}


def boxes(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[bytes, bytes]]:
    """(type, payload) of every box, depth first."""
    end = len(data) if end is None else end
    while start + 8 <= end:
        size, head = int.from_bytes(data[start : start + 4], "big"), 8
        kind = data[start + 4 : start + 8]
        if size == 1:
            size, head = int.from_bytes(data[start + 8 : start + 16], "big"), 16
        elif size == 0:
            size = end - start
        if size < head or start + size > end:
            return
        yield kind, data[start + head : start + size]
        if kind in PARENTS:
            yield from boxes(data, start + head, start + size)
        elif kind == b"stsd":  # full box, entry count, then sample entries with children
            yield from _sample_entries(data, start + head + 8, start + size)
        start += size


def _sample_entries(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, bytes]]:
    skip = {b"avc1": 78, b"mp4a": 28}  # fixed fields before an entry's child boxes
    while start + 8 <= end:
        size, kind = int.from_bytes(data[start : start + 4], "big"), data[start + 4 : start + 8]
        if size < 8:
            return
        yield kind, data[start + 8 : start + size]
        if kind in skip:
            yield from boxes(data, start + 8 + skip[kind], start + size)
        start += size


def edit_lists(init: bytes) -> dict[str, list[tuple[int, int]]]:
    """Each track's edit list as (segment_duration, media_time) pairs, by handler type
    ("vide", "soun")."""
    tracks: list[tuple[list[str], list[tuple[int, int]]]] = []
    for kind, body in boxes(init):
        if kind == b"trak":
            tracks.append(([], []))
        elif kind == b"hdlr" and tracks:
            tracks[-1][0].append(body[8:12].decode("latin-1"))
        elif kind == b"elst" and tracks:
            version, count, pos = body[0], int.from_bytes(body[4:8], "big"), 8
            width = 8 if version == 1 else 4
            for _ in range(count):
                duration = int.from_bytes(body[pos : pos + width], "big")
                media = int.from_bytes(body[pos + width : pos + 2 * width], "big", signed=True)
                tracks[-1][1].append((duration, media))
                pos += 2 * width + 4
    return {handler[0]: edits for handler, edits in tracks}


def _descriptor(body: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, payload start, payload size) of an MPEG-4 descriptor at `pos`."""
    tag, size, pos = body[pos], 0, pos + 1
    while True:
        size, more, pos = (size << 7) | (body[pos] & 0x7F), body[pos] & 0x80, pos + 1
        if not more:
            return tag, pos, size


def codecs_string(init: bytes) -> str:
    """The RFC 6381 `codecs` of an MP4 init segment: avc1.PPCCLL and mp4a.OO.A."""
    codecs = []
    for kind, body in boxes(init):
        if kind == b"avcC":
            codecs.append("avc1." + body[1:4].hex().upper())
        elif kind == b"esds":
            tag, pos, _ = _descriptor(body, 4)  # ES_Descriptor
            assert tag == 3
            flags, pos = body[pos + 2], pos + 3  # after ES_ID
            if flags & 0x80:  # streamDependenceFlag
                pos += 2
            if flags & 0x40:  # URL_Flag
                pos += 1 + body[pos]
            if flags & 0x20:  # OCRstreamFlag
                pos += 2
            tag, pos, _ = _descriptor(body, pos)  # DecoderConfigDescriptor
            assert tag == 4
            object_type = body[pos]
            tag, info, _ = _descriptor(body, pos + 13)  # DecoderSpecificInfo
            assert tag == 5
            codecs.append(f"mp4a.{object_type:02X}.{body[info] >> 3}")
    return ", ".join(codecs)


def init_segment(data: bytes) -> bytes | None:
    """ftyp and moov: the top-level boxes before the first moof (None before one)."""
    start = 0
    while start + 8 <= len(data):
        if data[start + 4 : start + 8] == b"moof":
            return data[:start]
        size = int.from_bytes(data[start : start + 4], "big")
        if size == 1:
            size = int.from_bytes(data[start + 8 : start + 16], "big")
        if size < 8:
            break
        start += size
    return None


# -- the page and its server ---------------------------------------------------------------

RUNNER = """<!doctype html><meta charset="utf-8"><title>runner</title><body><script>
const once = (target, name) => new Promise(ok => target.addEventListener(name, ok, {once: true}));
const sleep = ms => new Promise(ok => setTimeout(ok, ms));
const ranges = r => Array.from({length: r.length}, (_, i) => [r.start(i), r.end(i)]);
const post = (id, report) => fetch('/result/' + id, {method: 'POST', body: JSON.stringify(report)});

async function decodeAudio(bytes, out) {
  // WebAudio's own decoder: where the tone burst starts, and how long the audio is.
  try {
    const audio = await new OfflineAudioContext(1, 1, 48000).decodeAudioData(bytes);
    const x = audio.getChannelData(0);
    const first = x.findIndex(s => Math.abs(s) > 0.1);
    out.webaudio = {seconds: audio.length / audio.sampleRate, rate: audio.sampleRate,
                    channels: audio.numberOfChannels,
                    onset: first < 0 ? null : first / audio.sampleRate};
  } catch (e) { out.webaudio = {error: String(e)}; }
}

async function feed(job, video, out) {
  // Media Source Extensions: every chunk the daemon streamed, appended as it comes.
  out.supported = MediaSource.isTypeSupported(job.mime);
  const source = new MediaSource();
  video.src = URL.createObjectURL(source);
  await once(source, 'sourceopen');
  const buffer = source.addSourceBuffer(job.mime);
  buffer.addEventListener('error', () => out.errors.push('SourceBuffer error'));
  out.appends = [];
  const pieces = [];
  for (let i = 0; ; i++) {
    const reply = await fetch(job.url + '/' + i);
    if (reply.status === 204) break;
    if (reply.status !== 200) { out.errors.push('chunk ' + i + ': HTTP ' + reply.status); break; }
    const piece = await reply.arrayBuffer();
    pieces.push(piece);
    buffer.appendBuffer(piece);
    await once(buffer, 'updateend');
    out.appends.push({bytes: piece.byteLength, readyState: video.readyState,
                      buffered: ranges(buffer.buffered), playing: out.playingAt !== undefined});
  }
  out.chunksAtPlaying = out.appends.findIndex(a => a.playing);
  source.endOfStream();
  out.fedAt = performance.now();
  out.sourceDuration = source.duration;
  out.sourceBuffered = ranges(buffer.buffered);
  out.sourceBufferAudioTracks = buffer.audioTracks ? buffer.audioTracks.length : null;
  out.sourceBufferVideoTracks = buffer.videoTracks ? buffer.videoTracks.length : null;
  if (job.audio) await decodeAudio(await new Blob(pieces).arrayBuffer(), out);
}

async function look(job) {
  // An image as a page shows it: an <img>, then its pixels read back through a canvas.
  const out = {errors: []};
  const img = document.createElement('img');
  document.body.appendChild(img);
  const loaded = new Promise(ok => { img.onload = () => ok(true); img.onerror = () => ok(false); });
  img.src = job.url;
  if (!await loaded) { out.errors.push('the image did not load'); return out; }
  out.width = img.naturalWidth;
  out.height = img.naturalHeight;
  const canvas = document.createElement('canvas');
  canvas.width = img.naturalWidth;
  canvas.height = img.naturalHeight;
  const context = canvas.getContext('2d');
  context.drawImage(img, 0, 0);
  out.rgb = Array.from(context.getImageData(0, 0, canvas.width, canvas.height).data)
    .filter((_, i) => i % 4 !== 3);
  img.remove();
  return out;
}

async function run(job) {
  const out = {errors: []};
  if (job.mode === 'none') return out;
  if (job.mode === 'image') return await look(job);
  out.startedAt = performance.now();
  const video = document.createElement('video');
  document.body.appendChild(video);
  video.addEventListener('error', () => out.errors.push(
      'media error ' + (video.error ? video.error.code + ': ' + video.error.message : '?')));
  video.addEventListener('playing', () => { if (out.playingAt === undefined)
      out.playingAt = performance.now(); });
  const ended = once(video, 'ended');
  let fed;
  if (job.mode === 'mse') {
    fed = feed(job, video, out);
    video.play().catch(e => out.errors.push('play: ' + e));
  } else {
    const bytes = await (await fetch(job.url)).arrayBuffer();
    video.src = URL.createObjectURL(new Blob([bytes], {type: job.mime}));
    if (job.audio) await decodeAudio(bytes.slice(0), out);
    fed = Promise.resolve();
    video.play().catch(e => out.errors.push('play: ' + e));
  }
  await fed;
  const stop = sleep(job.timeout_ms).then(() => out.errors.push('timed out'));
  await Promise.race([ended, stop, once(video, 'error')]);
  out.endedAt = performance.now();
  const quality = video.getVideoPlaybackQuality();
  Object.assign(out, {
    ended: video.ended, duration: video.duration, currentTime: video.currentTime,
    width: video.videoWidth, height: video.videoHeight,
    frames: quality.totalVideoFrames, dropped: quality.droppedVideoFrames,
    audioTracks: video.audioTracks ? video.audioTracks.length : null,
    videoTracks: video.videoTracks ? video.videoTracks.length : null,
    audioBytes: video.webkitAudioDecodedByteCount,
    videoBytes: video.webkitVideoDecodedByteCount,
    canPlayType: video.canPlayType(job.mime),
  });
  URL.revokeObjectURL(video.src);
  video.remove();
  return out;
}

(async () => {
  for (;;) {
    let job;
    try {
      const reply = await fetch('/job');
      if (reply.status !== 200) { if (reply.status !== 204) await sleep(200); continue; }
      job = await reply.json();
    } catch (e) { await sleep(200); continue; }
    let report;
    try { report = await run(job); } catch (e) { report = {errors: ['page: ' + e.stack]}; }
    report.userAgent = navigator.userAgent;
    await post(job.id, report);
  }
})();
</script>
"""


class Stream:
    """Chunks the daemon has sent so far, handed to the page as they come."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done = False
        self.waited = 0  # requests for a chunk the daemon had not sent yet
        self.changed = threading.Condition()

    def add(self, data: bytes) -> None:
        with self.changed:
            self.chunks.append(data)
            self.changed.notify_all()

    def end(self) -> None:
        with self.changed:
            self.done = True
            self.changed.notify_all()

    def init(self, timeout: float) -> bytes:
        """The init segment (ftyp and moov), once the first fragment has begun."""
        with self.changed:
            self.changed.wait_for(lambda: self.done or self._init() is not None, timeout)
            init = self._init()
            assert init is not None, "no init segment came"
            return init

    def _init(self) -> bytes | None:
        return init_segment(b"".join(self.chunks))

    def get(self, index: int, timeout: float) -> bytes | None:
        """Chunk `index`, waiting for it; None once the stream ended before it."""
        with self.changed:
            if not self.done and index >= len(self.chunks):
                self.waited += 1
            self.changed.wait_for(lambda: self.done or len(self.chunks) > index, timeout)
            if index < len(self.chunks):
                return self.chunks[index]
            if self.done:
                return None
            raise TimeoutError(f"chunk {index} never came")


class Site:
    """What the HTTP server serves: the runner page, files, streams, and jobs."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.types: dict[str, str] = {}  # a file's Content-Type, if not octet-stream
        self.streams: dict[str, Stream] = {}
        self.jobs: queue.Queue[dict[str, Any]] = queue.Queue()
        self.reports: dict[str, queue.Queue[dict[str, Any]]] = {}


def handler_for(site: Site) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def handle_one_request(self) -> None:
            with contextlib.suppress(ConnectionError):
                super().handle_one_request()

        def reply(self, status: int, body: bytes = b"", kind: str = "") -> None:
            self.send_response(status)
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Length", str(len(body)))
            if kind:
                self.send_header("Content-Type", kind)
            self.end_headers()
            with contextlib.suppress(ConnectionError):  # the page went away (teardown)
                self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            parts = path.strip("/").split("/")
            if path == "/":
                self.reply(200, RUNNER.encode(), "text/html; charset=utf-8")
            elif path == "/job":
                try:
                    job = site.jobs.get(timeout=1.0)
                except queue.Empty:
                    self.reply(HTTPStatus.NO_CONTENT)
                else:
                    self.reply(200, json.dumps(job).encode(), "application/json")
            elif len(parts) == 2 and parts[0] == "file" and parts[1] in site.files:
                kind = site.types.get(parts[1], "application/octet-stream")
                self.reply(200, site.files[parts[1]], kind)
            elif len(parts) == 3 and parts[0] == "stream" and parts[1] in site.streams:
                try:
                    chunk = site.streams[parts[1]].get(int(parts[2]), timeout=JOB_TIMEOUT_S)
                except TimeoutError:
                    self.reply(HTTPStatus.GATEWAY_TIMEOUT)
                else:
                    if chunk is None:
                        self.reply(HTTPStatus.NO_CONTENT)
                    else:
                        self.reply(200, chunk, "application/octet-stream")
            else:
                self.reply(HTTPStatus.NOT_FOUND)

        def do_POST(self) -> None:
            parts = self.path.strip("/").split("/")
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if len(parts) == 2 and parts[0] == "result" and parts[1] in site.reports:
                site.reports[parts[1]].put(json.loads(body))
                self.reply(HTTPStatus.NO_CONTENT)
            else:
                self.reply(HTTPStatus.NOT_FOUND)

    return Handler


class Browser:
    """One headless Chromium on the runner page; `play` runs a job and returns its report."""

    FLAGS = (
        "--headless",
        "--no-sandbox",  # tests run as root in CI
        "--disable-dev-shm-usage",  # nothing left in /dev/shm, whatever happens
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--autoplay-policy=no-user-gesture-required",
        "--disable-background-media-suspend",
        "--disable-renderer-backgrounding",
        "--disable-background-timer-throttling",
        "--enable-blink-features=AudioVideoTracks",  # audioTracks on <video> and SourceBuffer
        "--enable-logging=stderr",
        "--v=0",
    )

    def __init__(self, executable: str) -> None:
        self.site = Site()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(self.site))
        self.server.daemon_threads = True
        self._serving = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._serving.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.profile = tempfile.mkdtemp(prefix="vsd-chromium-")
        self.log_path = Path(self.profile) / "chromium.log"
        self._jobs = 0
        self._stuck = ""  # set when a job never reported: the page is still on it
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [executable, *self.FLAGS, f"--user-data-dir={self.profile}", self.url],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, ended as a whole below
            )
        try:
            version = subprocess.run(
                [executable, "--version"], capture_output=True, text=True, timeout=60, check=False
            )
            self.version = version.stdout.strip()  # "Chromium 156.0.8078.108 built on ..."
            self.user_agent = self.play({"mode": "none"})["userAgent"]
        except BaseException:
            self.close()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def play(self, job: dict[str, Any], timeout: float = JOB_TIMEOUT_S) -> dict[str, Any]:
        if self._stuck:
            raise RuntimeError(f"the page is still on an earlier job: {self._stuck}")
        self._jobs += 1
        job_id = f"job{self._jobs}"
        self.site.reports[job_id] = reports = queue.Queue()
        self.site.jobs.put({"id": job_id, "timeout_ms": timeout * 1000, **job})
        deadline = time.monotonic() + timeout + 15
        while True:
            try:
                return reports.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError(f"Chromium exited:\n{self.log()}") from None
                if time.monotonic() > deadline:
                    self._stuck = str(job)
                    raise TimeoutError(f"no report for {job}:\n{self.log()}") from None

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                self.process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(10)
            with contextlib.suppress(ProcessLookupError):
                # Its helpers (zygote, renderer, GPU and utility processes) share the group.
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        finally:
            self.server.shutdown()
            self.server.server_close()
            shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium for the module; every test that plays something skips without it."""
    if CHROMIUM is None:
        pytest.skip("needs Chromium (Debian: apt-get install chromium)")
    b = Browser(CHROMIUM)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def stub(daemon: Daemon) -> Iterator[pb_grpc.VideoSidecarStub]:
    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        yield pb_grpc.VideoSidecarStub(channel)


@pytest.fixture(scope="module")
def token(stub: pb_grpc.VideoSidecarStub) -> str:
    return str(stub.Attach(pb.AttachRequest(client_name="browser-test")).client_token)


MIME = {"mp4": "video/mp4", "fmp4": "video/mp4", "webm": "video/webm"}


def play_file(browser: Browser, name: str, container: str, out: Output, audio: bool) -> dict:
    """Play a whole file from a blob URL (and decode its audio with WebAudio)."""
    browser.site.files[name] = out.data
    try:
        job = {"mode": "file", "url": f"/file/{name}", "mime": MIME[container], "audio": audio}
        return browser.play(job)
    finally:
        del browser.site.files[name]


def play_stream(
    browser: Browser,
    name: str,
    stub: pb_grpc.VideoSidecarStub,
    token: str,
    video: np.ndarray,
    audio: np.ndarray | None,
    *,
    pace_s: float = 0.0,
    codec: pb.CodecOptions | None = None,
    late_audio: bool = False,
) -> tuple[dict[str, Any], Output, Stream]:
    """Encode fragmented MP4 while the page plays it through MSE, chunk by chunk: the page
    starts once the init segment is out (it names the codecs for `addSourceBuffer`) and
    then appends each OutputChunk as the daemon sends it."""
    stream = browser.site.streams[name] = Stream()
    encoded: list[Output] = []
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            options = {"pace_s": pace_s, "codec": codec, "late_audio": late_audio}
            encoded.append(
                encode(stub, token, "fmp4", video, audio, **options, on_chunk=stream.add)
            )
        except BaseException as exc:
            failed.append(exc)
        finally:
            stream.end()

    producer = threading.Thread(target=produce, name=f"encode-{name}")
    producer.start()
    try:
        init = stream.init(JOB_TIMEOUT_S)
        mime = f'video/mp4; codecs="{codecs_string(init)}"'
        job = {"mode": "mse", "url": f"/stream/{name}", "mime": mime, "audio": audio is not None}
        report = browser.play(job)
    finally:
        producer.join(120)
        del browser.site.streams[name]
    if failed:
        raise failed[0]
    return report, encoded[0], stream


def check_played(report: dict[str, Any], frames: int, width: int, height: int) -> None:
    """Played to its end, no media error, every frame decoded at the right size."""
    assert report["errors"] == [], report
    assert report["ended"], report
    assert report["currentTime"] == pytest.approx(report["duration"], abs=1e-3), report
    assert (report["width"], report["height"]) == (width, height), report
    assert report["frames"] == frames, report  # decoded (a late one may then be dropped)
    assert report["videoTracks"] == 1 and report["videoBytes"] > 0, report


def check_audio(report: dict[str, Any], expected: bool, seconds: float) -> None:
    """An audio track, decoded, where one was sent: and its tone burst on time."""
    assert report["audioTracks"] == int(expected), report
    if not expected:
        assert report["audioBytes"] == 0, report
        return
    assert report["audioBytes"] > 0, report
    decoded = report["webaudio"]
    assert "error" not in decoded, decoded
    assert decoded["seconds"] == pytest.approx(seconds, abs=0.003), decoded
    if seconds > TONE_AT + TONE_LENGTH:
        assert decoded["onset"] == pytest.approx(TONE_AT, abs=0.003), decoded


# An MP4 or fragmented MP4 reports the video's duration to the millisecond. WebM with Opus
# reports a little more: FFmpeg's Matroska muxer counts the Opus pre-skip (312 samples,
# 7 ms in its 1 ms timescale) into the Segment Duration, so 2.000 s reads 2.008 s.
def duration_slack(container: str, audio: bool) -> float:
    return 0.010 if container == "webm" and audio else 0.002


@pytest.mark.parametrize("container", ["mp4", "webm"])
@pytest.mark.parametrize("with_audio", [False, True], ids=["video", "audio"])
def test_whole_file_plays(browser, stub, token, container: str, with_audio: bool) -> None:
    """480x270 (not a whole number of macroblocks), 2.000 s, tone burst at 0.5 s."""
    video = pattern(48, 270, 480)
    audio = tone_burst(2.0) if with_audio else None
    out = encode(stub, token, container, video, audio)
    report = play_file(browser, f"{container}-{with_audio}", container, out, with_audio)
    check_played(report, 48, 480, 270)
    assert report["duration"] - 2.0 == pytest.approx(0, abs=duration_slack(container, with_audio))
    assert report["duration"] >= 2.0 - 0.001
    check_audio(report, with_audio, 2.0)


@pytest.mark.parametrize(
    ("with_audio", "preset", "late_audio"),
    [(False, "", False), (True, "", False), (True, "medium", False), (True, "", True)],
    ids=["video", "audio", "bframes-audio", "audio-at-end"],
)
def test_fragmented_mp4_plays_while_streamed(
    browser, stub, token, with_audio: bool, preset: str, late_audio: bool
) -> None:
    """Fed at about real time; the page appends each chunk as it arrives and plays from
    the first fragment. The edit lists hold: 2.000 s long, video and tone on time."""
    video = pattern(48, 270, 480)
    audio = tone_burst(2.0) if with_audio else None
    report, out, stream = play_stream(
        browser, f"fmp4-{with_audio}-{preset}-{late_audio}", stub, token, video, audio,
        pace_s=0.2, codec=pb.CodecOptions(preset=preset), late_audio=late_audio,
    )  # fmt: skip
    assert report["supported"], report
    check_played(report, 48, 480, 270)
    # Every OutputChunk became one appendBuffer, in order, as it was streamed back.
    assert [a["bytes"] for a in report["appends"]] == [len(c) for c in out.chunks]
    # Live, but for two cases where nothing can leave before the end: x264's lookahead at
    # slower presets holds its output back, and the init segment (whose edit lists need
    # every track's first samples) waits for audio that comes with the end.
    if not preset and not late_audio:
        assert stream.waited, "the page never waited for a chunk: nothing was played live"
        assert 0 <= report["chunksAtPlaying"] < len(out.chunks) - 1, "played only at the end"
    # Without edit lists this reads 2.0213 s (the AAC priming played, the tone 21 ms late)
    # or, with B-frames, 2.0833 s (the video starting at its first presentation time).
    assert report["sourceDuration"] == pytest.approx(2.0, abs=0.002), report
    assert report["duration"] == pytest.approx(2.0, abs=0.002), report
    [(start, end)] = report["sourceBuffered"]
    assert start == pytest.approx(0, abs=0.001) and end == pytest.approx(2.0, abs=0.002)
    assert report["sourceBufferAudioTracks"] == int(with_audio)
    check_audio(report, with_audio, 2.0)


@pytest.mark.parametrize("container", ["mp4", "fmp4", "webm"])
def test_one_frame_clip_plays(browser, stub, token, container: str) -> None:
    """One 98x54 frame (odd chroma planes, 49x27) with 1/24 s of audio."""
    video = pattern(1, 54, 98)
    t = np.arange(RATE // FPS) / RATE
    audio = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[:, None]
    if container == "fmp4":
        report, out, _ = play_stream(browser, "fmp4-one", stub, token, video, audio)
        assert report["supported"], report
        assert report["sourceDuration"] == pytest.approx(1 / FPS, abs=0.002), report
    else:
        out = encode(stub, token, container, video, audio)
        report = play_file(browser, f"{container}-one", container, out, True)
    check_played(report, 1, 98, 54)
    assert report["duration"] - 1 / FPS == pytest.approx(0, abs=duration_slack(container, True))
    check_audio(report, True, 1 / FPS)


def audio_onset(data: bytes) -> tuple[float | None, float]:
    """Where FFmpeg, decoding the file, finds the tone burst; and the audio's end time."""
    onset, end = None, 0.0
    with av.open(io.BytesIO(data)) as c:
        for frame in c.decode(audio=0):
            start = float(frame.pts * frame.time_base)
            end = start + frame.samples / frame.sample_rate
            loud = np.flatnonzero(np.abs(frame.to_ndarray()[0]) > 0.1)
            if onset is None and loud.size:
                onset = start + loud[0] / frame.sample_rate
    return onset, end


def test_fragmented_mp4_edits_out_the_aac_priming(stub, token) -> None:
    """No browser needed: the init segment holds edit lists, the audio one skipping the
    AAC encoder's priming samples, and FFmpeg reading it finds the tone burst on time, as
    in plain MP4. The init segment still leaves first, before the encode ends."""
    video = pattern(48, 270, 480)
    arrived: list[float] = []
    fragmented = encode(
        stub, token, "fmp4", video, tone_burst(2.0),
        pace_s=0.1, on_chunk=lambda _: arrived.append(time.monotonic()),
    )  # fmt: skip
    data = fragmented.data
    # The first fragment is cut at frame 13 of 48, whose message goes at 0.2 s of 0.7 s:
    # the init segment leaves on its own, ahead of the fragments (not when a loaded
    # machine's encode happens to end).
    assert data[4:8] == b"ftyp" and len(arrived) >= 3 and arrived[0] < arrived[-1], arrived
    init = init_segment(data)
    assert init is not None, "no fragment"
    edits = edit_lists(init)
    assert [media for _, media in edits["soun"]] == [AAC_PRIMING], edits
    # The video's edit skips only its B-frames' reordering delay: whole frames, a few.
    (video_edit,) = [media for _, media in edits["vide"]]
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frame_ticks = 1 / (stream.average_rate * stream.time_base)
    assert video_edit % frame_ticks == 0 and video_edit <= 3 * frame_ticks, edits
    plain = encode(stub, token, "mp4", video, tone_burst(2.0))
    assert [m for _, m in edit_lists(plain.data)["soun"]] == [AAC_PRIMING]
    for output in (fragmented, plain):
        onset, _ = audio_onset(output.data)
        assert onset == pytest.approx(TONE_AT, abs=0.002)


@pytest.mark.parametrize("image_format", ["jpeg", "webp"])
def test_previews_show_as_images(browser, stub, token, image_format: str) -> None:
    """A stream's thumbnail and sprite sheet, served as their MIME type, load in an <img>
    at the size the result says, showing the source frames (box-averaged to that size)."""
    fmt = {"jpeg": pb.IMAGE_FORMAT_JPEG, "webp": pb.IMAGE_FORMAT_WEBP}[image_format]
    previews = pb.Previews(
        thumbnail=pb.Thumbnail(index=10, max_width=240, format=fmt),
        sprite_sheet=pb.SpriteSheet(interval_s=0.5, tile_width=120, columns=2, format=fmt),
    )
    video = moving_pattern(48, 272, 480)
    out = encode(stub, token, "mp4", video, None, previews=previews)
    thumbnail, sheet = out.result.previews
    assert (thumbnail.kind, thumbnail.width, thumbnail.height) == ("thumbnail", 240, 136)
    assert (sheet.kind, sheet.columns, sheet.rows) == ("sprite_sheet", 2, 2)
    assert list(sheet.frames) == [0, 12, 24, 36]
    references = {
        "thumbnail": _box(video[10], 2),
        "sprite_sheet": np.concatenate(
            [
                np.concatenate([_box(video[f], 4) for f in row], axis=1)
                for row in ((0, 12), (24, 36))
            ]
        ),
    }
    for preview in out.result.previews:
        name = f"{preview.kind}.{image_format}"
        browser.site.files[name], browser.site.types[name] = preview.data, preview.mime_type
        try:
            report = browser.play({"mode": "image", "url": f"/file/{name}"})
        finally:
            del browser.site.files[name]
        assert report["errors"] == [], report
        assert (report["width"], report["height"]) == (preview.width, preview.height)
        shown = np.array(report["rgb"], np.uint8).reshape(preview.height, preview.width, 3)
        assert psnr(shown, references[preview.kind]) >= 33, preview.kind


def _box(rgb: np.ndarray, factor: int) -> np.ndarray:
    h, w = rgb.shape[0] // factor, rgb.shape[1] // factor
    blocks = rgb.reshape(h, factor, w, factor, 3).astype(np.float64)
    return blocks.mean(axis=(1, 3)).round().astype(np.uint8)
