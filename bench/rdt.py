"""Rate, distortion and time: what each way of making an MP4 costs, beside what it makes.

    python -m bench.rdt                                    # the default table (see below)
    python -m bench.rdt --device cuda --json out.json      # on the GPU host
    python -m bench.rdt --variants dropin,export_to_video --shapes 448x256x17,832x480x81
    python -m bench.rdt --sweep veryfast:20-24,medium:25 --contents natural

Every variant encodes the same frames, side by side in one run (samples interleaved), and
each row records its median time, the bytes it wrote, PSNR against the frames (RGB, all
frames) and SSIM (luma, every 8th frame). Speed is only ever read beside size and
quality: the report gives each variant's time, bytes and PSNR as ratios to the anchor.

The anchor is what a diffusers user runs today, `export_to_video` (libx264 `medium`, CRF
25, ffmpeg's frame threads), given the pipeline's np output (a list of float frames):
- `export_to_video`: diffusers' own, as it runs (imageio piping to imageio-ffmpeg's
  ffmpeg); needs the `bench` extra and an ffmpeg binary, so not on the GPU host;
- `export_emulated`: its settings in-process with PyAV, where it cannot run (the GPU host,
  which has no ffmpeg binary): it only flatters the anchor (no pipe, no subprocess).
The others:
- `dropin`: `client.export_to_video`, the same call on the same list;
- `sidecar_<profile>`: the daemon at a profile (fast, balanced, small), from GPU-ready
  frames (a CUDA tensor with --device cuda, else a host uint8 array);
- `upstream_a_<profile>`: upstream's path (pinned copy, SHM copies, `from_ndarray`,
  PyAV's default threading) at the same preset, CRF and x264 settings as that profile.
`--sweep preset:crf-crf,...` adds in-process PyAV encodes (`x264_<preset>_<crf>`, frame
threads) to chart presets by CRF.

Contents: `natural` (photographs from scikit-image's data module, panned and zoomed; on
a host without it, PNGs copied from its data directory into $VIDEO_SIDECAR_BENCH_PHOTOS),
`smooth` (moving colour waves), `noisy` (the same with per-pixel grain, sigma 4 levels).
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from client.patterns import moving_pattern
from sidecar.codec.catalogue import CodecSpec, ResolvedCodec
from sidecar.codec.grain import is_grainy
from sidecar.vocabulary import PIXEL_FORMATS, PROFILES

from .common import Device, Row, git_commit, machine, parse_shape, read_json, write_json
from .daemons import daemon, pool_for
from .rdt_report import decoded, psnr, ssim, summary, table
from .variants import _Segment

SHAPES = ["832x480x81", "1280x720x81", "1344x768x122"]
CONTENTS = ("natural", "smooth", "noisy")
DEFAULT_VARIANTS = (
    "export_to_video", "export_emulated", "dropin", "sidecar_balanced", "upstream_a_balanced",
    "sidecar_fast", "upstream_a_fast", "sidecar_small",
)  # fmt: skip
FPS = 16
ANCHOR = {"preset": "medium", "crf": "25"}  # imageio-ffmpeg at quality 5


# -- content ---------------------------------------------------------------------------------


PHOTOS_ENV = "VIDEO_SIDECAR_BENCH_PHOTOS"  # a directory of PNGs where scikit-image is not


def photographs() -> list[np.ndarray]:
    """scikit-image's photographs (the bench extra), or the PNGs copied from its data
    directory into $VIDEO_SIDECAR_BENCH_PHOTOS (a host that cannot install it)."""
    folder = os.environ.get(PHOTOS_ENV)
    if folder:
        names = sorted(Path(folder).glob("*.png"))
        return [decoded_image(path) for path in names]
    from skimage import data

    return [f() for f in (data.astronaut, data.coffee, data.chelsea, data.rocket)]


def decoded_image(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return next(container.decode(video=0)).to_ndarray(format="rgb24")


def natural(frames: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """A slow pan and zoom over a photograph, each frame a crop scaled by swscale."""
    photos = photographs()
    image = photos[seed % len(photos)]
    rows, cols = image.shape[:2]
    out = np.empty((frames, height, width, 3), np.uint8)
    for i in range(frames):
        f = i / max(1, frames - 1)
        crop_w = min(cols / (1 + 0.3 * f) * 0.9, rows / (1 + 0.3 * f) * 0.9 * width / height)
        crop_h = crop_w * height / width
        x0 = int((cols - crop_w) * (0.2 + 0.6 * f)) // 2 * 2
        y0 = int((rows - crop_h) * (0.5 + 0.3 * np.sin(f * 3))) // 2 * 2
        crop = np.ascontiguousarray(image[y0 : y0 + int(crop_h), x0 : x0 + int(crop_w)])
        frame = av.VideoFrame.from_ndarray(crop, format="rgb24")
        scaled = frame.reformat(width, height, "rgb24", interpolation="BILINEAR")
        out[i] = scaled.to_ndarray()
    return out


def content(name: str, shape: str, seed: int = 0) -> np.ndarray:
    w, h, t = parse_shape(shape)
    if name == "natural":
        return natural(t, h, w, seed)
    return moving_pattern(t, h, w, noise=4.0 if name == "noisy" else 0.0, seed=seed)


# -- the ways to an MP4 ----------------------------------------------------------------------


@dataclass
class Way:
    name: str
    run: Callable[[Any, np.ndarray], bytes]  # (frames as this way takes them, uint8) -> MP4
    takes: str = "uint8"  # "uint8": the frames on the device; "np_list": diffusers' np output
    why_not: str = ""


def pyav_mp4(frames: np.ndarray, options: dict[str, str], thread_type: str | None) -> bytes:
    """(T, H, W, 3) rgb24 through PyAV's `from_ndarray`: libx264 with `options`."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(FPS))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.codec_context.options = options
        if thread_type is not None:
            stream.thread_type = thread_type
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buf.getvalue()


def profile_codec(profile: str, frames: np.ndarray) -> ResolvedCodec:
    """The settings a profile gives a request for these frames that names nothing else
    (the first frame measured for grain, as the daemon does)."""
    t, h, w, _ = frames.shape
    codec = CodecSpec(profile=profile).resolve(video=(w, h, t))
    return codec.measured(is_grainy(frames[0], PIXEL_FORMATS["rgb24"], h))


def profile_options(profile: str, frames: np.ndarray) -> dict[str, str]:
    """The x264 options of `profile_codec`."""
    return profile_codec(profile, frames).options


def export_to_video_way() -> Way:
    try:
        import imageio_ffmpeg
        from diffusers.utils import export_to_video

        imageio_ffmpeg.get_ffmpeg_exe()
    except Exception as exc:  # not installed, or no ffmpeg binary (the GPU host)
        return Way("export_to_video", lambda v, f: b"", "np_list", f"cannot run here: {exc}")

    def run(frames: Any, _: np.ndarray) -> bytes:
        with tempfile.TemporaryDirectory() as tmp:
            path = export_to_video(frames, str(Path(tmp) / "out.mp4"), fps=FPS)
            return Path(path).read_bytes()

    return Way("export_to_video", run, "np_list")


def emulated_way() -> Way:
    def run(frames: Any, _: np.ndarray) -> bytes:
        # As diffusers does: (frame * 255).astype(np.uint8), then ffmpeg's frame threads.
        levels = np.stack([(frame * 255).astype(np.uint8) for frame in frames])
        return pyav_mp4(levels, ANCHOR, "FRAME")

    return Way("export_emulated", run, "np_list")


def upstream_a_way(profile: str, device: Device) -> Way:
    def run(video: Any, frames: np.ndarray) -> bytes:
        options = profile_options(profile, frames)
        if device.torch is not None:  # cached pinned D2H, as upstream does
            host = device.torch.empty(video.shape, dtype=video.dtype, pin_memory=True)
            host.copy_(video, non_blocking=True)
            device.torch.cuda.current_stream().synchronize()
            video = host.numpy()
        segment = _Segment(video.nbytes)
        try:
            np.copyto(segment.array.reshape(video.shape), video)  # producer: into SHM
            received = segment.array.reshape(video.shape).copy()  # receiver: out of SHM
        finally:
            segment.close()
        return pyav_mp4(received, options, None)  # PyAV's default threading

    return Way(f"upstream_a_{profile}", run)


def sweep_ways(spec: str) -> list[Way]:
    """`preset:20-24,medium:25` -> in-process PyAV encodes at each preset and CRF."""
    ways = []
    for part in filter(None, spec.split(",")):
        preset, _, crfs = part.partition(":")
        low, _, high = crfs.partition("-")
        for crf in range(int(low), int(high or low) + 1):
            options = {"preset": preset, "crf": str(crf)}
            ways.append(
                Way(f"x264_{preset}_{crf}", lambda v, f, o=options: pyav_mp4(f, o, "FRAME"))
            )
    return ways


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Tally:
    times_ms: list[float] = field(default_factory=list)
    bytes: int = 0
    psnr: float = 0.0
    ssim: float = 0.0


def run_shape(ways: list[Way], device: Device, shape: str, name: str, samples: int) -> list[Row]:
    frames = content(name, shape)
    given = {
        "uint8": device.torch.from_numpy(frames).cuda() if device.torch is not None else frames,
        "np_list": [frame.astype(np.float32) / 255 for frame in frames],  # pipe(...).frames[0]
    }
    tallies = {w.name: Tally() for w in ways}
    for sample in range(samples + 1):  # the first round warms every way; not counted
        order = ways[sample % len(ways) :] + ways[: sample % len(ways)]
        for way in order:
            device.ready()
            t0 = time.perf_counter()
            data = way.run(given[way.takes], frames)
            elapsed = (time.perf_counter() - t0) * 1e3
            tally = tallies[way.name]
            if sample:
                tally.times_ms.append(elapsed)
            elif data:
                got = decoded(data)
                tally.bytes, tally.psnr, tally.ssim = (
                    len(data),
                    psnr(got, frames),
                    ssim(got, frames),
                )
    return [_row(way, tallies[way.name], shape, name) for way in ways]


def _row(way: Way, tally: Tally, shape: str, name: str) -> Row:
    times = tally.times_ms
    return Row(
        variant=way.name,
        shape=shape,
        median_ms=round(statistics.median(times), 2),
        min_ms=round(min(times), 2),
        max_ms=round(max(times), 2),
        samples=len(times),
        suite="rdt",
        content=name,
        extra={
            "bytes": tally.bytes,
            "psnr_db": round(tally.psnr, 3),
            "ssim": round(tally.ssim, 5),
        },
    )


def sidecar_ways(names: list[str], client: Any, socket: str) -> list[Way]:
    ways = []
    for name in names:
        if name == "dropin":
            from client import export_to_video

            def dropin(frames: Any, _: np.ndarray) -> bytes:
                with tempfile.TemporaryDirectory() as tmp:
                    path = export_to_video(frames, Path(tmp) / "out.mp4", FPS, socket=socket)
                    return Path(path).read_bytes()

            ways.append(Way("dropin", dropin, "np_list"))
        elif name.startswith("sidecar_"):
            profile = name.removeprefix("sidecar_")
            ways.append(
                Way(name, lambda v, f, p=profile: client.encode(v, fps=FPS, profile=p).data)
            )
    return ways


def build_ways(names: list[str], device: Device, client: Any, socket: str, sweep: str) -> list[Way]:
    ways: list[Way] = []
    for name in names:
        if name == "export_to_video":
            ways.append(export_to_video_way())
        elif name == "export_emulated":
            ways.append(emulated_way())
        elif name.startswith("upstream_a_"):
            ways.append(upstream_a_way(name.removeprefix("upstream_a_"), device))
        elif name == "dropin" or name.startswith("sidecar_"):
            ways.extend(sidecar_ways([name], client, socket))
        else:
            raise SystemExit(f"unknown variant {name!r}")
    return [*ways, *sweep_ways(sweep)]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.rdt", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--contents", default=",".join(CONTENTS))
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    p.add_argument("--sweep", default="", help="in-process x264: preset:crf-crf,...")
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--json", default="")
    p.add_argument("--from-json", default="", help="print a recorded run's tables")
    args = p.parse_args(argv)
    for name in args.contents.split(","):
        if name not in CONTENTS:
            raise SystemExit(f"--contents: {name!r} is not one of {', '.join(CONTENTS)}")
    for name in args.variants.split(","):
        profile = name.removeprefix("sidecar_").removeprefix("upstream_a_")
        if name != profile and profile not in PROFILES:
            raise SystemExit(f"--variants: {name!r}: profiles are {', '.join(PROFILES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.from_json:
        meta, recorded = read_json(args.from_json)
        print(f"{meta['date']} {meta['command']}\n{meta['machine']}")
        for shape in dict.fromkeys(r.shape for r in recorded):
            for name in dict.fromkeys(r.content for r in recorded):
                rows = [r for r in recorded if r.shape == shape and r.content == name]
                if rows:
                    print(table(rows))
        print("\n" + summary(recorded))
        return 0
    device = Device(args.device)
    names = [n for n in args.variants.split(",") if n]
    shapes = [s for s in args.shapes.split(",") if s]
    w, h, t = max((parse_shape(s) for s in shapes), key=lambda s: s[0] * s[1] * s[2])
    rows: list[Row] = []
    with daemon(**pool_for(w * h * 3, t)) as process:
        from client import SidecarClient

        with SidecarClient(process.socket) as client:
            client.warm_up()
            ways = build_ways(names, device, client, process.socket, args.sweep)
            skipped = [w for w in ways if w.why_not]
            for way in skipped:
                print(f"skipping {way.name}: {way.why_not}", file=sys.stderr)
            ways = [w for w in ways if not w.why_not]
            for shape in shapes:
                for name in args.contents.split(","):
                    rows += run_shape(ways, device, shape, name, args.samples)
                    print(table(rows[-len(ways) :]), flush=True)
    meta = {
        "date": datetime.date.today().isoformat(),
        "command": "python -m bench.rdt " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "device": args.device,
        "commit": git_commit(),
        "machine": machine(),
        "skipped": {w.name: w.why_not for w in skipped},
    }
    if args.json:
        write_json(args.json, meta, rows)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
