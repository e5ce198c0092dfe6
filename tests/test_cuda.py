"""The CUDA worker path: registration once, GPU normalisation, D2H straight into leases.

Marked `cuda`: skipped without a GPU; run on the GPU machine with `pytest -m cuda`.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from client import SidecarClient
from client._convert import Conversion, Ops
from client.patterns import moving_pattern

from .conftest import new_prefix
from .helpers import Daemon, decode, psnr

pytestmark = pytest.mark.cuda
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    """The module's daemon at the fast profile (x264 ultrafast: no B-frames, so the same
    frames make the same bytes whatever the threads): these tests compare the transport
    byte for byte, not the encoder's settings."""
    d = Daemon(new_prefix(), profile="fast").start()
    yield d
    try:
        assert d.stop() == 0, d.log()
        assert d.segments() == []
    finally:
        d.cleanup()


@pytest.fixture(scope="module")
def rgb() -> np.ndarray:
    return moving_pattern(24, 192, 320)


@pytest.fixture(scope="module")
def baseline(daemon: Daemon, rgb: np.ndarray) -> bytes:
    with daemon.client() as c:
        return c.encode(rgb, threads=1).data or b""


def test_uint8_round_trip_is_bit_exact(
    client: SidecarClient, rgb: np.ndarray, baseline: bytes
) -> None:
    gpu = torch.from_numpy(rgb).cuda()
    result = client.encode(gpu, threads=1, pixel_format="rgb24")
    assert result.data == baseline
    assert client.cuda_registrations >= 1


def test_lease_bytes_equal_the_tensor(client: SidecarClient, rgb: np.ndarray) -> None:
    gpu = torch.from_numpy(rgb).cuda()
    source = client._prepare(gpu, "rgb24", None, (0, 1))
    lease = client.lease(rgb.nbytes)
    try:
        source.copy_into(lease.array, 0, len(rgb))
        source.finish()
        assert np.array_equal(lease.array[: rgb.nbytes].reshape(rgb.shape), rgb)
    finally:
        client.release(lease)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_float_inputs_match_the_cpu_conversion(
    client: SidecarClient, rgb: np.ndarray, dtype: str
) -> None:
    t = (torch.from_numpy(rgb).float() / 127.5 - 1).to(getattr(torch, dtype))
    t = t.permute(3, 0, 1, 2)[None].contiguous()  # (1, C, T, H, W) as a VAE returns it
    t[0, :, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), float("-inf"), 3.0])[:, None].T
    cpu = client._prepare(t.cpu(), "rgb24", None, (-1, 1))
    gpu = client._prepare(t.cuda(), "rgb24", None, (-1, 1))
    lease_a, lease_b = client.lease(rgb.nbytes), client.lease(rgb.nbytes)
    try:
        cpu.copy_into(lease_a.array, 0, len(rgb))
        gpu.copy_into(lease_b.array, 0, len(rgb))
        gpu.finish()
        a = lease_a.array[: rgb.nbytes].astype(np.int16)
        b = lease_b.array[: rgb.nbytes].astype(np.int16)
        assert np.abs(a - b).max() <= 1 and np.mean(a == b) > 0.999
        first = lease_b.array[: 4 * 3].reshape(4, 3)
        assert first[:, 0].tolist() == [0, 255, 0, 255]  # NaN, +inf, -inf, 3.0 clamped
    finally:
        client.release(lease_a)
        client.release(lease_b)
    frames, _ = decode(client.encode(t.cuda(), value_range=(-1, 1)).data or b"")
    assert psnr(frames[1:], rgb[1:]) >= 40


def test_non_contiguous_inputs(client: SidecarClient, rgb: np.ndarray, baseline: bytes) -> None:
    gpu = torch.from_numpy(rgb).cuda()
    tchw = gpu.permute(0, 3, 1, 2)  # a permuted view, not a copy
    assert not tchw.is_contiguous()
    assert client.encode(tchw, threads=1, pixel_format="rgb24").data == baseline
    wide = torch.zeros(24, 192, 400, 3, dtype=torch.uint8, device="cuda")
    wide[:, :, :320] = gpu
    cropped = wide[:, :, :320]  # padded rows
    assert client.encode(cropped, threads=1, pixel_format="rgb24").data == baseline
    every_other = torch.stack([gpu, gpu], dim=1).reshape(48, 192, 320, 3)[::2]
    assert not every_other.is_contiguous()
    assert client.encode(every_other, threads=1, pixel_format="rgb24").data == baseline


def test_gpu_420_is_close_to_cpu_conversion(client: SidecarClient, rgb: np.ndarray) -> None:
    cpu_side, facts_a = decode(client.encode(rgb).data or b"")
    gpu = torch.from_numpy(rgb).cuda()
    outputs = {}
    for fmt in (None, "yuv420p", "nv12"):  # None: a CUDA tensor's RGB goes as yuv420p
        result = client.encode(gpu, pixel_format=fmt, threads=1)
        outputs[fmt] = result.data
        gpu_side, facts_b = decode(result.data or b"")
        assert abs(psnr(gpu_side, rgb) - psnr(cpu_side, rgb)) <= 1.0
        keys = ("colorspace", "color_range", "color_primaries", "color_trc", "pix_fmt")
        assert {k: facts_b[k] for k in keys} == {k: facts_a[k] for k in keys}
    # None: once the elementwise kernels are loaded (at attach, or warm_up), 4:2:0
    # whatever the size (the fused kernel once ready), so the daemon converts nothing
    client.warm_up()
    assert client._prepare(gpu, None, None, (0, 1)).pixel_format == "yuv420p"
    assert client._prepare(gpu[:2], None, None, (0, 1)).pixel_format == "yuv420p"
    # Same conversion code on CPU and GPU: the planes agree to one level.
    conv = Conversion("yuv420p", 255.0, 0.0, integer=True)
    on_gpu = conv.apply(gpu[:4], Ops(torch)).cpu().numpy().astype(int)
    on_cpu = conv.apply(rgb[:4], Ops()).astype(int)
    assert np.abs(on_gpu - on_cpu).max() <= 1


def test_registration_happens_once_per_slab(daemon: Daemon, rgb: np.ndarray) -> None:
    gpu = torch.from_numpy(rgb[:4]).cuda()
    with daemon.client() as c:
        for _ in range(100):
            c.encode(gpu)
        cuda = c._core.cuda  # the process's CUDA state, shared by its clients
        assert cuda is not None
        before = cuda.registrations  # cudaHostRegister calls this process has made
        with daemon.client() as other:  # a second client of the process: nothing again
            for _ in range(10):
                other.encode(gpu)
        assert cuda.registrations == before
        slabs = len(c.attach().slabs)
        deadline = time.monotonic() + 10  # the rest are registered in the background
        while c.cuda_registrations < slabs and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.cuda_registrations == slabs  # each slab once, no more


def test_clients_on_threads_each_get_their_own_frames(daemon: Daemon) -> None:
    """Eight clients of one process sending different GPU videos at once, as a server's
    request threads do: they share the process's streams and take turns queueing their
    copies, and each file holds its own frames, byte for byte."""
    videos = [moving_pattern(6, 96, 160 + 16 * i, noise=2.0, seed=i) for i in range(8)]
    gpus = [torch.from_numpy(v).cuda() for v in videos]
    with daemon.client() as c:  # one at a time (4:2:0 made on the GPU, the default path)
        expected = [c.encode(g, threads=1).data for g in gpus]
    got: dict[int, list[bytes | None]] = {i: [] for i in range(8)}
    start = threading.Barrier(8)

    def send(i: int) -> None:
        with daemon.client() as mine:
            start.wait()
            for _ in range(5):
                got[i].append(mine.encode(gpus[i], threads=1).data)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(8):
        assert got[i] == [expected[i]] * 5, f"client {i} got another's frames"


def test_bounded_device_memory_for_bf16(daemon: Daemon) -> None:
    frames, h, w = 48, 768, 1344
    video = torch.rand(1, 3, frames, h, w, device="cuda").to(torch.bfloat16)  # 297 MB
    full_fp32 = video.numel() * 4
    d = Daemon(daemon.prefix + "m", slabs=2, slab_size="256MiB")
    d.start()
    try:
        with d.client() as c:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            c.encode(video, value_range=(0, 1), preset="ultrafast")
            peak = torch.cuda.max_memory_allocated() - base
        assert peak < full_fp32 / 2, (peak, full_fp32)
    finally:
        d.stop()
        d.cleanup()


def test_registration_failure_falls_back_with_one_warning(
    daemon: Daemon, rgb: np.ndarray, baseline: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from client import _cuda

    monkeypatch.setattr(_cuda.CudaRuntime, "register", lambda self, a, s: 2)  # out of memory
    host = _cuda.process_host()  # the process's: earlier tests may have warned already
    monkeypatch.setattr(host, "_warned", False)
    gpu = torch.from_numpy(rgb).cuda()
    with daemon.client() as c:
        with pytest.warns(RuntimeWarning, match="cudaHostRegister failed"):
            assert c.encode(gpu, threads=1, pixel_format="rgb24").data == baseline
        assert c.cuda_registrations == 0
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert (
                c.encode(gpu, threads=1, pixel_format="rgb24").data == baseline
            )  # warned once only


def _child(
    socket: str, frames: np.ndarray, client: SidecarClient, out: multiprocessing.Queue
) -> None:
    # The inherited client must not trust the parent's registrations, and must still work
    # on host memory (CUDA itself cannot be used in a forked child).
    try:
        result = client.encode(frames, threads=1)
        out.put((client.cuda_registrations, len(result.data or b""), os.getpid()))
    except Exception as exc:  # report, don't hang the parent
        out.put(repr(exc))


def test_forked_child_does_not_reuse_registrations(
    daemon: Daemon, rgb: np.ndarray, baseline: bytes
) -> None:
    gpu = torch.from_numpy(rgb).cuda()
    with daemon.client() as c:
        c.encode(gpu)
        registered = c.cuda_registrations
        assert registered >= 1
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_child, args=(daemon.socket, rgb, c, out))
        child.start()
        reply = out.get(timeout=60)
        child.join(60)
        assert child.exitcode == 0
        assert isinstance(reply, tuple), reply
        child_registrations, size, pid = reply
        assert child_registrations == 0 and size > 0 and pid != os.getpid()
        # The parent's registrations survived the child.
        assert c.cuda_registrations == registered
        assert c.encode(gpu, threads=1, pixel_format="rgb24").data == baseline


@pytest.mark.parametrize("dtype", ["uint8", "float16", "bfloat16", "float32"])
@pytest.mark.parametrize("fmt", ["yuv420p", "nv12"])
def test_fused_420_kernel_matches_the_elementwise_path(dtype: str, fmt: str) -> None:
    """The one-kernel conversion gives the planes the elementwise path gives, from any
    dtype and from a permuted (CTHW) view, NaN included."""
    from client import _yuv_kernel

    if not _yuv_kernel.available():
        pytest.skip("Triton is not installed")
    rng = np.random.default_rng(1)
    k, h, w = 5, 94, 170
    if dtype == "uint8":
        cthw = torch.from_numpy(rng.integers(0, 256, (3, k, h, w), dtype=np.uint8)).cuda()
        scale, shift, integer = 1.0, 0.0, True
    else:
        values = rng.uniform(-1.1, 1.1, (3, k, h, w)).astype(np.float32)
        cthw = torch.from_numpy(values).cuda().to(getattr(torch, dtype))
        cthw[0, 0, 0, 0] = float("nan")
        scale, shift, integer = 127.5, 127.5, False
    view = cthw.permute(1, 2, 3, 0)  # (k, h, w, 3), not contiguous
    out = torch.empty((k, h * 3 // 2, w), dtype=torch.uint8, device="cuda")
    _yuv_kernel.rgb_to_yuv420(view, out, scale, shift, fmt == "nv12")
    reference = Conversion(fmt, scale, shift, integer).apply(view, Ops(torch))
    diff = (out.int() - reference.int()).abs()
    assert int(diff.max()) <= 1  # a fused multiply-add may round a tie the other way
    assert float((diff > 0).float().mean()) < 0.001


@pytest.mark.parametrize("pixel_format", [None, "yuv420p"])
def test_a_long_video_is_sent_while_its_frames_land(  # type: ignore[no-untyped-def]
    make_daemon, connect, monkeypatch, pixel_format
) -> None:
    """A video of some 50-100 MB on the GPU, as RGB or converted to 4:2:0 there: the
    request goes out with its frames still landing, counted in the last lease, and the
    output is byte for byte the one of the same video sent once every frame had landed."""
    from client import _encode, _yuv_kernel

    if _yuv_kernel.available():  # one conversion for both encodes: the kernel, compiled
        assert _yuv_kernel.warm(_yuv_kernel.USUAL, "cuda", wait=120)
    # Several leases: the whole video at once; ultrafast: the same frames, the same bytes.
    d = make_daemon(slabs=8, slab_size="16MiB", profile="fast")

    offsets: list[int] = []
    count_in = _encode.FramesLanding.count_in

    def recording(self: _encode.FramesLanding, lease: object) -> int:
        offsets.append(count_in(self, lease))  # type: ignore[arg-type]
        return offsets[-1]

    monkeypatch.setattr(_encode.FramesLanding, "count_in", recording)
    video = torch.from_numpy(moving_pattern(32, 768, 1344, noise=4.0)).cuda()
    with connect(d) as client:
        landed = client.encode(video, threads=4, pixel_format=pixel_format).data
        assert offsets and offsets[0] > 0
        monkeypatch.setattr(_encode, "LANDING_MIN_BYTES", 1 << 62)  # all landed first
        whole = client.encode(video, threads=4, pixel_format=pixel_format).data
    assert len(offsets) == 1
    assert landed == whole
    frames, _ = decode(landed or b"")
    assert len(frames) == 32 and psnr(frames, video.cpu().numpy()) > 35


@pytest.mark.parametrize("value_range", [(0, 1), (-1, 1)])
def test_previews_from_the_gpu_420_default_path(
    client: SidecarClient, rgb: np.ndarray, value_range: tuple[int, int]
) -> None:
    """A CUDA tensor goes as 4:2:0 converted on the GPU: its previews still show the
    source frames (PSNR at least 35 dB at the same scale), as a bf16 VAE output in [-1, 1]
    too."""
    import io

    import av

    from client import SpriteSheet, Thumbnail

    low, high = value_range
    gpu = torch.from_numpy(rgb).cuda().to(torch.bfloat16) / 255 * (high - low) + low
    result = client.encode(
        gpu,
        value_range=value_range,
        thumbnail=Thumbnail(at=5, max_width=160),
        sprite_sheet=SpriteSheet(tiles=4, tile_width=80, columns=4),
    )
    assert result.thumbnail is not None and result.sprite_sheet is not None
    shown = {}
    for preview in (result.thumbnail, result.sprite_sheet):
        with av.open(io.BytesIO(preview.data or b"")) as image:
            shown[preview.kind] = next(image.decode(video=0)).to_ndarray(format="rgb24")

    def box(frame: np.ndarray, factor: int) -> np.ndarray:
        h, w = frame.shape[0] // factor, frame.shape[1] // factor
        blocks = frame.reshape(h, factor, w, factor, 3).astype(np.float64)
        return blocks.mean(axis=(1, 3)).round().astype(np.uint8)

    assert psnr(shown["thumbnail"], box(rgb[5], 2)) >= 35
    frames = result.sprite_sheet.frames
    assert frames == (0, 6, 12, 18)
    tiles = np.concatenate([box(rgb[f], 4) for f in frames], axis=1)
    assert psnr(shown["sprite_sheet"], tiles) >= 33  # JPEG blocks cross tile edges


def test_a_gpu_worker_registers_every_slab_off_the_request_path(
    daemon: Daemon, rgb: np.ndarray
) -> None:
    """The first request attaches; every slab is then registered on a thread of its own,
    so no later request registers one in line."""
    gpu = torch.from_numpy(rgb[:4]).cuda()
    with daemon.client() as c:
        c.encode(gpu)
        slabs = len(c.attach().slabs)
        deadline = time.monotonic() + 10
        while c.cuda_registrations < slabs and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.cuda_registrations == slabs


def test_requests_never_wait_for_the_kernel_to_compile(
    daemon: Daemon, rgb: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the 4:2:0 kernel compiles (held here for as long as the test likes), requests
    convert without it; once it is ready, they use it, for the same picture."""
    from client import _yuv_kernel

    if not _yuv_kernel.available():
        pytest.skip("Triton is not installed")
    held = threading.Event()
    kernel = _yuv_kernel._Kernel()
    compile_now = kernel.compile

    def compile_later() -> None:
        held.wait(60)
        compile_now()

    kernel.compile = compile_later  # type: ignore[method-assign]
    monkeypatch.setattr(_yuv_kernel, "_KERNEL", kernel)
    fused: list[int] = []
    convert = _yuv_kernel.rgb_to_yuv420
    monkeypatch.setattr(
        _yuv_kernel, "rgb_to_yuv420", lambda *args: (fused.append(1), convert(*args))[1]
    )
    gpu = torch.from_numpy(rgb).cuda()
    with daemon.client() as c:
        before = c.encode(gpu, threads=1)
        assert fused == [] and not kernel.ready  # answered without waiting for it
        held.set()
        assert _yuv_kernel.warm(_yuv_kernel.USUAL, "cuda", wait=120)
        after = c.encode(gpu, threads=1)
        assert fused  # the kernel, now that it is ready
    first, _ = decode(before.data or b"")  # no fused kernel yet: elementwise, or rgb24
    second, _ = decode(after.data or b"")  # 4:2:0 from the kernel
    assert psnr(first, rgb) >= 40 and psnr(second, rgb) >= 40


def test_grain_is_measured_on_frames_still_landing(client: SidecarClient) -> None:
    """A CUDA tensor's request goes before its frames land: the encode waits for the
    first, measures it, and encodes grain with the grain settings (codec/grain.py)."""
    for noise, wanted in ((4.0, b"subme=6"), (0.0, b"subme=2")):
        video = torch.from_numpy(moving_pattern(24, 256, 448, noise=noise)).cuda()
        data = client.encode(video, fps=24, profile="balanced").data or b""
        assert wanted in data, data[:2000]
