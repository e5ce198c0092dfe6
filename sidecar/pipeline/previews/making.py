"""The previews made beside the encode, from the frames in the leases.

The encode hands each piece of the video to `PreviewTaker.take` as it lets go of it (its
frames landed and inside the encoder, its lease not yet freed). The taker picks the few
frames its previews show there, on the caller's thread; the scaling, each frame straight
from the lease to its image's size, runs on the daemon's preview threads beside the
encode (swscale drops the GIL), and so does each image's encoding once all its frames
are in.
A piece holding such a frame is let go (`release`) once they are scaled; the rest at
once. `images` then waits for what is left: for a whole video, usually nothing.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ...codec.frames import Geometry
from ...codec.images import encode_image, scale_rgb
from ..admission.requests import PreviewImage
from .planning import PreviewPlan, SheetPlan, ThumbnailPlan

# (kind, frame index, width, height): a frame to scale, and to what size.
Pick = tuple[str, int, int, int]
# The daemon's threads for previews, shared by its requests and started on first use.
PREVIEW_THREADS = 2


@functools.cache
def _workers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(PREVIEW_THREADS, thread_name_prefix="previews")


class PreviewTaker:
    """Makes one request's previews. `take` from one thread, in the video's order;
    `images` once, at the end; `settle` always, before the leases go."""

    def __init__(
        self,
        plan: PreviewPlan,
        geometry: Geometry,
        *,
        stream: bool,
        wait_landed: Callable[[int], None] | None = None,
    ) -> None:
        self.plan = plan
        self._geometry = geometry
        self._stream = stream
        # Frames that may still be landing: returns once this many have (or raises).
        self._wait_landed = wait_landed
        self._seen = 0  # frames taken so far
        self._thumb_found = False  # the thumbnail's own frame is picked
        self._wanted = list(plan.sheet.frames) if plan.sheet is not None else []
        self._next_tile = 0  # a stream's: the next tile's number
        # Written by the preview threads, under the lock.
        self._lock = threading.Lock()
        self._thumb: tuple[int, np.ndarray] | None = None
        self._tiles: list[tuple[int, np.ndarray]] = []
        self._made: dict[str, PreviewImage] = {}
        self._pending: list[Future[None]] = []
        self._settled = False
        self.seconds = 0.0  # spent scaling and encoding, much of it beside the encode

    # -- the caller's side ---------------------------------------------------------------

    def take(self, frames: np.ndarray, release: Callable[[], None] | None = None) -> None:
        """The video's next `len(frames)` frames, still leased; `release` lets them go,
        called once they are no longer needed here (maybe at once, maybe from the worker)."""
        first, self._seen = self._seen, self._seen + len(frames)
        picks = self._picks(first)
        if not picks:
            if release is not None:
                release()
            return
        self._pending = [f for f in self._pending if not f.done() or f.exception()]
        self._pending.append(_workers().submit(self._scale, frames, first, picks, release))

    @property
    def started(self) -> bool:
        """Whether it has taken any frame."""
        return self._seen > 0

    def images(self) -> list[PreviewImage]:
        """The previews, the thumbnail first, once all their frames are taken."""
        for future in self._pending:
            future.result()  # a failure here fails the request
        t0 = time.perf_counter()
        with self._lock:
            made = dict(self._made)
            if "thumbnail" not in made and self._thumb is not None:
                made["thumbnail"] = self._thumbnail()
            if "sprite_sheet" not in made and self._tiles:
                made["sprite_sheet"] = self._sheet()
        self.seconds += time.perf_counter() - t0
        return [made[kind] for kind in ("thumbnail", "sprite_sheet") if kind in made]

    def settle(self) -> None:
        """Wait for this request's work: nothing of it reads a lease after this."""
        self._settled = True
        for future in self._pending:
            future.exception()  # waits; a failure was the request's to tell, or nobody's

    def _picks(self, first: int) -> list[Pick]:
        """What of frames [first, seen) the previews show."""
        picks: list[Pick] = []
        thumb, sheet = self.plan.thumbnail, self.plan.sheet
        if thumb is not None and not self._thumb_found:
            at = thumb.index
            if at is None or (self._stream and at >= self._seen):
                at = self._seen - 1  # a stream's last frame so far, until a later one
            if first <= at < self._seen:
                picks.append(("thumbnail", at, thumb.width, thumb.height))
                self._thumb_found = at == thumb.index
        if sheet is not None:
            tiles = self._sheet_frames(sheet)
            picks += [("tile", i, sheet.tile_width, sheet.tile_height) for i in tiles]
        return picks

    def _sheet_frames(self, sheet: SheetPlan) -> list[int]:
        """The frames the sprite sheet shows up to the last one seen."""
        taken = []
        if sheet.frames:
            while self._wanted and self._wanted[0] < self._seen:
                taken.append(self._wanted.pop(0))
            return taken
        while self._next_tile < sheet.tiles:
            index = math.floor(self._next_tile * sheet.every)
            if index >= self._seen:
                break
            taken.append(index)
            self._next_tile += 1
        return taken

    # -- the worker's side ---------------------------------------------------------------

    def _scale(
        self, frames: np.ndarray, first: int, picks: list[Pick], release: Callable[[], None] | None
    ) -> None:
        t0 = time.perf_counter()
        try:
            for kind, index, width, height in picks:
                if self._wait_landed is not None:
                    self._wait_landed(index + 1)
                if self._settled:
                    break  # the request ended meanwhile: its leases are about to go
                rgb = scale_rgb(frames[index - first], self._geometry.layout, width, height)
                self._keep(kind, index, rgb)
        finally:
            if release is not None:
                release()
            self.seconds += time.perf_counter() - t0

    def _keep(self, kind: str, index: int, rgb: np.ndarray) -> None:
        """A scaled frame kept; an image whose frames are all in, encoded now (a whole
        video's: a stream's may take later frames still)."""
        with self._lock:
            thumb, sheet = self.plan.thumbnail, self.plan.sheet
            if kind == "thumbnail":
                if self._thumb is not None and self._thumb[0] > index:
                    return  # a stream's later frame came first (the work may interleave)
                self._thumb = (index, rgb)
                if not self._stream and thumb is not None and index == thumb.index:
                    self._made["thumbnail"] = self._thumbnail()
                return
            self._tiles.append((index, rgb))
            if not self._stream and sheet is not None and len(self._tiles) == len(sheet.frames):
                self._made["sprite_sheet"] = self._sheet()

    # -- the images (under the lock) -----------------------------------------------------

    def _thumbnail(self) -> PreviewImage:
        thumb = self.plan.thumbnail
        assert thumb is not None and self._thumb is not None
        index, rgb = self._thumb
        return _image("thumbnail", thumb, rgb, (index,), self._geometry)

    def _sheet(self) -> PreviewImage:
        sheet = self.plan.sheet
        assert sheet is not None
        tiles = sorted(self._tiles, key=lambda tile: tile[0])
        columns = min(sheet.columns, len(tiles))
        rows = -(-len(tiles) // columns)
        tw, th = sheet.tile_width, sheet.tile_height
        canvas = np.zeros((rows * th, columns * tw, 3), np.uint8)
        for i, (_, rgb) in enumerate(tiles):
            row, col = divmod(i, columns)
            canvas[row * th : (row + 1) * th, col * tw : (col + 1) * tw] = rgb
        image = _image("sprite_sheet", sheet, canvas, tuple(i for i, _ in tiles), self._geometry)
        image.tile_width, image.tile_height, image.columns, image.rows = tw, th, columns, rows
        return image


def _image(
    kind: str,
    plan: ThumbnailPlan | SheetPlan,
    rgb: np.ndarray,
    frames: tuple[int, ...],
    geometry: Geometry,
) -> PreviewImage:
    return PreviewImage(
        kind,
        plan.format.mime_type,
        plan.format.suffix,
        encode_image(rgb, plan.format, plan.quality),
        rgb.shape[1],
        rgb.shape[0],
        frames,
        tuple(float(index / geometry.fps) for index in frames),
    )
