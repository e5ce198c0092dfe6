"""`export_to_video`: a drop-in for `diffusers.utils.export_to_video`.

    from client import export_to_video          # was: from diffusers.utils import ...
    export_to_video(pipe(prompt).frames[0], "out.mp4", fps=16)

It takes what diffusers' takes, and what pipelines return as they return it (a list of
PIL images, a list of arrays, an array or a tensor, `pipe(...).frames` of one video), with
diffusers' signature and defaults, and returns the path as diffusers does. The encode
runs in the daemon: where none answers, one is started in the background and stops by
itself when idle (`_autostart`). The file is written here, by the client, atomically and
wherever the caller may write, from the bytes the daemon sends back.

How diffusers' parameters are read:

- `quality` (0-10, default 5) is a CRF as imageio-ffmpeg makes it,
  `crf = int((1 - quality / 10) * 51)`: 5 gives 25, for libx264's `medium` preset. The
  daemon encodes at its profile's preset ("balanced": `veryfast`), where a CRF makes other
  sizes; so for H.264 the CRF is moved by the profile's calibration (balanced: -3, to 22),
  and quality 5 makes the sizes and PSNR of diffusers' own export (docs/integrations.md).
  VP9 and AV1 take it on their 0-63 scale. None leaves the CRF to the profile; `crf=`
  is sent as it is.
- `bitrate` (bits per second, or a string such as "2M" or "800k") gives a
  bitrate-controlled encode instead.
- `macro_block_size` is accepted and changes nothing: the frames' own size is kept (no
  scaling up to a multiple of 16, as imageio does), and an odd width or height is refused,
  naming the crop, as every encode refuses it.
- An existing file is replaced, as diffusers replaces it (`overwrite=False` to refuse).

The encode options of `SidecarClient.encode` are taken as keywords.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.vocabulary import (
    DEFAULT_PROFILE,
    H264_PROFILE_CRF,
    IMAGEIO_MEDIUM_CRF,
    h264_profile_crf,
)

from ._autostart import ensure_daemon
from ._checks import finite, whole
from ._errors import FailedPrecondition, InvalidArgument, SidecarUnavailable
from ._files import CommitError, OutputError, OutputFile, Outputs
from ._options import Fps
from ._previews import SpriteSheet, Thumbnail
from ._sync import SidecarClient
from ._video import video_geometry

CRF_SCALE = {"vp9": 63, "libvpx-vp9": 63, "av1": 63, "libsvtav1": 63, "svtav1": 63}
H264_NAMES = ("", "h264", "avc", "x264", "libx264")
BITRATE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgG]?)")
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}

# `export_to_video`'s keywords that go to `SidecarClient.encode` as they are.
PASSED_ON = (
    "fps", "value_range", "layout", "codec", "preset", "profile", "gop", "extra", "audio",
    "sample_rate", "thumbnail", "sprite_sheet", "timeout",
)  # fmt: skip

_clients: dict[tuple[int, str | None], SidecarClient] = {}
_clients_lock = threading.Lock()


def export_to_video(
    video_frames: Any,
    output_video_path: str | os.PathLike[str] | None = None,
    fps: Fps = 10,
    quality: float | None = 5.0,
    bitrate: int | str | None = None,
    macro_block_size: int | None = 16,
    *,
    value_range: tuple[float, float] = (0, 1),
    layout: str | None = None,
    codec: str = "",
    crf: int | None = None,
    preset: str | None = None,
    profile: str | None = None,
    gop: int | None = None,
    extra: Mapping[str, Any] | None = None,
    audio: Any = None,
    sample_rate: int | None = None,
    thumbnail: Thumbnail | bool | None = None,
    sprite_sheet: SpriteSheet | bool | None = None,
    overwrite: bool = True,
    socket: str | None = None,
    timeout: float | None = None,
) -> str:
    """Encode `video_frames` into `output_video_path` (None: a new temporary .mp4 file)
    and return that path. See this module's docstring for diffusers' parameters, and
    `SidecarClient.encode` for the rest; `socket`: the daemon's (None: the default one,
    or $VIDEO_SIDECAR_SOCKET). Previews asked for are written beside the video
    (`out.thumbnail.jpg`, `out.sprites.jpg`)."""
    passed = {name: value for name, value in locals().items() if name in PASSED_ON}
    # The profile named, so that `quality` and the daemon read one CRF scale (not the
    # operator's default profile, which encode() follows).
    passed["profile"] = profile = DEFAULT_PROFILE if profile is None else profile
    crf, bitrate = _rate(quality, bitrate, crf, codec, profile, video_frames, layout)
    if macro_block_size is not None:
        whole("macro_block_size", macro_block_size, 1, 2**16)
    path = _output_path(output_video_path)
    outputs = _reserved(path, overwrite or output_video_path is None, thumbnail, sprite_sheet)
    try:
        options = {**passed, "container": outputs.video.container, "crf": crf, "bitrate": bitrate}
        try:
            result = _client(socket).encode(video_frames, **options)
        except SidecarUnavailable:
            # The daemon went away between two calls (stopped when idle, restarted): the
            # frames are still here, so start one and send them again, once.
            result = _client(socket, restart=True).encode(video_frames, **options)
        try:
            outputs.commit(result)
        except CommitError as exc:
            raise FailedPrecondition(str(exc)) from None
    finally:
        outputs.discard()
    return path


def _rate(
    quality: Any, bitrate: Any, crf: Any, codec: Any, profile: str, video: Any, layout: Any
) -> tuple[Any, int | None]:
    """(crf, bitrate) as the request carries them: `bitrate` in bits per second, else
    `crf`, else the CRF `quality` makes for this video."""
    if bitrate is not None:
        return crf, bits_per_second(bitrate)
    if crf is None and quality is not None:
        return crf_of(quality, codec, profile, video_geometry(video, layout)), None
    return crf, None


def _reserved(path: str, overwrite: bool, thumbnail: Any, sprite_sheet: Any) -> Outputs:
    """The video's file and its previews' beside it, checked and reserved."""
    asked = {"thumbnail": thumbnail, "sprite_sheet": sprite_sheet}
    previews = {
        kind: p.format if isinstance(p, (Thumbnail, SpriteSheet)) else "jpeg"
        for kind, p in asked.items()
        if p
    }
    outputs = Outputs(OutputFile(Path(path), overwrite), previews)
    try:
        outputs.reserve()
    except OutputError as exc:
        outputs.discard()
        raise InvalidArgument(f"output_video_path: {exc}") from None
    return outputs


def crf_of(
    quality: Any, codec: Any = "", profile: str = DEFAULT_PROFILE, video: tuple[int, ...] = ()
) -> int:
    """The CRF for `quality` 0-10: imageio-ffmpeg's, `int((1 - quality / 10) * 51)` (5
    gives 25), which is libx264 `medium`'s; for H.264 moved to the profile's own scale,
    where its preset makes what `medium` makes at 25 (balanced: 22 to 24, by the `video`'s
    (width, height, frames); `sidecar.vocabulary.h264_profile_crf`). VP9 and AV1 take it
    on their 0-63 scale, H.265 as it is."""
    value = finite("quality", quality)
    if not 0 <= value <= 10:
        raise InvalidArgument(f"quality must be 0 to 10, got {quality!r}")
    name = codec.strip().lower() if isinstance(codec, str) else ""
    crf = int((1 - value / 10) * CRF_SCALE.get(name, 51))
    if name in H264_NAMES and profile in H264_PROFILE_CRF:
        crf += h264_profile_crf(profile, *video) - IMAGEIO_MEDIUM_CRF
    return min(max(crf, 0), 51 if name not in CRF_SCALE else 63)


def bits_per_second(bitrate: Any) -> int:
    """`bitrate` as bits per second: a whole number, or a string as ffmpeg writes one
    ("800k", "2.5M")."""
    if isinstance(bitrate, str):
        match = BITRATE.fullmatch(bitrate.strip())
        if match is None:
            raise InvalidArgument(
                f"bitrate must be bits per second, or a string such as '2M' or '800k', "
                f"got {bitrate!r}"[:200]
            )
        return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    return whole("bitrate", bitrate, 1, 2**63 - 1)


def _output_path(given: Any) -> str:
    if given is None:
        fd, name = tempfile.mkstemp(suffix=".mp4", prefix="video-")
        os.close(fd)
        return name
    if isinstance(given, os.PathLike):
        given = os.fspath(given)
    if not isinstance(given, str) or not given:
        raise InvalidArgument(f"output_video_path must be a path or None, got {given!r}"[:200])
    return given


def _client(socket: str | None, restart: bool = False) -> SidecarClient:
    """This process's client for `socket`, made once (it maps the slabs once), with a
    daemon started for it where none answers."""
    key = (os.getpid(), socket)
    with _clients_lock:
        client = _clients.get(key)
        if client is None or restart:
            target = ensure_daemon(socket)
            if client is None:
                client = _clients[key] = SidecarClient(target, client_name="export_to_video")
        return client
