"""An encoder process's ready encoder: one, opened for the settings it served last (or was
asked to prepare), and the colour converters kept for the last few settings.

The daemon's own ready encoders, many per setting and opened on a thread, are the warm
pool's (see warm); a process serves one request at a time, so it keeps one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...codec.catalogue import ResolvedCodec
from ...codec.colour import FrameConverter
from ...codec.frames import Geometry
from ..encoding.warm import EncoderKey, WarmEncoder, open_in_memory

KEPT_CONVERTERS = 4  # colour converters kept for the settings served last


@dataclass(frozen=True)
class EncoderSettings:
    """What opening an encoder takes."""

    key: EncoderKey
    geometry: Geometry
    codec: ResolvedCodec
    threads: int
    thread_type: str


class ReadySlot:
    def __init__(self) -> None:
        self._ready: tuple[EncoderKey, WarmEncoder] | None = None
        # Colour converters kept from one encoder to the next of the same settings: the
        # refill then opens x264 alone, and no swscale set-up (3 of its 7 ms, and 5 ms of
        # CPU, at 1344x768 on two cores) competes with the next request's encode.
        self.converters: dict[tuple[Geometry, int], FrameConverter] = {}

    @property
    def holds(self) -> bool:
        return self._ready is not None

    def suits(self, job: EncoderSettings) -> bool:
        """Whether the ready encoder may serve `job`. A long video's frame threads must
        be the job's share of the cores: one opened with all of them for a request that
        ran alone would crowd seven others out. (A clip of a few frames takes it anyway:
        its threads are busy for a few milliseconds, and the open would cost more.)"""
        if self._ready is None or self._ready[0] != job.key:
            return False
        return job.thread_type != "FRAME" or self._ready[1].threads == job.threads

    def take(self, job: EncoderSettings) -> WarmEncoder | None:
        """The ready encoder, if it suits `job` (else it is closed)."""
        if self._ready is not None and self.suits(job):
            warm, self._ready = self._ready[1], None
            return warm
        self.discard()
        return None

    def open(self, job: EncoderSettings) -> WarmEncoder:
        """An encoder for `job` now, with the converter kept for its settings."""
        return open_in_memory(
            job.geometry, job.codec, job.threads, job.thread_type, self.converter(job)
        )

    def prepare(self, job: EncoderSettings) -> EncoderKey | None:
        """Have an encoder ready for `job`'s settings: the one held, or a new one."""
        if self.suits(job):
            return job.key  # one is ready already
        self.discard()
        return self.refill(job)

    def refill(self, job: EncoderSettings) -> EncoderKey | None:
        """Open the next encoder for `job`'s settings; None if that failed."""
        try:
            converter = self.converter(job)
            warm = open_in_memory(
                job.geometry, job.codec, job.threads, job.thread_type, converter, prime=True
            )
        except Exception:  # the request already had its answer; simply not ready
            return None
        self._ready = (job.key, warm)
        return job.key

    def converter(self, job: EncoderSettings) -> FrameConverter:
        """The converter for `job`'s settings, kept for the next encoder of them (the
        last few settings only)."""
        key = FrameConverter.key_for(job.geometry, job.threads)
        converter = self.converters.pop(key, None) or FrameConverter(job.geometry, job.threads)
        self.converters[key] = converter  # the most recent last
        while len(self.converters) > KEPT_CONVERTERS:
            del self.converters[next(iter(self.converters))]
        return converter

    def discard(self) -> None:
        if self._ready is not None:
            self._ready[1].discard()
            self._ready = None
