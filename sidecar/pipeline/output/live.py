"""A live LL-HLS/CMAF package: a folder under the output root that any static HTTP server
can serve while the video is still being encoded (docs/live.md).

    <folder>/init.mp4            the CMAF init segment
    <folder>/s00000.p0.m4s ...   partial segments (EXT-X-PART), written as frames come
    <folder>/s00000.m4s ...      whole media segments, each the bytes of its parts
    <folder>/index.m3u8          the media playlist

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
# A package's size at most, all files together; past it the encode fails (and the package
# is closed, shorter).
MAX_LIVE_BYTES = 64 << 30
FIELD = "live.folder"
SEGMENT_S = (2.0, 1.0, 10.0)  # default, least, most
PART_S = (0.5, 0.1, 2.0)
# What the daemon writes in a package folder (and, with overwrite, removes first).
OURS = re.compile(r"(init\.mp4|index\.m3u8|s\d{5}\.m4s|s\d{5}\.p\d+\.m4s)")
# Parts of segments older than this many target durations leave the playlist (RFC 8216bis
# 4.4.4.9: they are no longer needed to join near the live edge).
PARTS_KEPT_TARGETS = 3


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
    frames: int
    independent: bool


@dataclass
class _Segment:
    index: int
    parts: list[_Part] = field(default_factory=list)
    frames: int = 0
    closed: bool = False

    @property
    def name(self) -> str:
        return f"s{self.index:05d}.m4s"


class LivePackage:
    """Writes one package as packets come (`add`), closing it with `finish`."""

    def __init__(self, layout: LiveLayout) -> None:
        self.layout = layout
        self._init: Init | None = None
        self._segments: list[_Segment] = []
        self._pending: list[Sample] = []  # the open part's samples
        self._open_bytes: list[bytes] = []  # the open segment's parts, for its whole file
        self._frames = 0  # samples written in parts
        self._fragments = 0
        self._bytes = 0
        self._ended = False
        self._delay: int | None = None  # frames the encoder's decode times run ahead
        self.parts_written = 0

    # -- writing -------------------------------------------------------------------------

    def start(self, init: Init) -> None:
        """Write the init segment (before any part names it), after removing the files of
        a package it replaces."""
        for name in os.listdir(self.layout.folder):
            if OURS.fullmatch(name):
                (self.layout.folder / name).unlink(missing_ok=True)
        self._init = init
        self._write(INIT, init.data)

    def add(self, data: bytes, keyframe: bool, pts: int, dts: int) -> None:
        """One encoded frame, in decode order; `pts` and `dts` in frames. Decode times
        are shifted by the encoder's delay (its first packet's `-dts`) to start at 0."""
        if self._ended:
            return
        if self._delay is None:
            self._delay = max(0, -dts)
        if keyframe and (self._pending or self._open_bytes):
            self._flush_part()
            self._close_segment()  # a keyframe starts a segment
        self._pending.append(Sample(data, keyframe, pts - dts - self._delay))
        if len(self._pending) >= self.layout.part_frames:
            self._flush_part()
            segment = self._segments[-1]
            if segment.frames >= self.layout.segment_frames:
                self._close_segment()

    def finish(self) -> None:
        """The video ended (or stopped): the last part and segment out, then ENDLIST."""
        if self._ended or self._init is None:
            self._ended = True
            return
        self._flush_part()
        self._close_segment()
        self._ended = True
        self._write_playlist()

    # -- internals -----------------------------------------------------------------------

    def _flush_part(self) -> None:
        if not self._pending:
            return
        assert self._init is not None
        if not self._segments or self._segments[-1].closed:
            self._segments.append(_Segment(len(self._segments)))
        segment = self._segments[-1]
        duration = self._init.timescale * self.layout.fps.denominator // self.layout.fps.numerator
        self._fragments += 1
        data = fragment(
            self._fragments, self._init, self._frames * duration, duration, self._pending
        )
        name = f"s{segment.index:05d}.p{len(segment.parts)}.m4s"
        self._write(name, data)
        segment.parts.append(_Part(name, len(self._pending), self._pending[0].keyframe))
        segment.frames += len(self._pending)
        self._frames += len(self._pending)
        self._open_bytes.append(data)
        self._pending = []
        self.parts_written += 1
        self._write_playlist()

    def _close_segment(self) -> None:
        if not self._segments or self._segments[-1].closed or not self._open_bytes:
            return
        segment = self._segments[-1]
        self._write(segment.name, b"".join(self._open_bytes))
        self._open_bytes = []
        segment.closed = True
        self._write_playlist()

    def _write_playlist(self) -> None:
        # First once whole segments of three target durations are in it (HOLD-BACK's
        # default, where players begin): Chromium's own player refuses a live playlist of
        # less (DEMUXER_ERROR_COULD_NOT_PARSE), and a player joining sooner would wait.
        whole = sum(segment.frames for segment in self._segments if segment.closed)
        if self._ended or whole >= 3 * self.layout.target_duration * self.layout.fps:
            self._write(PLAYLIST, self.playlist().encode())

    def playlist(self) -> str:
        layout = self.layout
        fps = layout.fps
        lines = [
            "#EXTM3U",
            "#EXT-X-VERSION:9",
            f"#EXT-X-TARGETDURATION:{layout.target_duration}",
            f"#EXT-X-PART-INF:PART-TARGET={layout.part_target:.5f}",
            # Served by a static server: no blocking reload, no delta updates.
            f"#EXT-X-SERVER-CONTROL:PART-HOLD-BACK={3 * layout.part_target:.5f}",
            "#EXT-X-MEDIA-SEQUENCE:0",
            # Segments are only ever added: a viewer starts at the video's beginning and
            # may seek anywhere in what is made. (No PLAYLIST-TYPE:EVENT: Chromium's own
            # player then never takes the ENDLIST that ends it.)
            "#EXT-X-START:TIME-OFFSET=0",
            "#EXT-X-INDEPENDENT-SEGMENTS",
            f'#EXT-X-MAP:URI="{INIT}"',
        ]
        # Parts of the last few target durations (kept in the last playlist too: a
        # player following the parts would lose its place if they went).
        keep_from = len(self._segments)
        left = float(PARTS_KEPT_TARGETS * layout.target_duration)
        while keep_from > 0 and left > 0:
            keep_from -= 1
            left -= float(self._segments[keep_from].frames / fps)
        for segment in self._segments:
            if segment.index >= keep_from:
                for part in segment.parts:
                    independent = ",INDEPENDENT=YES" if part.independent else ""
                    lines.append(
                        f"#EXT-X-PART:DURATION={float(part.frames / fps):.5f},"
                        f'URI="{part.name}"{independent}'
                    )
            if segment.closed:
                lines.append(f"#EXTINF:{float(segment.frames / fps):.5f},")
                lines.append(segment.name)
        if self._ended:
            lines.append("#EXT-X-ENDLIST")
        return "\n".join(lines) + "\n"

    def _write(self, name: str, data: bytes) -> None:
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
