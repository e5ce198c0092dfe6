"""A diffusion worker handing its videos to video-sidecar.

    pip install -e '.[torch]'
    python examples/diffusion_worker.py [--frames 49] [--height 480] [--width 832]

The model here is a stand-in that returns what a video VAE returns: a (1, 3, T, H, W)
bfloat16 tensor in [-1, 1], on the GPU when there is one. The worker hands it over in the
two ways a server would:

1. the whole video at once, `sidecar.encode(video, value_range=(-1, 1))`: the client
   converts on the GPU in batches and copies straight into a leased slab;
2. chunk by chunk while the VAE decodes, `sidecar.stream(...)`: each chunk is copied as
   soon as it exists, and only the last chunk's encode is left when decoding ends.

It talks to the daemon at `--socket` (by default $VIDEO_SIDECAR_SOCKET, else the
daemon's default socket): start one with `video-sidecar serve` in another terminal. Where
none answers, the example starts `video-sidecar serve` itself, writes the daemon's log to
`--daemon-log` rather than to this terminal, and stops it at the end. The whole video
goes to a file under the daemon's output root (`--output-dir`); the streamed one comes
back as bytes, written to `--stream-out` if given.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from client import SidecarClient, TransportError

START_TIMEOUT_S = 60.0


def vae_decode_chunks(
    frames: int, height: int, width: int, chunk: int, device: torch.device
) -> Iterator[torch.Tensor]:
    """Stand-in for a temporal VAE decode: (1, 3, k, H, W) bf16 chunks in [-1, 1]."""
    y = torch.linspace(-1, 1, height, device=device)[:, None]
    x = torch.linspace(-1, 1, width, device=device)[None, :]
    for start in range(0, frames, chunk):
        t = torch.arange(start, min(start + chunk, frames), device=device)[:, None, None] / 24
        shape = (len(t), height, width)
        r = torch.sin(3 * x + t) * torch.cos(2 * y)
        g = (torch.sin(2 * y - t) + 0 * x).expand(shape)
        b = torch.cos(2 * (x + y) + 0.5 * t)
        yield torch.stack([r, g, b])[None].to(torch.bfloat16)  # (1, 3, k, H, W)


def serving(probe: SidecarClient) -> bool:
    try:
        return probe.health() == "SERVING"
    except TransportError:  # nothing listens there (yet)
        return False


def start_daemon(socket: str | None, log_path: Path) -> subprocess.Popen[bytes]:
    """`video-sidecar serve` on `socket`, its log in `log_path`; returned once it serves."""
    program = shutil.which("video-sidecar") or str(Path(sys.executable).parent / "video-sidecar")
    command = [program, "serve", *(["--socket", socket] if socket else [])]
    with open(log_path, "ab") as log:
        # A session of its own: the terminal's Ctrl-C reaches this worker, which stops it.
        daemon = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    with SidecarClient(socket, timeout=2) as probe:
        while not serving(probe):
            if daemon.poll() is not None or time.monotonic() > deadline:
                stop_daemon(daemon)
                raise SystemExit(f"the daemon did not start; its log: {log_path}")
            time.sleep(0.2)
    return daemon


def stop_daemon(daemon: subprocess.Popen[bytes]) -> None:
    if daemon.poll() is None:
        daemon.terminate()  # SIGTERM: a graceful stop
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def hand_over(sidecar: SidecarClient, args: argparse.Namespace, device: torch.device) -> None:
    # 1. The whole video at once, as most servers do today.
    chunks = vae_decode_chunks(args.frames, args.height, args.width, args.chunk, device)
    video = torch.cat(list(chunks), dim=2)
    result = sidecar.encode(
        video,
        fps=24,
        value_range=(-1, 1),
        # On a GPU, convert to 4:2:0 there: half the bytes, no CPU conversion.
        pixel_format="yuv420p" if device.type == "cuda" else None,
        path=f"worker/whole-{int(time.time() * 1e3)}.mp4",
        request_id="whole-video",
    )
    print(f"whole video: {result.path}, {result.timings.total_ms:.0f} ms")

    # 2. Chunk by chunk while decoding, fragmented MP4 bytes streaming back.
    received: list[bytes] = []
    with sidecar.stream(
        fps=24, value_range=(-1, 1), container="fmp4", on_chunk=received.append
    ) as stream:
        for chunk in vae_decode_chunks(args.frames, args.height, args.width, args.chunk, device):
            stream.write(chunk)  # the GPU copy is done when this returns
        last_write = time.perf_counter()
    tail_ms = (time.perf_counter() - last_write) * 1e3
    assert stream.result is not None
    if args.stream_out is not None:
        args.stream_out.write_bytes(b"".join(received))
    print(
        f"streamed: {stream.result.size_bytes} bytes of fragmented MP4 in {len(received)} "
        f"pieces; {tail_ms:.0f} ms after the last chunk"
        + (f", written to {args.stream_out}" if args.stream_out is not None else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=49)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--chunk", type=int, default=8, help="frames per VAE chunk")
    parser.add_argument("--socket", default=None, help="daemon socket (default: its default)")
    parser.add_argument(
        "--daemon-log",
        type=Path,
        default=Path("diffusion-worker-daemon.log"),
        help="where a daemon the example starts writes its log",
    )
    parser.add_argument(
        "--stream-out", type=Path, default=None, help="a file to write the streamed video to"
    )
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    daemon = None
    with SidecarClient(args.socket, timeout=2) as probe:
        if not serving(probe):
            print(f"no daemon at {probe.target}: starting one, its log in {args.daemon_log}")
            daemon = start_daemon(args.socket, args.daemon_log)
    try:
        with SidecarClient(args.socket, client_name="diffusion-worker") as sidecar:
            hand_over(sidecar, args, device)
    finally:
        if daemon is not None:
            stop_daemon(daemon)


if __name__ == "__main__":
    main()
