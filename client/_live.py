"""A live LL-HLS/CMAF package, asked for beside an encode's output (docs/live.md)."""

from __future__ import annotations

import math
import os
import posixpath
from dataclasses import dataclass

from sidecar.api.v1 import sidecar_pb2 as pb

from ._errors import InvalidArgument


@dataclass(frozen=True)
class Live:
    """Where and how the daemon writes a live package of the video, as it encodes it:
    `folder` under its output root (relative, or absolute inside it); media segments of
    `segment_s` seconds (1-10), each starting with a keyframe; LL-HLS parts of `part_s`
    seconds (0.1-2, at most half a segment). `overwrite` replaces a package there.

    What viewers open, as paths like `folder`: `playlist` (the video's media playlist,
    always), and, where the encode has audio, `multivariant_playlist`: the video with
    its audio rendition."""

    folder: str | os.PathLike[str]
    segment_s: float = 2.0
    part_s: float = 0.5
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.folder, (str, os.PathLike)):
            raise InvalidArgument(f"live.folder: a path, got {type(self.folder).__name__}")
        object.__setattr__(self, "folder", os.fspath(self.folder))
        for name in ("segment_s", "part_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidArgument(f"live.{name}: a number of seconds, got {value!r}")
            if not math.isfinite(value):
                raise InvalidArgument(f"live.{name}: a finite number of seconds, got {value!r}")
        if not isinstance(self.overwrite, bool):
            raise InvalidArgument(f"live.overwrite: True or False, got {self.overwrite!r}")

    @property
    def playlist(self) -> str:
        return posixpath.join(os.fspath(self.folder), "index.m3u8")

    @property
    def multivariant_playlist(self) -> str:
        return posixpath.join(os.fspath(self.folder), "master.m3u8")


def live_of(live: Live | str | os.PathLike[str] | None) -> Live | None:
    """`live=` as given: a `Live`, or a folder for the defaults."""
    if live is None or isinstance(live, Live):
        return live
    if isinstance(live, (str, os.PathLike)):
        return Live(live)
    raise InvalidArgument(f"live: a folder or a Live, got {type(live).__name__}")


def live_proto(live: Live | None) -> pb.LivePackage | None:
    if live is None:
        return None
    return pb.LivePackage(
        folder=os.fspath(live.folder),
        segment_s=float(live.segment_s),
        part_s=float(live.part_s),
        overwrite=live.overwrite,
    )
