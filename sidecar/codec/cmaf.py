"""CMAF pieces for a live package: init segments, from FFmpeg's MP4 muxer, and media
fragments (`moof` + `mdat`), written here from the encoders' packets (the video's, and
the audio track's AAC packets where there is audio: each its own track, in its own
files).

FFmpeg's fragmenting muxer cuts a fragment only when the next packet arrives (or at the
end), so the last part before a pause in a stream would wait for the next chunk. Writing
the fragment boxes here lets a part go out the moment its last packet exists. Only what
one video track needs is written: each sample's duration, size, sync flag and
composition offset (signed, `trun` version 1: with B-frames a sample is presented before
or after it is decoded). Decode times are shifted by the encoder's delay so that they
start at 0 and the first frame is presented at 0, with no edit list.
"""

from __future__ import annotations

import io
import itertools
import struct
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import av

# Sample flags (ISO/IEC 14496-12, 8.8.3.1): a sync sample depends on no other; any other
# depends on others and is not a sync sample.
SYNC = 0x02000000
NOT_SYNC = 0x01010000
# Samples FFmpeg's AAC encoder puts ahead of the audio (its first packet's pts is -1024):
# an edit list skips them, as FFmpeg's own MP4 muxer does.
AAC_PRIMING = 1024


class LiveSink(Protocol):
    """Where an encoder's packets go beside its container: a live package."""

    def start(self, init: Init, audio: Init | None = None) -> None: ...
    def add(self, data: bytes, keyframe: bool, pts: int, dts: int) -> None: ...
    def add_audio(self, data: bytes, pts: int, duration: int) -> None: ...
    def finish(self) -> None: ...


@dataclass(frozen=True)
class Sample:
    data: bytes
    keyframe: bool
    offset: int = 0  # presentation minus decode time, in frames
    duration: int = 0  # in the track's timescale; 0: the fragment's own


@dataclass(frozen=True)
class Init:
    """The init segment, and what fragments must agree with it on."""

    data: bytes
    timescale: int  # of the track's media time
    track_id: int
    codec: str = ""  # as HLS's CODECS names it: "avc1.64001f", "mp4a.40.2"
    width: int = 0
    height: int = 0
    channels: int = 0


def init_segment(
    template: av.VideoStream | av.AudioStream, extradata: bytes | None, time_base: Fraction
) -> Init:
    """The init segment (`ftyp` + `moov`) for the stream `template` encodes: one track,
    its codec headers from `extradata`, its media time in `time_base` (a video's: one
    frame; AAC's: one sample)."""
    out = io.BytesIO()
    options = {"movflags": "empty_moov+default_base_moof+frag_custom+skip_trailer+cmaf"}
    with av.open(out, "w", format="mp4", options=options) as container:
        stream = container.add_stream_from_template(template)
        stream.codec_context.extradata = extradata
        stream.time_base = time_base
        container.start_encoding()
    data = b"".join(box for kind, box in boxes(out.getvalue()) if kind in (b"ftyp", b"moov"))
    ctx = template.codec_context
    if isinstance(ctx, av.AudioCodecContext):
        data = _skip_priming(data, AAC_PRIMING)
        return Init(data, _timescale(data), _track_id(data), "mp4a.40.2", channels=ctx.channels)
    return Init(data, _timescale(data), _track_id(data), _avc1(data), ctx.width, ctx.height)


def fragment(
    sequence: int, init: Init, decode_time: int, duration: int, samples: list[Sample]
) -> bytes:
    """One `moof` + `mdat`: `samples`, each `duration` long in the track's timescale (or its
    own, where it has one), the first at `decode_time`. `sequence` counts fragments from 1."""
    mfhd = _full(b"mfhd", 0, 0, struct.pack(">I", sequence))
    tfhd = _full(b"tfhd", 0, 0x020000, struct.pack(">I", init.track_id))  # base is the moof
    tfdt = _full(b"tfdt", 1, 0, struct.pack(">Q", decode_time))
    entries = b"".join(
        struct.pack(
            ">IIIi",
            s.duration or duration,
            len(s.data),
            SYNC if s.keyframe else NOT_SYNC,
            s.offset * duration,
        )
        for s in samples
    )
    # data-offset, sample duration, size, flags and composition offset present
    trun_size = 8 + 4 + 8 + len(entries)
    moof_size = 8 + len(mfhd) + 8 + len(tfhd) + len(tfdt) + trun_size
    trun = _full(b"trun", 1, 0x000F01, struct.pack(">Ii", len(samples), moof_size + 8) + entries)
    moof = _box(b"moof", mfhd + _box(b"traf", tfhd + tfdt + trun))
    assert len(moof) == moof_size
    return moof + _box(b"mdat", b"".join(s.data for s in samples))


def length_prefixed(annex_b: bytes) -> bytes:
    """An H.264 access unit as x264 makes it (Annex B: start codes) as MP4 carries it
    (each NAL unit after its 4-byte length). Parameter sets and delimiters are left out:
    the init segment carries the parameter sets."""
    out = []
    for nal in _nal_units(annex_b):
        if nal and nal[0] & 0x1F not in (7, 8, 9):
            out.append(struct.pack(">I", len(nal)) + nal)
    return b"".join(out)


def _nal_units(data: bytes) -> list[bytes]:
    starts, at = [], data.find(b"\x00\x00\x01")
    while at >= 0:
        starts.append(at + 3)
        at = data.find(b"\x00\x00\x01", at + 3)
    units = [data[start : following - 3] for start, following in itertools.pairwise(starts)]
    # A 4-byte start code's first zero is not the NAL unit's (nor are trailing zeros).
    units = [unit.rstrip(b"\x00") for unit in units]
    return [*units, data[starts[-1] :]] if starts else []


def boxes(data: bytes) -> list[tuple[bytes, bytes]]:
    """The top-level boxes of `data`: (type, the whole box)."""
    found, at = [], 0
    while at + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[at : at + 8])
        if size < 8:
            break
        found.append((kind, data[at : at + size]))
        at += size
    return found


def _box(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I4s", 8 + len(body), kind) + body


def _full(kind: bytes, version: int, flags: int, body: bytes) -> bytes:
    return _box(kind, struct.pack(">I", (version << 24) | flags) + body)


def _timescale(init: bytes) -> int:
    at = init.index(b"mdhd") + 4
    version = init[at]
    at += 4 + (16 if version else 8)
    return int(struct.unpack(">I", init[at : at + 4])[0])


def _skip_priming(init: bytes, samples: int) -> bytes:
    """`init` with an edit list in its one track (`edts` after `tkhd`): presentation
    starts `samples` into the media, where decode times start at the first packet."""
    elst = _full(b"elst", 0, 0, struct.pack(">IIiHH", 1, 0, samples, 1, 0))

    def edited(kind: bytes, box: bytes) -> bytes:
        if kind == b"trak":
            tkhd, *rest = [inner for _, inner in boxes(box[8:])]
            return _box(b"trak", tkhd + _box(b"edts", elst) + b"".join(rest))
        if kind == b"moov":
            return _box(b"moov", b"".join(edited(*inner) for inner in boxes(box[8:])))
        return box

    return b"".join(edited(*box) for box in boxes(init))


def _avc1(init: bytes) -> str:
    """The RFC 6381 name of an H.264 track: its profile, constraints and level, as its
    `avcC` box gives them."""
    at = init.index(b"avcC") + 5  # past the type and configurationVersion
    return "avc1." + init[at : at + 3].hex()


def _track_id(init: bytes) -> int:
    at = init.index(b"trex") + 8
    return int(struct.unpack(">I", init[at : at + 4])[0])
