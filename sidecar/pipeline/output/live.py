"""A live LL-HLS/CMAF package: a folder under the output root that any static HTTP server
can serve while the video is still being encoded (docs/live.md).

    <folder>/init.mp4            the CMAF init segment
    <folder>/s00000.p0.m4s ...   partial segments (EXT-X-PART), written as frames come
    <folder>/s00000.m4s ...      whole media segments, each the bytes of its parts
    <folder>/index.m3u8          the media playlist
    and, where the encode has audio, its rendition beside the video's:
    <folder>/audio.mp4, a00000.p0.m4s, a00000.m4s, audio.m3u8
    <folder>/master.m3u8         the multivariant playlist: the video with its audio

The reader's rules, kept at every instant: a part or segment is whole on disk before the
playlist names it; the playlist is replaced atomically (written beside, then renamed);
`EXT-X-ENDLIST` is added when the encode ends, and the playlist then stays playable as a
VOD. An encode that fails or is stopped closes its package the same way, shorter: what
was written stays, the open segment is closed with the parts it has, and no file is left
half written. Every name in the folder is the daemon's.
"""

from __future__ import annotations

import math
import os
import re
import secrets
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path, PurePosixPath

from ...codec.cmaf import Init, Sample, fragment
from ...errors import InvalidRequest, OutOfRange, OutputExists
from ..admission.requests import LiveRequest
from .files import confine, make_dirs, output_error, within_root

PLAYLIST = "index.m3u8"
INIT = "init.mp4"
AUDIO_PLAYLIST = "audio.m3u8"
AUDIO_INIT = "audio.mp4"
MULTIVARIANT = "master.m3u8"
# A package's size at most, all files together; past it the encode fails (and the package
# is closed, shorter).
MAX_LIVE_BYTES = 64 << 30
FIELD = "live.folder"
SEGMENT_S = (2.0, 1.0, 10.0)  # default, least, most
PART_S = (0.5, 0.1, 2.0)
# What the daemon writes in a package folder (and, with overwrite, removes first).
OURS = re.compile(r"((init|audio)\.mp4|(index|audio|master)\.m3u8|[sa]\d{5}(\.p\d+)?\.m4s)")
# Parts of segments older than this many target durations leave the playlist (RFC 8216bis
# 4.4.4.9: they are no longer needed to join near the live edge).
PARTS_KEPT_TARGETS = 3
AAC_FRAME = 1024  # samples an AAC packet holds


@dataclass(frozen=True)
class LiveLayout:
    """How a package cuts its video: frames a segment (the GOP) and a part."""

    folder: Path
    fps: Fraction
    segment_frames: int
    part_frames: int
    max_bytes: int

    @property
    def part_target(self) -> float:
        return float(self.part_frames / self.fps)

    @property
    def target_duration(self) -> int:
        return max(1, math.ceil(float(self.segment_frames / self.fps) - 1e-9))


def plan_live(root: Path, request: LiveRequest, fps: Fraction, codec: str) -> LiveLayout:
    """Check a live package request and make its folder; its layout."""
    if codec != "libx264":
        raise InvalidRequest("live", f"a live package is H.264 (libx264); this encode is {codec}")
    segment_s = _seconds("live.segment_s", request.segment_s, SEGMENT_S)
    part_s = _seconds("live.part_s", request.part_s, PART_S)
    if part_s > segment_s / 2:
        half = f"{part_s:g} s: at most half a segment ({segment_s:g} s)"
        raise InvalidRequest("live.part_s", half)
    segment_frames = max(1, round(segment_s * fps))
    part_frames = max(1, math.floor(part_s * fps))
    relative = within_root(request.folder.rstrip("/"), root, FIELD)
    rel = confine(relative, FIELD)
    folder = Path(make_dirs(root, PurePosixPath(rel), relative, FIELD))
    if not request.overwrite and any(OURS.fullmatch(p) for p in os.listdir(folder)):
        raise OutputExists(f"{relative[:80]!r} holds a package; pass overwrite to replace it")
    return LiveLayout(folder, fps, segment_frames, part_frames, MAX_LIVE_BYTES)


def _seconds(name: str, value: float, bounds: tuple[float, float, float]) -> float:
    default, least, most = bounds
    if value == 0:
        return default
    if not math.isfinite(value) or not least <= value <= most:
        raise InvalidRequest(name, f"{value!r}: give {least:g}-{most:g} seconds (0: {default:g})")
    return value


@dataclass
class _Part:
    name: str
    ticks: int  # its duration, in the track's timescale
    independent: bool


@dataclass
class _Segment:
    name: str
    parts: list[_Part] = field(default_factory=list)
    samples: int = 0
    ticks: int = 0
    size: int = 0
    closed: bool = False


class _Track:
    """One rendition's files: parts as its samples come, segments of its parts, and its
    media playlist."""

    def __init__(
        self, package: LivePackage, init: Init, prefix: str, init_name: str, name: str
    ) -> None:
        self.package = package
        self.init = init
        self.prefix = prefix
        self.init_name = init_name
        self.name = name  # of its playlist
        layout = package.layout
        self.frame_ticks = init.timescale * layout.fps.denominator // layout.fps.numerator
        self.segments: list[_Segment] = []
        self.pending: list[Sample] = []  # the open part's samples
        self.slot: tuple[int, int] | None = None  # the open part's (segment, part), audio
        self.open_bytes: list[bytes] = []  # the open segment's parts, for its whole file
        self.ticks = 0  # decode time of the next part
        self.fragments = 0
        self.listed = False  # its playlist is on disk

    def seconds(self, ticks: int) -> float:
        return ticks / self.init.timescale

    def flush_part(self) -> None:
        if not self.pending:
            return
        if not self.segments or self.segments[-1].closed:
            index = len(self.segments)
            self.segments.append(_Segment(f"{self.prefix}{index:05d}.m4s"))
        segment = self.segments[-1]
        self.fragments += 1
        data = fragment(self.fragments, self.init, self.ticks, self.frame_ticks, self.pending)
        ticks = sum(s.duration or self.frame_ticks for s in self.pending)
        name = f"{segment.name[:-4]}.p{len(segment.parts)}.m4s"
        self.package.write(name, data)
        segment.parts.append(_Part(name, ticks, self.pending[0].keyframe))
        segment.samples += len(self.pending)
        segment.ticks += ticks
        segment.size += len(data)
        self.ticks += ticks
        self.open_bytes.append(data)
        self.pending = []
        self.package.parts_written += self.prefix == "s"
        self.write_playlist()

    def close_segment(self) -> None:
        if not self.segments or self.segments[-1].closed or not self.open_bytes:
            return
        segment = self.segments[-1]
        self.package.write(segment.name, b"".join(self.open_bytes))
        self.open_bytes = []
        segment.closed = True
        # Named with the next part's playlist (or the last): a live playlist ending on a
        # whole segment with no part after it made hls.js (1.7) take the next reload
        # for a different playlist ("media sequence mismatch") and stop.

    def close(self) -> None:
        self.flush_part()
        self.close_segment()

    def write_playlist(self) -> None:
        # First once whole segments of three target durations are in it (HOLD-BACK's
        # default, where players begin): Chromium's own player refuses a live playlist of
        # less (DEMUXER_ERROR_COULD_NOT_PARSE), and a player joining sooner would wait.
        package, layout = self.package, self.package.layout
        whole = self.seconds(sum(s.ticks for s in self.segments if s.closed))
        if package.ended or whole >= 3 * layout.target_duration - 1e-9:
            package.write(self.name, self.playlist().encode())
            self.listed = True
            package.write_multivariant()

    def playlist(self) -> str:
        layout = self.package.layout
        part_target = layout.part_target
        if self.prefix == "a":  # whole AAC frames: the first part has the priming too
            part_target += 2 * AAC_FRAME / self.init.timescale
        lines = [
            "#EXTM3U",
            "#EXT-X-VERSION:9",
            f"#EXT-X-TARGETDURATION:{layout.target_duration}",
            f"#EXT-X-PART-INF:PART-TARGET={part_target:.5f}",
            # Served by a static server: no blocking reload, no delta updates.
            f"#EXT-X-SERVER-CONTROL:PART-HOLD-BACK={3 * part_target:.5f}",
            "#EXT-X-MEDIA-SEQUENCE:0",
            # Segments are only ever added: a viewer starts at the video's beginning and
            # may seek anywhere in what is made. (No PLAYLIST-TYPE:EVENT: Chromium's own
            # player then never takes the ENDLIST that ends it.)
            "#EXT-X-START:TIME-OFFSET=0",
            "#EXT-X-INDEPENDENT-SEGMENTS",
            f'#EXT-X-MAP:URI="{self.init_name}"',
        ]
        # Parts of the last few target durations (kept in the last playlist too: a
        # player following the parts would lose its place if they went).
        keep_from = len(self.segments)
        left = float(PARTS_KEPT_TARGETS * layout.target_duration)
        while keep_from > 0 and left > 0:
            keep_from -= 1
            left -= self.seconds(self.segments[keep_from].ticks)
        for index, segment in enumerate(self.segments):
            if index >= keep_from:
                for part in segment.parts:
                    independent = ",INDEPENDENT=YES" if part.independent else ""
                    lines.append(
                        f"#EXT-X-PART:DURATION={self.seconds(part.ticks):.5f},"
                        f'URI="{part.name}"{independent}'
                    )
            if segment.closed:
                lines.append(f"#EXTINF:{self.seconds(segment.ticks):.5f},")
                lines.append(segment.name)
        if self.package.ended:
            lines.append("#EXT-X-ENDLIST")
        return "\n".join(lines) + "\n"


class LivePackage:
    """Writes one package as packets come (`add`, `add_audio`), closing it with
    `finish`."""

    def __init__(self, layout: LiveLayout) -> None:
        self.layout = layout
        self.video: _Track | None = None
        self.audio: _Track | None = None
        self._bytes = 0
        self.ended = False
        self._delay: int | None = None  # frames the encoder's decode times run ahead
        self._audio_start: int | None = None  # the first AAC packet's pts
        self.parts_written = 0  # the video's

    # -- writing -------------------------------------------------------------------------

    def start(self, init: Init, audio: Init | None = None) -> None:
        """Write the init segments (before any part names them), after removing the files
        of a package it replaces."""
        for name in os.listdir(self.layout.folder):
            if OURS.fullmatch(name):
                (self.layout.folder / name).unlink(missing_ok=True)
        self.video = _Track(self, init, "s", INIT, PLAYLIST)
        self.write(INIT, init.data)
        if audio is not None:
            self.audio = _Track(self, audio, "a", AUDIO_INIT, AUDIO_PLAYLIST)
            self.write(AUDIO_INIT, audio.data)

    def add(self, data: bytes, keyframe: bool, pts: int, dts: int) -> None:
        """One encoded frame, in decode order; `pts` and `dts` in frames. Decode times
        are shifted by the encoder's delay (its first packet's `-dts`) to start at 0."""
        video = self.video
        if self.ended or video is None:
            return
        if self._delay is None:
            self._delay = max(0, -dts)
        if keyframe and (video.pending or video.open_bytes):
            video.close()  # a keyframe starts a segment
        video.pending.append(Sample(data, keyframe, pts - dts - self._delay))
        if len(video.pending) >= self.layout.part_frames:
            video.flush_part()
            if video.segments[-1].samples >= self.layout.segment_frames:
                video.close_segment()

    def add_audio(self, data: bytes, pts: int, duration: int) -> None:
        """One AAC packet, in order; `pts` and `duration` in samples. Its part and segment
        are those of the video's that its time falls in; decode times start at 0 with the
        first packet (the encoder's priming, which the init segment's edit list skips)."""
        audio = self.audio
        if self.ended or audio is None:
            return
        if self._audio_start is None:
            self._audio_start = pts
        # The encoder's priming (negative times) goes with the first part; the packet
        # that pads the track to the video's end, with the last.
        frame = max(0, pts) * self.layout.fps // audio.init.timescale
        segment, into = divmod(int(frame), self.layout.segment_frames)
        slot = (segment, into // self.layout.part_frames)
        if audio.pending and slot != audio.slot:
            audio.flush_part()
            if audio.slot is not None and segment != audio.slot[0]:
                audio.close_segment()
        audio.slot = slot
        audio.pending.append(Sample(data, True, 0, duration or AAC_FRAME))

    def finish(self) -> None:
        """The video ended (or stopped): the last parts and segments out, then ENDLIST."""
        if self.ended or self.video is None:
            self.ended = True
            return
        self.video.close()
        if self.audio is not None:
            self.audio.close()
        self.ended = True
        for track in (self.video, self.audio):
            if track is not None:
                track.write_playlist()

    # -- internals -----------------------------------------------------------------------

    def write_multivariant(self) -> None:
        """The multivariant playlist, once both media playlists are on disk (and again
        at the end, with the whole package's bandwidth)."""
        video, audio = self.video, self.audio
        if video is None or audio is None or not (video.listed and audio.listed):
            return
        if (self.layout.folder / MULTIVARIANT).exists() and not self.ended:
            return
        peak = average = 0.0
        for i, segment in enumerate(video.segments):
            size = segment.size + (audio.segments[i].size if i < len(audio.segments) else 0)
            peak = max(peak, size * 8 / max(video.seconds(segment.ticks), 1e-3))
        seconds = video.seconds(video.ticks) or 1.0
        average = (sum(s.size for s in video.segments + audio.segments) * 8) / seconds
        text = "\n".join(
            [
                "#EXTM3U",
                "#EXT-X-VERSION:9",
                "#EXT-X-INDEPENDENT-SEGMENTS",
                f'#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID="audio",NAME="audio",DEFAULT=YES,'
                f'AUTOSELECT=YES,CHANNELS="{audio.init.channels}",URI="{AUDIO_PLAYLIST}"',
                f"#EXT-X-STREAM-INF:BANDWIDTH={math.ceil(peak)},"
                f"AVERAGE-BANDWIDTH={math.ceil(average)},"
                f'CODECS="{video.init.codec},{audio.init.codec}",'
                f"RESOLUTION={video.init.width}x{video.init.height},"
                f'FRAME-RATE={float(self.layout.fps):.3f},AUDIO="audio"',
                PLAYLIST,
            ]
        )
        self.write(MULTIVARIANT, (text + "\n").encode())

    def playlist(self) -> str:
        """The video's media playlist, as it is now."""
        assert self.video is not None
        return self.video.playlist()

    def write(self, name: str, data: bytes) -> None:
        """`name` in the folder, whole before it has that name (readers see the old file
        or the new one, never part of one)."""
        self._bytes += len(data)
        if self._bytes > self.layout.max_bytes:
            raise OutOfRange(f"the live package is over its limit of {self.layout.max_bytes} bytes")
        folder = self.layout.folder
        temp = folder / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            with open(temp, "xb") as out:
                out.write(data)
            os.replace(temp, folder / name)
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise output_error(exc, f"the live package's {name}") from None
