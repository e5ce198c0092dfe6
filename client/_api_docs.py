"""The documentation of the public methods both twins share (see `_api`), kept apart
from their code: `help()` shows it, through `documented`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])


def documented(doc: str) -> Callable[[F], F]:
    """Give the decorated function `doc` as its docstring."""

    def document(function: F) -> F:
        function.__doc__ = doc
        return function

    return document


ENCODE_DOC = """Encode `video`; the MP4 (or WebM) as bytes, or as a file under the output root.

`AsyncSidecarClient.encode` is the same, awaited.

Args:
    video: a numpy array or torch tensor (CPU or CUDA) of uint8, float16, bfloat16,
        float32 or float64; or a list of frames as diffusers pipelines return them
        (PIL images, (H, W, C) arrays, (C, H, W) or (H, W, C) tensors), or
        `pipe(...).frames` of one video. Frames are copied once, straight into
        leased shared memory (a list frame by frame, never stacked whole); CUDA
        tensors are converted on the GPU and copied device-to-host into the lease.
        A video larger than half the pool goes as a stream, by itself.
    fps: frames per second: any real number (numpy's and `Fraction` too) or
        (numerator, denominator).
    path: the output file (a str or `os.PathLike`), relative to the daemon's output
        root or absolute inside it; without it the bytes come back in
        `result.data`. To write anywhere else, see `export_to_video`.
    overwrite: replace an existing file at `path` (else `AlreadyExists`).
    pixel_format: what travels. None: float RGB in a CUDA tensor is converted to
        yuv420p on the GPU, uint8 RGB there once the fused kernel is compiled (a
        video of 8 MiB or more has it compiled in the background; until then it goes
        as rgb24, a plain copy), other RGB goes as rgb24. "rgb24" sends RGB as it is,
        for the daemon to convert (byte-exact with its swscale, the choice when
        outputs must match a CPU encode bit for bit); "yuv420p" or "nv12"
        convert RGB to 4:2:0 BT.709 before the copy (half the bytes, no
        conversion in the daemon); "bgr24", "rgba" and "gray" are taken as they
        are. A uint8 numpy array (T, H*3/2, W) with "yuv420p" or "nv12" is taken
        as already converted.
    layout: "THWC", "TCHW", "CTHW", or with B=1 "BCTHW" (a VAE's), "BTHWC" or
        "BTCHW" (diffusers' np and pt outputs); for a list, "THWC" or "TCHW" says
        how its frames lie. None reads it from the shape: the one layout that puts
        1, 3 or 4 channels on its channel axis (frames 4 pixels wide or high count
        only if no reading has larger ones). Tie-breaks: one frame of C channels
        beats C gray frames, so (1, 3, H, W) is one RGB frame; in 5-D, RGB beats
        RGBA, so (1, 3, 4, H, W) is a VAE's 4 frames and (1, 4, 3, H, W) a
        pipeline's 4 frames. Any other shape with two readings, e.g.
        (3, 3, H, W), is InvalidVideo naming them: pass `layout=`.
    value_range: the range of float input, (0, 1) or (-1, 1). A sample of the
        video (a few frames, a strided grid of each; each chunk of a stream) is
        checked: when more than 1% of it lies outside the range by more than 5%
        of its width, the video was read in the wrong range and is refused,
        InvalidVideo naming the values seen and the fix (usually
        value_range=(-1, 1)). Fewer such values are clipped, and their count is
        logged on the `client` logger. Checked on the device for CUDA tensors:
        one small reduction, one wait for it.
    audio: PCM, (samples, channels) or (samples,), float32 in [-1, 1] or int16;
        muxed as AAC (MP4) or Opus (WebM), trimmed or padded to the video.
    sample_rate: the audio's rate in Hz; required with `audio`.
    container: "mp4" (index first), "fmp4" (fragmented MP4) or "webm" (VP9, Opus);
        empty: the file's extension says (.mp4, .webm), and bytes are MP4. A file name
        that disagrees with `container`, or ends otherwise, is refused.
    codec: "h264", "h265" or "av1"; empty for the container's default.
    crf: the encoder's quality (lower is better); None for the profile's.
    preset: the encoder's speed preset, e.g. "veryfast"; None for the profile's.
    profile: "fast", "balanced" or "small": settings chosen for generated video
        (docs/performance.md); None for the daemon's `--profile`. `crf`, `preset`
        and `extra` given beside it win over its own.
    bitrate: bits per second, for a bitrate-controlled encode instead of `crf`.
    gop: frames between keyframes; None for the default.
    threads: encoder threads; 0 lets the daemon share its cores among encodes.
    extra: more encoder options, e.g. {"tune": "film"}.
    request_id: the id the daemon logs this request under and returns in
        `result.request_id`; empty for a generated one.
    thumbnail: one frame as a still image beside the video, in
        `result.thumbnail`: a `Thumbnail(at="middle", max_width=None,
        max_height=None, format="jpeg", quality=None)`, `at` "first", "middle",
        "last", a frame index (int) or a time in seconds (float); None is the
        daemon's default (640x360, quality 85). True: the defaults.
    sprite_sheet: frames as tiles of one image, for a seek bar, in
        `result.sprite_sheet` with its layout (`Preview.tile_at(time_s)`): a
        `SpriteSheet(tiles=None, interval_s=None, tile_width=None, columns=None,
        format="jpeg", quality=None)`, `tiles` frames evenly spread or one every
        `interval_s`; None is the daemon's default (10 tiles, 160 pixels wide, 5
        to a row), and 0 is refused. True: the defaults. Previews come back as the video does: files
        beside a file output (`jobs/42.mp4` gets `jobs/42.thumbnail.jpg` and
        `jobs/42.sprites.jpg`; `overwrite` applies to them too), else their bytes
        in `Preview.data`. Limits: docs/previews.md.
    live: an LL-HLS/CMAF package of the video, written as it is encoded into a
        folder of the daemon's output root, for any static HTTP server to serve
        while it is made: a folder, or `Live(folder, segment_s=2.0, part_s=0.5,
        overwrite=False)`. H.264 only; the video (and the package) is then
        encoded without B-frames, a keyframe every segment (docs/live.md).
    on_chunk: called with each piece of the output, in order, as it arrives:
        while encoding with container="fmp4", at the end otherwise; never with
        `path`. `result.data` still holds the whole file.
    on_progress: called with (frames done, frames in all) while encoding; the
        total is the video's length from the first call.
    timeout: seconds for the whole call (a gRPC deadline); None for the client's.

Without `on_chunk` and `on_progress`, a video is answered in one reply with its
output inside (or in a lease): a request on a connection to the daemon's framed
socket that the client keeps open for the next one (one per encode in flight; a
`timeout` closes it, which stops the encode). Without that socket (TCP, or a
daemon that serves none), and with callbacks, it is `Encode`, a reply stream. On
the framed socket a CUDA video of 32 MiB or more is sent while its GPU copy
still runs, and the daemon starts on each frame as it lands
(`sidecar.codec.landing`). A video larger than half the pool, or sent inline,
goes as an `EncodeStream`.

Returns:
    An `EncodeResult`: `data` or `path`, frames, duration, size and timings; the
    previews asked for in `previews` (also `thumbnail`, `sprite_sheet`).

Raises:
    InvalidVideo: the video cannot be used as given (shape, dtype, layout, range).
    SidecarError: the subclass says why (see the exception tree in `client`).
"""

STREAM_DOC = """A streaming encode: `with client.stream(fps=24) as s: s.write(chunk)`.

On `AsyncSidecarClient`: `async with client.stream(...) as s: await s.write(chunk)`.
Each chunk goes into its own lease, freed once its frames are encoded; `write`
waits for a lease while the pool is full. Leaving the block with an exception
cancels the stream and frees its leases; after the block, `s.result` holds the
`EncodeResult`.

Args:
    fps, path, overwrite, pixel_format, layout, value_range, container, codec,
    crf, preset, profile, bitrate, gop, threads, extra, request_id, live: as for
        `encode` (each chunk of floats has its range checked; a live package's
        parts appear as the chunks are encoded, for viewers to watch).
    thumbnail, sprite_sheet: as for `encode`, but a stream's length is known only
        at its end: a thumbnail is the first or last frame, or one by index or time
        (True: the first; at="middle" is refused), and a sprite sheet takes a tile
        every `interval_s` seconds (True: every second; `tiles` is refused).
    on_progress: as for `encode`, but the total is 0 until the last call: a
        stream's length is known only when it is closed.
    audio: a PCM track sent with the first chunk (with `sample_rate`).
    sample_rate: the audio's rate in Hz.
    channels: with `sample_rate` and no `audio`: declares the track now, and the
        samples follow in `s.close(audio=...)`.
    on_chunk: called with each piece of output as it arrives; with
        container="fmp4" and no `path` that is while encoding. Or iterate
        `s.chunks()` (from another thread, or task).
    timeout: seconds for the whole stream, from the first `write` to the result
        (its call's gRPC deadline; a `write` waiting for a lease waits no longer);
        None for the client's. Past it, `write` or `close` raises
        `DeadlineExceeded` and the daemon stops the encode and frees its leases.
"""

ENCODE_LEASED_DOC = """Encode frames you wrote into leases yourself (see `lease()`).

`AsyncSidecarClient.encode_leased` is the same, awaited.

Args:
    ranges: the frames, in order: `FrameRange(lease, frame_count, offset=0,
        row_stride=0, frame_stride=0)`, strides in bytes, 0 for tightly packed.
    width, height: the frame size in pixels.
    pixel_format: the frames' format in the leases: "rgb24", "bgr24", "rgba",
        "gray", "yuv420p" or "nv12".
    fps, path, overwrite, container, codec, crf, preset, profile, bitrate, gop,
    threads, extra, request_id, thumbnail, sprite_sheet, live, on_progress, timeout:
    as for `encode`.

The daemon frees each lease once its frames are encoded; a refused request leaves
them with you.
"""
