"""One encode, run to completion on an encoder thread (or, sent to an encoder process,
from the event loop: see process_route).

The job takes pieces from its feed in order (ranges in leases, or inline frames), hands
borrowed views to the encoder, and frees each lease the moment its last frame is inside
the encoder. Whatever way it ends (done, failed, cancelled), every lease it was given is
freed, or handed back to the client if nothing was read or its frames may still be
landing (see landing), and no partial file is left.

How it encodes (an encoder process, a ready encoder, a fresh one, segments) is chosen
once, when it runs: see routes, which runs it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

from ...codec.frames import PlacedRange, borrow_frames
from ...codec.grain import is_grainy
from ...codec.landing import Landing
from ...errors import Cancelled, SidecarError
from ...events import Emit, ProgressReporter
from ...pool.shm import Slab
from ..admission.plans import EncodePlan
from ..admission.requests import PreviewImage
from ..output.files import write_beside
from ..output.sinks import Made, sink_for
from ..previews.making import PreviewTaker
from ..processes.pool import EncoderProcesses
from .consume import Handing
from .failures import classify
from .feed import End, FrameFeed, InlineFrames, Piece
from .segments import SEGMENTABLE, keyframe_interval, plan_segments
from .warm import EncoderKey, WarmPool


class Slots(Protocol):
    def hold(self) -> bool: ...
    def release(self) -> None: ...
    def share(self) -> None: ...


class HeldSlot:
    """A whole video's slot: held for it from start to end by the scheduler."""

    def hold(self) -> bool:
        return True

    def release(self) -> None:
        pass

    def share(self) -> None:
        pass


class EncodeJob:
    """Runs an `EncodePlan` on the calling thread; `stop()` may be called from anywhere.

    The job owns its feed: whichever way it ends, or if it never runs (`abandon()`), every
    lease the feed holds is freed or given back exactly once.
    """

    def __init__(
        self,
        plan: EncodePlan,
        slabs: Sequence[Slab],
        feed: FrameFeed,
        emit: Emit,
        *,
        warm: WarmPool | None = None,
        processes: EncoderProcesses | None = None,
        audio: np.ndarray | None = None,
        chunk_size: int = 1024 * 1024,
        cancel: threading.Event | None = None,
    ) -> None:
        self.plan = plan
        self.feed = feed
        self._slabs = slabs
        self.emit = emit
        self.warm = warm
        self.processes = processes
        self.audio = audio  # samples sent up front, if any
        self.sink = sink_for(plan, emit, chunk_size)  # where the output goes
        # Shared with the transport, which sets it when the client goes away.
        self.cancel = cancel if cancel is not None else threading.Event()
        self.threads = plan.threads  # settled when the job runs
        self.cores = plan.threads
        self.thread_type = "FRAME"
        self.fixed_threads = False
        # The settings this job took a ready encoder for, if it went to the warm pool.
        self.warm_key: EncoderKey | None = None
        self._started = False
        self._stop_error: SidecarError | None = None
        landing = None  # frames still landing: their count
        if plan.landed_at is not None:
            slab, offset = plan.landed_at
            landing = Landing(slabs[slab].array, offset, plan.frames_total)
        self.handing = Handing(landing, self.check_stop)
        self._landing = landing
        # A stream's hold on an encode slot, chunk by chunk (see scheduler); a whole
        # video's slot is held for it from start to end.
        self.slots: Slots = HeldSlot()
        self.end: End | None = None  # what ended the feed, once `pieces` reached it
        self._fed: Iterator[Piece] | None = None  # a stream's pieces, its first looked at
        # The previews asked for, made from each piece as the encode lets go of it.
        self.previews = self._preview_taker()

    @property
    def is_stream(self) -> bool:
        """Fed chunk by chunk, its length known only at the end."""
        return not self.plan.frames_total

    def stop(self, error: SidecarError | None = None) -> None:
        """Ask the job to stop at the next frame (or never to start). `error` is what its
        client is told; by default, that it cancelled."""
        if error is not None:
            self._stop_error = error
        self.cancel.set()

    def cancelled(self) -> SidecarError:
        """The error a stopped job ends with."""
        return self._stop_error or Cancelled("cancelled by the client")

    @property
    def stopped(self) -> bool:
        return self.cancel.is_set()

    def check_stop(self) -> None:
        if self.stopped:
            raise self.cancelled()

    def failure(self, exc: BaseException) -> BaseException:
        """What the client is told of `exc`, raised while the job ran."""
        return self.cancelled() if isinstance(exc, Cancelled) else classify(exc, self.plan)

    def abandon(self) -> None:
        """Free the leases of a job that never ran; a job that ran has freed them."""
        if not self._started:
            self.let_go()

    def let_go(self) -> None:
        """Free every lease the feed still holds; or, while frames may still be landing
        in them, give them back to the client (see landing)."""
        if self.previews is not None:
            self.previews.settle()  # nothing reads a lease after this
        if self.handing.still_landing:
            self.feed.give_back_all()
        self.feed.release_all()

    def settle(self, threads: int, thread_type: str, *, fixed: bool, cores: int) -> None:
        """Its threads, as it starts to run (see `Scheduler._settle`). `threads` is what a share of
        the cores calls for, or (`fixed`) a count the request or the configuration asked
        for, which a ready encoder must match. `cores` is that share (0: `threads`):
        parallel segments divide it among themselves."""
        self._started = True
        self.threads, self.thread_type, self.fixed_threads = threads, thread_type, fixed
        self.cores = cores or threads

    # -- its frames ----------------------------------------------------------------------

    def settle_codec(self) -> None:
        """Before an encoder opens: the codec's grain settings, taken or left on the first
        frame (codec/grain.py), once it is here: a stream's first chunk is waited for,
        and frames still landing their first. A job stopped meanwhile keeps the plan's
        settings, and stops where it would have."""
        plan = self.plan
        if not plan.codec.grain:
            return
        piece = self._first_piece()
        grainy = False
        if piece is not None and self._landed_first():
            frames = self.frames_of(piece)
            geometry = plan.geometry
            grainy = len(frames) > 0 and is_grainy(frames[0], geometry.layout, geometry.height)
        self.plan = dataclasses.replace(plan, codec=plan.codec.measured(grainy))

    def _first_piece(self) -> Piece | None:
        if not self.is_stream:
            return self.feed.first()  # every piece is queued already
        fed = self._from_feed()
        try:
            first = next(fed)
        except StopIteration:
            first = None
        self._fed = fed if first is None else itertools.chain([first], fed)
        return first

    def _landed_first(self) -> bool:
        if self._landing is None:
            return True
        try:
            self._landing.wait_for(1, self.check_stop)
        except SidecarError:
            return False
        return True

    def pieces(self) -> Iterator[Piece]:
        """The feed's pieces in order, each encoded while the job holds an encode slot; at
        the feed's end, `self.end` is what ended it."""
        fed, self._fed = self._fed, None
        return fed if fed is not None else self._from_feed()

    def _from_feed(self) -> Iterator[Piece]:
        while True:
            piece = self.feed.poll()
            if piece is None:  # nothing to encode: a stream waits holding no slot
                self.slots.release()
                piece = self.feed.get(self.cancel)
            if piece is None or not self.slots.hold():
                raise self.cancelled()
            if isinstance(piece, End):
                self.end = piece
                return
            self.check_stop()
            yield piece
            self.slots.share()

    def checked(self, pieces: list[Piece]) -> Iterator[Piece]:
        """`pieces`, each once the job is not stopped."""
        for piece in pieces:
            self.check_stop()
            yield piece

    def frames_of(self, piece: Piece) -> np.ndarray:
        if isinstance(piece, InlineFrames):
            return piece.frames
        assert isinstance(piece, PlacedRange)
        # Looked up per piece: the job never keeps a view of a slab beyond its frames.
        return borrow_frames(self._slabs[piece.lease.slab_id].array, self.plan.geometry, piece)

    def _preview_taker(self) -> PreviewTaker | None:
        plan = self.plan
        if plan.previews is None:
            return None
        landing = self._landing
        wait = None if landing is None else lambda n: landing.wait_for(n, self.check_stop)
        return PreviewTaker(plan.previews, plan.geometry, stream=self.is_stream, wait_landed=wait)

    def consumed(self, piece: Piece) -> None:
        """Every frame of `piece` is inside the encoder: its lease may go, once the
        previews have what they show of it."""
        if self.previews is None:
            self.feed.consumed(piece)
        else:
            release = functools.partial(self.feed.consumed, piece)
            self.previews.take(self.frames_of(piece), release)

    def see(self, piece: Piece) -> None:
        """The previews take what they show of `piece` (the video's next frames), which
        stays leased until the job lets go of every lease."""
        if self.previews is not None:
            self.previews.take(self.frames_of(piece))

    def restart_previews(self) -> None:
        """Forget the frames the previews took (an encode that starts again takes them
        anew)."""
        if self.previews is not None and self.previews.started:
            self.previews.settle()
            self.previews = self._preview_taker()

    def finish(self, memfd: int | None, data: bytes = b"") -> tuple[Made, list[PreviewImage]]:
        """The output placed by its sink, and the previews made: written beside a file
        output, all of them or (if one cannot be) none and no video either."""
        images = self.previews.images() if self.previews is not None else []
        made = self.sink.finish(memfd, data)
        if images and self.plan.preview_targets:
            write_beside(made.path, images, dict(self.plan.preview_targets))
        return made, images

    @property
    def previews_ms(self) -> float:
        return self.previews.seconds * 1e3 if self.previews is not None else 0.0

    def after_frame(self, progress: ProgressReporter) -> None:
        """Run after each frame: counts it, and stops the encode once asked to."""
        progress.add(1)
        self.check_stop()

    # -- its settings --------------------------------------------------------------------

    @property
    def key(self) -> EncoderKey:
        fixed = self.threads if self.fixed_threads else 0
        return EncoderKey.of(self.plan.geometry, self.plan.codec, self.thread_type, fixed)

    @property
    def segments(self) -> list[tuple[int, int]]:
        """The segments a whole video is cut into (one: not cut; see segments)."""
        plan = self.plan
        # A live package takes its packets from one encoder, in order.
        if not plan.frames_total or plan.codec.choice.encoder not in SEGMENTABLE or plan.live:
            return [(0, plan.frames_total)]
        return plan_segments(plan.frames_total, self.cores, keyframe_interval(plan.codec))

    @property
    def for_processes(self) -> bool:
        """Whether an encoder process may take this job: an MP4 without audio, all of it
        sent at once, and not a video this job cuts into segments (those are encoded
        here, across the job's share of the cores)."""
        plan = self.plan
        if plan.container != "mp4" or plan.audio is not None or self.audio is not None:
            return False
        if plan.live is not None:
            return False
        return plan.frames_total > 0 and len(self.segments) < 2

    @property
    def warmable(self) -> bool:
        plan = self.plan
        return (
            self.warm is not None
            and plan.container == "mp4"
            and plan.audio is None
            and plan.live is None
            and plan.frames_total > 0
            and self.warm.eligible(plan.geometry, plan.frames_total)
        )
