"""Streaming encodes: push chunks of frames as they exist, get one video back.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from sidecar.api.v1 import sidecar_pb2 as pb

from . import _core
from ._audio import Pcm, prepare_audio
from ._base import EncodeOptions
from ._errors import InvalidArgument, SidecarError
from ._types import EncodeResult, Lease
from ._video import VideoSource

if TYPE_CHECKING:
    from ._async import AsyncSidecarClient
    from ._sync import SidecarClient

INLINE_MESSAGE = 4 * 1024 * 1024 - 64 * 1024  # under gRPC's default 4 MiB message limit


class _StreamCore:
    """What both stream twins share: geometry, messages, the reply bookkeeping."""

    def __init__(
        self,
        options: EncodeOptions,
        *,
        pixel_format: str | None,
        layout: str | None,
        value_range: tuple[float, float],
        audio: Pcm | None,
        audio_format: tuple[int, int] | None,
        on_chunk: Callable[[bytes], None] | None,
        on_progress: Callable[[int, int], None] | None,
        timeout: float | None = None,
    ) -> None:
        self.options = options
        self.timeout = timeout  # for the whole stream, as a gRPC deadline
        self.pixel_format = pixel_format
        self.layout = layout
        self.value_range = value_range
        self.audio = audio
        self.audio_format = audio_format if audio is None else (audio.sample_rate, audio.channels)
        self.on_chunk = on_chunk
        self.builder = _core.ResultBuilder(on_progress)
        self.result: EncodeResult | None = None
        self.error: SidecarError | None = None
        self.geometry: tuple[int, int, str] | None = None
        self.frames = 0
        self.clock = {"lease_ms": 0.0, "copy_ms": 0.0}
        self.started = time.perf_counter()
        # Leases this stream took; after a cancel the ones the daemon never received are
        # given back (the others the daemon frees itself).
        self.leased: list[str] = []

    def check_geometry(self, source: VideoSource) -> bool:
        """True for the first chunk (the header is due); raises on a change of size."""
        shape = (source.width, source.height, source.pixel_format)
        if self.geometry is None:
            self.geometry = shape
            return True
        if shape != self.geometry:
            raise InvalidArgument(f"chunk is {shape}, the stream is {self.geometry}")
        return False

    def audio_spec(self) -> pb.AudioSpec | None:
        if self.audio is not None:
            return self.audio.spec()
        if self.audio_format is not None:
            rate, channels = self.audio_format
            return pb.AudioSpec(
                sample_rate=rate, channels=channels, sample_format=pb.SAMPLE_FORMAT_F32
            )
        return None

    def end_audio(self, audio: Any, sample_rate: int | None) -> Pcm | None:
        if audio is None:
            return None
        if self.audio_format is None:
            raise InvalidArgument("declare the track when opening: stream(sample_rate=, channels=)")
        rate, channels = self.audio_format
        pcm = prepare_audio(audio, sample_rate or rate)
        if (pcm.sample_rate, pcm.channels) != (rate, channels) or pcm.data.dtype.kind != "f":
            raise InvalidArgument(
                f"audio at the end must be float {channels}-channel at {rate} Hz, as declared"
            )
        return pcm

    def take_reply(self, event: pb.EncodeEvent) -> bytes | None:
        data = self.builder.feed(event)
        if data is not None and self.on_chunk is not None:
            self.on_chunk(data)
        return data

    def finish(self) -> EncodeResult:
        self.clock["total_ms"] = (time.perf_counter() - self.started) * 1e3
        self.result = self.builder.result(self.clock)
        return self.result


def inline_chunks(source: VideoSource, first: int, count: int) -> Iterator[pb.StreamRequest]:
    """Frames as inline chunk messages (a frame may span messages)."""
    buffer = np.empty(count * source.frame_bytes, dtype=np.uint8)
    source.copy_into(buffer, first, count)
    source.finish()
    for start in range(0, buffer.size, INLINE_MESSAGE):
        piece = buffer[start : start + INLINE_MESSAGE].tobytes()
        yield pb.StreamRequest(chunk=pb.StreamChunk(inline=piece))


def lease_chunk(lease: Lease, count: int) -> pb.StreamRequest:
    return pb.StreamRequest(
        chunk=pb.StreamChunk(range=pb.FrameRange(lease_id=lease.id, frame_count=count))
    )


class VideoStream(_StreamCore):
    """One streaming encode on a `SidecarClient`; make it with `client.stream(...)`."""

    def __init__(self, client: SidecarClient, options: EncodeOptions, **kw: Any) -> None:
        super().__init__(options, **kw)
        self._client = client
        self._requests: queue.Queue[pb.StreamRequest | None] = queue.Queue()
        self._chunks: queue.Queue[bytes | None] = queue.Queue()
        self._call: Any = None
        self._reader: threading.Thread | None = None
        self._closed = False

    def __enter__(self) -> VideoStream:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()

    # -- writing -------------------------------------------------------------------------

    def write(self, video: Any) -> None:
        """Send a chunk: any accepted array or tensor of k frames, in order."""
        source = self._client._prepare(video, self.pixel_format, self.layout, self.value_range)
        self.write_source(source)

    def write_source(self, source: VideoSource) -> None:
        self._raise_if_failed()
        client = self._client
        opening = self.check_geometry(source)
        att = client.attach()
        for first, count in _core.plan_ranges(source.frames, source.frame_bytes, att):
            if client.inline:
                if opening:
                    self._open(source)
                    opening = False
                t0 = time.perf_counter()
                for message in inline_chunks(source, first, count):
                    self._send(message)
                self.clock["copy_ms"] += (time.perf_counter() - t0) * 1e3
            else:
                t0 = time.perf_counter()
                lease = client.lease(count * source.frame_bytes)  # waits: backpressure
                if opening:  # after a lease, so a stale token (daemon restarted) is renewed
                    try:
                        self._open(source)
                    except BaseException:
                        client.release(lease)
                        raise
                    opening = False
                t1 = time.perf_counter()
                try:
                    source.copy_into(lease.array, first, count)
                    source.finish()
                except BaseException:
                    client.release(lease)
                    raise
                self.clock["lease_ms"] += (t1 - t0) * 1e3
                self.clock["copy_ms"] += (time.perf_counter() - t1) * 1e3
                self.leased.append(lease.id)
                self._send(lease_chunk(lease, count))
            self.frames += count

    def _open(self, source: VideoSource) -> None:
        client = self._client
        att = client.attach()
        width, height, fmt = source.width, source.height, source.pixel_format
        audio_data = self._audio_data(self.audio) if self.audio is not None else None
        self._send(
            self.options.header(att.client_token, width, height, fmt, self.audio_spec(), audio_data)
        )
        self._call = client._stub_here().EncodeStream(
            iter(self._requests.get, None), timeout=self.timeout or client.timeout
        )
        self._reader = threading.Thread(target=self._read, name="video-sidecar-stream", daemon=True)
        self._reader.start()

    def _audio_data(self, pcm: Pcm) -> list[pb.AudioData]:
        client = self._client
        if client.inline:
            return pcm.inline_pieces()
        lease = client.lease(pcm.nbytes)
        self.leased.append(lease.id)
        return client._audio_in_lease(pcm, lease)

    def _send(self, message: pb.StreamRequest) -> None:
        self._requests.put(message)

    # -- reading -------------------------------------------------------------------------

    def _read(self) -> None:
        try:
            for event in self._call:
                data = self.take_reply(event)
                if data is not None:
                    self._chunks.put(data)
        except grpc.RpcError as err:
            self.error = _core.error_from_rpc(err)
        except SidecarError as err:
            self.error = err
        finally:
            self._chunks.put(None)

    def chunks(self) -> Iterator[bytes]:
        """The output as it is produced (fragmented MP4 streams while encoding)."""
        while (data := self._chunks.get()) is not None:
            yield data

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    # -- ending --------------------------------------------------------------------------

    def close(self, audio: Any = None, sample_rate: int | None = None) -> EncodeResult:
        """Finish the stream (optionally with the audio track) and wait for the result."""
        if self._closed:
            if self.result is None:
                self._raise_if_failed()
                raise InvalidArgument("the stream was cancelled")
            return self.result
        self._closed = True
        if self.geometry is None:
            raise InvalidArgument("no frames were written to the stream")
        pcm = self.end_audio(audio, sample_rate)
        try:
            data = self._audio_data(pcm) if pcm is not None else []
            self._send(pb.StreamRequest(end=pb.StreamEnd(audio_data=data)))
        finally:
            self._requests.put(None)
            if self._reader is not None:
                self._reader.join()
        self._raise_if_failed()
        return self.finish()

    def cancel(self) -> None:
        """Abandon the stream; the daemon frees every lease it was given."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()
        self._requests.put(None)
        if self._reader is not None:
            self._reader.join()
        for lease_id in self.leased:
            with contextlib.suppress(SidecarError):
                self._client.release(lease_id)


class AsyncVideoStream(_StreamCore):
    """One streaming encode on an `AsyncSidecarClient`; make it with `client.stream(...)`."""

    def __init__(self, client: AsyncSidecarClient, options: EncodeOptions, **kw: Any) -> None:
        super().__init__(options, **kw)
        self._client = client
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._closed = False

    async def __aenter__(self) -> AsyncVideoStream:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.cancel()

    async def write(self, video: Any) -> None:
        source = self._client._prepare(video, self.pixel_format, self.layout, self.value_range)
        await self.write_source(source)

    async def write_source(self, source: VideoSource) -> None:
        if self.error is not None:
            raise self.error
        client = self._client
        opening = self.check_geometry(source)
        att = await client.attach()
        for first, count in _core.plan_ranges(source.frames, source.frame_bytes, att):
            if client.inline:
                if opening:
                    await self._open(source)
                    opening = False
                t0 = time.perf_counter()
                messages = await asyncio.to_thread(list, inline_chunks(source, first, count))
                for message in messages:
                    await self._send(message)
                self.clock["copy_ms"] += (time.perf_counter() - t0) * 1e3
            else:
                t0 = time.perf_counter()
                lease = await client.lease(count * source.frame_bytes)
                if opening:  # after a lease, so a stale token (daemon restarted) is renewed
                    try:
                        await self._open(source)
                    except BaseException:
                        await client.release(lease)
                        raise
                    opening = False
                t1 = time.perf_counter()
                try:
                    await asyncio.to_thread(source.copy_into, lease.array, first, count)
                    await asyncio.to_thread(source.finish)
                except BaseException:
                    await client.release(lease)
                    raise
                self.clock["lease_ms"] += (t1 - t0) * 1e3
                self.clock["copy_ms"] += (time.perf_counter() - t1) * 1e3
                self.leased.append(lease.id)
                await self._send(lease_chunk(lease, count))
            self.frames += count

    async def _open(self, source: VideoSource) -> None:
        client = self._client
        att = await client.attach()
        audio_data = await self._audio_data(self.audio) if self.audio is not None else None
        self._call = client._stub.EncodeStream(timeout=self.timeout or client.timeout)
        header = self.options.header(
            att.client_token, source.width, source.height, source.pixel_format,
            self.audio_spec(), audio_data,
        )  # fmt: skip
        await self._send(header)
        self._reader = asyncio.create_task(self._read())

    async def _audio_data(self, pcm: Pcm) -> list[pb.AudioData]:
        client = self._client
        if client.inline:
            return pcm.inline_pieces()
        lease = await client.lease(pcm.nbytes)
        self.leased.append(lease.id)
        return client._audio_in_lease(pcm, lease)

    async def _send(self, message: pb.StreamRequest) -> None:
        try:
            await self._call.write(message)
        except grpc.RpcError as err:
            raise _core.error_from_rpc(err) from None
        except asyncio.InvalidStateError:
            if self._reader is not None:
                await self._reader
            if self.error is not None:
                raise self.error from None
            raise

    async def _read(self) -> None:
        try:
            async for event in self._call:
                data = self.take_reply(event)
                if data is not None:
                    self._chunks.put_nowait(data)
        except grpc.RpcError as err:
            self.error = _core.error_from_rpc(err)
        except SidecarError as err:
            self.error = err
        finally:
            self._chunks.put_nowait(None)

    async def chunks(self) -> AsyncIterator[bytes]:
        while (data := await self._chunks.get()) is not None:
            yield data

    async def close(self, audio: Any = None, sample_rate: int | None = None) -> EncodeResult:
        if self._closed:
            if self.result is None:
                if self.error is not None:
                    raise self.error
                raise InvalidArgument("the stream was cancelled")
            return self.result
        self._closed = True
        if self.geometry is None:
            raise InvalidArgument("no frames were written to the stream")
        pcm = self.end_audio(audio, sample_rate)
        data = await self._audio_data(pcm) if pcm is not None else []
        await self._send(pb.StreamRequest(end=pb.StreamEnd(audio_data=data)))
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await self._call.done_writing()
        if self._reader is not None:
            await self._reader
        if self.error is not None:
            raise self.error
        return self.finish()

    async def cancel(self) -> None:
        self._closed = True
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await self._reader
        for lease_id in self.leased:
            with contextlib.suppress(SidecarError):
                await self._client.release(lease_id)
