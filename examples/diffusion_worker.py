"""A diffusion worker handing its videos to video-sidecar.

    python examples/diffusion_worker.py [--frames 49] [--height 480] [--width 832]

The model here is a stand-in that returns what a video VAE returns: a (1, 3, T, H, W)
bfloat16 tensor in [-1, 1], on the GPU when there is one. The worker hands it over in the
two ways a server would:

1. the whole video at once, `sidecar.encode(video, value_range=(-1, 1))`: the client
   converts on the GPU in batches and copies straight into a leased slab;
2. chunk by chunk while the VAE decodes, `sidecar.stream(...)`: each chunk is copied as
   soon as it exists, and only the last chunk's encode is left when decoding ends.

A daemon is started for the example if none answers on the socket.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import torch

from client import SidecarClient
from sidecar.tools.launcher import DaemonProcess, is_serving


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=49)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--chunk", type=int, default=8, help="frames per VAE chunk")
    parser.add_argument("--socket", default=None, help="daemon socket (default: its default)")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    daemon = None
    with SidecarClient(args.socket, client_name="diffusion-worker") as sidecar:
        if not is_serving(sidecar.target.removeprefix("unix:")):
            daemon = DaemonProcess(sidecar.target.removeprefix("unix:"))
            daemon.start()
        try:
            # 1. The whole video at once, as most servers do today.
            chunks = vae_decode_chunks(args.frames, args.height, args.width, args.chunk, device)
            video = torch.cat(list(chunks), dim=2)
            result = sidecar.encode(
                video,
                fps=24,
                value_range=(-1, 1),
                # On a GPU, convert to 4:2:0 there: half the bytes, no CPU conversion.
                pixel_format="yuv420p" if device.type == "cuda" else None,
                path=f"worker/whole-{int(time.time())}.mp4",
                request_id="whole-video",
            )
            print(f"whole video: {result.path}, {result.timings.total_ms:.0f} ms")

            # 2. Chunk by chunk while decoding, fragmented MP4 bytes streaming back.
            received: list[bytes] = []
            with sidecar.stream(
                fps=24, value_range=(-1, 1), container="fmp4", on_chunk=received.append
            ) as stream:
                for chunk in vae_decode_chunks(
                    args.frames, args.height, args.width, args.chunk, device
                ):
                    stream.write(chunk)  # the GPU copy is done when this returns
                last_write = time.perf_counter()
            tail_ms = (time.perf_counter() - last_write) * 1e3
            assert stream.result is not None
            print(
                f"streamed: {stream.result.size_bytes} bytes of fragmented MP4 in "
                f"{len(received)} pieces; {tail_ms:.0f} ms after the last chunk"
            )
        finally:
            if daemon is not None:
                daemon.stop()


if __name__ == "__main__":
    main()
