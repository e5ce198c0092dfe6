"""Streaming encodes as steps, written once for both twins.

```python
with client.stream(fps=24) as s:
    for chunk in vae.decode_chunks(latents):    # (k, H, W, 3) each, CPU or CUDA
        s.write(chunk)
print(s.result.data)
```

Each chunk goes into its own lease (or inline, without shared memory) and the daemon's
one encoder for the stream consumes the chunks in order, freeing each lease once its
frames are encoded. When the pool is full, `write` waits for a lease: the pool is the
backpressure, and the GPU is never held longer than one copy.

`StreamCore` holds a stream's state and logic; `VideoStream` and `AsyncVideoStream` run
its steps and hold the driver's side of the call (a reader thread, or a task).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import grpc
import numpy as np

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.vocabulary import SAMPLE_FORMATS

from ._audio import Pcm, prepare_audio
from ._core import ClientCore, audio_in
from ._errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    SidecarUnavailable,
    error_from_rpc,
    gone_mid_encode,
)
from ._leasing import room_within
from ._options import EncodeOptions, VideoFormat, VideoGeometry
from ._plan import copy_step, plan_ranges
from ._results import Clock, ResultBuilder
from ._steps import OnStream, OpenStream, Steps, Work
from ._types import EncodeResult, Lease
from ._video import VideoSource

# Frames sent inline travel in messages of at most 4 MiB, as the README promises: under
# gRPC's default limit, for whatever stands between the two ends.
INLINE_MESSAGE = 4 * 1024 * 1024 - 64 * 1024


class StreamCore:
    """One streaming encode: its state, and its writes, close and cancel as steps."""

    def __init__(
        self,
        client: ClientCore,
        options: EncodeOptions,
        fmt: VideoFormat,
        *,
        audio: Pcm | None = None,
        audio_format: tuple[int, int] | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        timeout: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.client = client
        self.options = options
        self.fmt = fmt
        self.audio = audio
        self.audio_format = audio_format if audio is None else (audio.sample_rate, audio.channels)
        # Output as it arrives, then None once the replies end: the twin's `chunks()`.
        self.on_data: Callable[[bytes | None], object] = lambda data: None
        # For the whole stream, from its first write: the call's gRPC deadline, and the
        # most each write waits for a lease.
        self.timeout = timeout
        self.deadline: float | None = None
        self.builder = ResultBuilder(on_progress, on_chunk)
        self.clock = clock or Clock()
        self.result: EncodeResult | None = None
        # How the call ended early: the daemon's error, or one a callback of the
        # caller's raised on the reader (given back to the caller, not blamed on the daemon).
        self.error: BaseException | None = None
        self.geometry: VideoGeometry | None = None
        self.call: Any = None  # the driver's handle, once the header is sent
        self.closed = False
        self.cancelled = False
        # Leases this stream took; after a cancel, the ones the daemon never received are
        # given back (the others the daemon frees itself).
        self.leased: list[str] = []

    # -- writing -------------------------------------------------------------------------

    def write(self, video: Any) -> Steps[None]:
        """One chunk; a float chunk's range is checked on its own (`prepare_video`)."""
        yield from self.write_source(self.client.prepare(video, self.fmt))

    def write_source(self, source: VideoSource) -> Steps[None]:
        try:
            yield from self._write_source(source)
        except SidecarUnavailable as err:
            # Once the daemon has the stream, losing it loses the video, whichever call
            # (a lease, the chunk) found it gone.
            raise gone_mid_encode(err, held=self.call is not None) from None

    def _write_source(self, source: VideoSource) -> Steps[None]:
        if self.closed:
            raise InvalidArgument("the stream is closed")
        self.raise_if_failed()
        geometry = VideoGeometry(source.width, source.height, source.pixel_format)
        if self.geometry is not None and geometry != self.geometry:
            raise InvalidArgument(
                f"chunk is {_named(geometry)}, the stream is {_named(self.geometry)}"
            )
        att = yield from self.client.attach()
        for first, count in plan_ranges(source.frames, source.frame_bytes, att):
            # A call the daemon ended (its header refused) never took the last chunk: a
            # lease now would wait for the room that chunk still holds.
            self.raise_if_failed()
            if self.client.inline:
                yield from self._open(geometry)
                yield from send_inline(self, source, first, count)
                continue
            left = self._left()
            wait = self.client.lease_wait if left is None else min(left, self.client.lease_wait)
            # The header's audio goes with the first chunk, granted together: nothing is
            # held while waiting for room.
            sizes = [count * source.frame_bytes]
            if self.call is None and self.audio is not None:
                sizes.insert(0, self.audio.nbytes)
            with self.clock.leasing():  # backpressure: the pool is full while encodes lag
                *audio_lease, lease = yield from room_within(
                    self.client.lease_together(sizes, wait, left or 1e9),
                    wait < self.client.lease_wait,
                    self.timeout or self.client.timeout,
                    started=self.call is not None,
                )
            try:
                # After a lease, so that a stale token (the daemon restarted) is renewed.
                yield from self._open(geometry, *audio_lease)
                with self.clock.copying():
                    yield copy_step(source, lease.array, first, count)
                    yield Work(source.finish, long=True)
            except GeneratorExit:
                raise
            except BaseException:
                yield from self.client.give_back([*audio_lease, lease])
                raise
            self._took(lease)
            yield from self._send(lease_chunk(lease, count))
        self.clock.transferred()

    def _open(self, geometry: VideoGeometry, audio_lease: Lease | None = None) -> Steps[None]:
        """Send the header, once, and start reading replies; its audio in `audio_lease`
        when one was leased for it."""
        if self.call is not None:
            return
        att = yield from self.client.attach()
        audio_data = None
        if self.audio is not None and audio_lease is not None:
            self._took(audio_lease)
            audio_data = audio_in(self.audio, audio_lease)
        elif self.audio is not None:
            audio_data = yield from self.client.audio_data(self.audio, self._took)
        # A whole video's length is known here (`whole`), a stream's only at its end.
        known = self.builder.frames_total
        header = self.options.header(
            att.client_token, geometry, self.audio_spec(), audio_data, frames_total=known
        )
        self.call = yield OpenStream(header, self._left(), self)
        self.geometry = geometry

    def _left(self) -> float | None:
        """Seconds left of the stream's timeout (or the client's), counted from the first
        write; None without one."""
        timeout = self.timeout or self.client.timeout
        if timeout is None:
            return None
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + timeout
        if now >= self.deadline:
            raise DeadlineExceeded(f"the stream's timeout of {timeout:g} s passed")
        return self.deadline - now

    def _send(self, message: pb.StreamRequest) -> Steps[None]:
        yield OnStream(self.call, "send", message)

    def _took(self, lease: Lease) -> None:
        self.leased.append(lease.id)

    def audio_spec(self) -> pb.AudioSpec | None:
        if self.audio is not None:
            return self.audio.spec()
        if self.audio_format is not None:
            rate, channels = self.audio_format
            f32 = cast("pb.SampleFormat", SAMPLE_FORMATS["f32"])
            return pb.AudioSpec(sample_rate=rate, channels=channels, sample_format=f32)
        return None

    # -- replies, on the driver's reader -------------------------------------------------

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Around the reader's loop over the replies: how the call ended is kept for the
        writer (`raise_if_failed`), and `chunks()` learns that the output is complete."""
        try:
            yield
        except grpc.RpcError as err:
            self.error = gone_mid_encode(error_from_rpc(err))
        except asyncio.CancelledError:
            raise  # the call aborted: its reader task is told so
        except BaseException as err:
            self.error = err
        finally:
            self.on_data(None)

    def take_reply(self, event: pb.EncodeEvent) -> None:
        data = self.builder.feed(event)  # on_chunk first, then `chunks()`
        if data is not None:
            self.on_data(data)

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    # -- ending --------------------------------------------------------------------------

    def close(self, audio: Any = None, sample_rate: int | None = None) -> Steps[EncodeResult]:
        """Finish the stream (optionally with the declared audio track); the result."""
        if self.closed:
            if self.cancelled:  # whatever the call's end looked like to either driver
                raise Cancelled("the stream was cancelled")
            if self.result is None:
                self.raise_if_failed()
                raise InvalidArgument("the stream was closed without a result")
            return self.result
        pcm = self.end_audio(audio, sample_rate)  # a wrong track leaves the stream open
        self.closed = True
        if self.call is None:
            self.on_data(None)  # no call, no reader to end `chunks()`
            raise InvalidArgument("no frames were written to the stream")
        try:
            data = (yield from self.client.audio_data(pcm, self._took)) if pcm is not None else []
            yield from self._send(pb.StreamRequest(end=pb.StreamEnd(audio_data=data)))
        finally:
            # Whatever happened above, the requests end, so the daemon ends the stream.
            yield OnStream(self.call, "end")
        if self.error is not None:
            # The call ended early (a deadline, the daemon's refusal): chunks still in
            # flight never reached the daemon, so their leases are still ours to free.
            yield from self.client.give_back(self.leased)
            raise self.error
        self.clock.stop()
        self.result = self.builder.result(self.clock)
        return self.result

    def end_audio(self, audio: Any, sample_rate: int | None) -> Pcm | None:
        if audio is None:
            return None
        if self.audio_format is None:
            raise InvalidArgument("declare the track when opening: stream(sample_rate=, channels=)")
        rate, channels = self.audio_format
        pcm = prepare_audio(audio, sample_rate or rate)
        if (pcm.sample_rate, pcm.channels) != (rate, channels):
            raise InvalidArgument(
                f"audio at the end must be {channels}-channel at {rate} Hz, as declared"
            )
        if pcm.data.dtype != np.float32:  # the declared track is float: int16 scaled to it
            pcm = Pcm((pcm.data / 32768.0).astype(np.float32), pcm.sample_rate)
        return pcm

    def cancel(self) -> Steps[None]:
        """Abandon the stream; the daemon frees every lease it was given, and the ones it
        never received go back."""
        self.closed = True
        self.cancelled = self.result is None
        if self.call is not None:
            yield OnStream(self.call, "abort")
        else:
            self.on_data(None)  # no call, no reader to end `chunks()`
        yield from self.client.give_back(self.leased)

    def whole(self, source: VideoSource) -> Steps[EncodeResult]:
        """A whole video sent as one stream (too large for the pool, or inline)."""
        self.builder.frames_total = source.frames  # the daemon learns it only at the end
        try:
            yield from self.write_source(source)
        except GeneratorExit:
            raise
        except BaseException:
            yield from self.cancel()
            raise
        return (yield from self.close())


def send_inline(core: StreamCore, source: VideoSource, first: int, count: int) -> Steps[None]:
    """Frames `first` to `first + count` of `source` inside the stream's messages."""
    buffer = np.empty(count * source.frame_bytes, dtype=np.uint8)
    with core.clock.copying():
        yield copy_step(source, buffer, first, count)
        yield Work(source.finish, long=True)
    for start in range(0, buffer.size, INLINE_MESSAGE):  # a frame may span messages
        piece = buffer[start : start + INLINE_MESSAGE].tobytes()
        yield OnStream(core.call, "send", pb.StreamRequest(chunk=pb.StreamChunk(inline=piece)))


class StreamFace:
    """What `VideoStream` and `AsyncVideoStream` share: the core, and the result."""

    def __init__(self, core: StreamCore, on_data: Callable[[bytes | None], object]) -> None:
        self._core = core
        core.on_data = on_data

    @property
    def result(self) -> EncodeResult | None:
        """The `EncodeResult`, once the stream is closed."""
        return self._core.result


def lease_chunk(lease: Lease, count: int) -> pb.StreamRequest:
    return pb.StreamRequest(
        chunk=pb.StreamChunk(range=pb.FrameRange(lease_id=lease.id, frame_count=count))
    )


def _named(geometry: VideoGeometry) -> str:
    return f"{geometry.width}x{geometry.height} {geometry.pixel_format}"
