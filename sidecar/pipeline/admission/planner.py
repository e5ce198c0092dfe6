"""Planning: a request checked completely, then its leases taken, all or nothing.

`plan()` touches no memory and takes no lease. `accept()` then copies the audio out of its
leases and takes every lease the request names in one step: if any is missing or busy,
none changes hands, and the client keeps them all. From then on the request's `FrameFeed`
owns those leases and frees each exactly once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...codec.audio_format import AudioFormat
from ...codec.ceiling import CostCeiling
from ...codec.frames import Geometry, Limits, PlacedRange, check_geometry, place_ranges
from ...codec.landing import check_place
from ...errors import InvalidRequest
from ...pool.leases import Lease, LeaseTable
from ...pool.shm import SlabSet
from ...vocabulary import DEFAULT_PROFILE
from ..encoding.feed import FrameFeed
from ..output.files import FileTarget, output_container
from ..output.live import plan_live
from ..previews.planning import plan_previews
from .plans import EncodePlan
from .requests import AudioPiece, EncodeSpec


@dataclass(frozen=True)
class Accepted:
    """A request the daemon took on: its plan, the feed that owns its leases, its audio."""

    spec: EncodeSpec
    plan: EncodePlan
    feed: FrameFeed
    audio: np.ndarray | None  # (samples, channels) float32 sent with the request, if any
    validate_ms: float


class Planner:
    def __init__(
        self,
        leases: LeaseTable,
        slabset: SlabSet,
        limits: Limits,
        output_root: Path,
        ceiling: CostCeiling | None = None,
        profile: str = DEFAULT_PROFILE,
        partial_tag: str = "vsp-00000000-00000000",
    ) -> None:
        self.partial_tag = partial_tag  # what this instance's partial files are named with
        self.ceiling = ceiling or CostCeiling()  # the operator's limit on encoder cost
        self.profile = profile  # for a request that names none
        self.leases = leases
        self.slabset = slabset
        self.limits = limits
        self.output_root = output_root

    def plan(
        self, spec: EncodeSpec, *, stream: bool = False
    ) -> tuple[EncodePlan, list[PlacedRange]]:
        """Check a request (or a stream's header) completely, touching no memory and
        taking no lease; returns the plan and where each range's frames lie."""
        v = spec.video
        geometry = check_geometry(v.width, v.height, v.pixel_format, v.fps, self.limits)
        out = spec.output
        container = output_container(out)
        frames = 0 if stream else max(0, sum(r.frame_count for r in v.ranges))
        codec = spec.codec.resolve(
            container, self.ceiling, self.profile, (v.width, v.height, frames)
        )
        codec.check_size(geometry.width, geometry.height)
        live = None
        if spec.live is not None:
            live = plan_live(self.output_root, spec.live, geometry.fps, codec.choice.encoder)
            codec = codec.for_live(live.segment_frames)
        audio = spec.audio.format.check() if spec.audio.format is not None else None
        if spec.audio.data and audio is None:
            raise InvalidRequest("audio_data", "audio samples sent without an audio format")
        ranges: list[PlacedRange] = []
        if not stream:
            leases = {
                r.lease_id: self.leases.lookup(spec.client_token, r.lease_id) for r in v.ranges
            }
            ranges = place_ranges(geometry, list(v.ranges), leases, self.limits)
        landed_at = self._landed_at(spec, geometry, ranges)
        target = None
        if out.path is not None:
            target = FileTarget.prepare(
                self.output_root, out.path, out.overwrite, container, self.partial_tag
            )
        frames_total = sum(r.frame_count for r in ranges)
        previews = plan_previews(spec.previews, geometry, frames_total)
        preview_targets: tuple[tuple[str, FileTarget], ...] = ()
        if target is not None and previews is not None:
            preview_targets = target.beside(previews.files())
        plan = EncodePlan(
            spec.request_id,
            geometry,
            codec.for_frames(frames_total),
            target,
            spec.codec.threads,
            container=container,
            audio=audio,
            frames_total=frames_total,
            one_reply=spec.one_reply is not None,
            landed_at=landed_at,
            previews=previews,
            preview_targets=preview_targets,
            live=live,
        )
        return plan, ranges

    @staticmethod
    def _landed_at(
        spec: EncodeSpec, geometry: Geometry, ranges: list[PlacedRange]
    ) -> tuple[int, int] | None:
        """Where the landed-frame count of a request whose frames still land lies."""
        offset = spec.landed_count_offset
        if not offset or not ranges:  # a stream header has no such field
            return None
        lease = ranges[-1].lease
        frames_end = max(r.end(geometry) for r in ranges if r.lease.id == lease.id)
        check_place(offset, frames_end - lease.offset, lease.size)
        return lease.slab_id, lease.offset + offset

    def accept(self, spec: EncodeSpec, *, stream: bool = False) -> Accepted:
        """Plan a whole video (or a stream's header) and take its leases, all or none."""
        t0 = time.perf_counter()
        plan, ranges = self.plan(spec, stream=stream)
        audio, audio_leases = self.audio_samples(spec.client_token, plan.audio, spec.audio.data)
        taken = [r.lease.id for r in ranges] + [lease.id for lease in audio_leases]
        self.leases.take(spec.client_token, taken)
        feed = FrameFeed(self.leases)
        for placed in ranges:
            feed.put(placed)
        feed.hold(audio_leases)
        if not stream:
            feed.end()
        return Accepted(spec, plan, feed, audio, (time.perf_counter() - t0) * 1e3)

    def accept_audio(
        self, token: str, fmt: AudioFormat | None, pieces: tuple[AudioPiece, ...], feed: FrameFeed
    ) -> np.ndarray | None:
        """A stream's closing audio: copied out; its leases join the stream's feed. A lease
        that already carries this stream's frames is freed with those frames."""
        audio, leases = self.audio_samples(token, fmt, pieces)
        mine = [lease for lease in leases if not lease.encoding]
        self.leases.take(token, [lease.id for lease in mine])
        feed.hold(mine)
        return audio

    def audio_samples(
        self, token: str, fmt: AudioFormat | None, pieces: tuple[AudioPiece, ...]
    ) -> tuple[np.ndarray | None, list[Lease]]:
        """Join audio pieces (inline or in leases) into (samples, channels) float32.

        Copies the samples out and returns the leases they came from, untouched: the
        caller takes them with the rest of the request."""
        if not pieces:
            return None, []
        if fmt is None:
            raise InvalidRequest("audio_data", "audio samples sent without an audio format")
        parts: list[bytes] = []
        used: dict[str, Lease] = {}
        for index, piece in enumerate(pieces):
            if isinstance(piece, bytes):
                parts.append(piece)
                continue
            lease = self.leases.lookup(token, piece.lease_id)
            if piece.offset < 0 or piece.size < 0 or piece.offset + piece.size > lease.size:
                raise InvalidRequest(
                    f"audio_data[{index}]", f"[{piece.offset}, +{piece.size}) is outside the lease"
                )
            start = lease.offset + piece.offset
            slab = self.slabset.slabs[lease.slab_id].array
            parts.append(slab[start : start + piece.size].tobytes())
            used[lease.id] = lease
        return fmt.samples(b"".join(parts)), list(used.values())
