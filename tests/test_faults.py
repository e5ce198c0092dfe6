"""Faults survived: the daemon killed, the disk full, /dev/shm too small, deadlines, cancels."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest

from client import DeadlineExceeded, Reason, ResourceExhausted, SidecarUnavailable
from client.patterns import moving_pattern

from .conftest import new_prefix
from .helpers import Daemon, SlowHandshake, decode, mapped_segments, wait_until


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A small tmpfs of our own, where the machine lets us mount one."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.parametrize("timeout", [5, None])  # with and without a deadline
def test_daemon_killed_clients_reattach_and_remap(make_daemon, connect, timeout) -> None:  # type: ignore[no-untyped-def]
    d = make_daemon()
    video = moving_pattern(6, 64, 64)
    with connect(d, timeout=timeout) as c:
        c.encode(video)
        old_instance = c.attach().instance_id
        old_slabs = {name for _, name in mapped_segments(d.prefix)}
        assert len(old_slabs) == 4
        d.kill()  # SIGKILL: no cleanup at all
        with pytest.raises(SidecarUnavailable) as info:
            c.encode(video)
        assert info.value.code is grpc.StatusCode.UNAVAILABLE
        stale = d.segments()
        assert len(stale) == 5  # four slabs and the lock, left behind
        d.start()
        assert "removed 4 stale segments" in d.log()
        assert not set(stale) & set(d.segments()) - {f"{d.prefix}.lock"}
        # The same client object carries on: new token, new slabs, no help needed.
        assert wait_until(lambda: _encodes(c, video), timeout=10)
        assert c.attach().instance_id != old_instance
        new_slabs = set(d.segments()) - {f"{d.prefix}.lock"}
        assert new_slabs <= {name for _, name in mapped_segments(d.prefix)}
        assert not new_slabs & old_slabs


def test_a_daemon_slow_to_answer_a_new_connection_is_waited_for(
    make_daemon, connect, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A busy host may take a while to complete a connection's handshake: the call
    waits for it within its deadline instead of failing at once as unavailable."""
    d = make_daemon()
    proxy = SlowHandshake(tmp_path / "slow.sock", d.socket, delay_s=0.6)
    try:
        with connect(SimpleNamespace(socket=str(proxy.path)), timeout=10) as c:
            assert c.status().pool["active_leases"] == 0
            assert c.encode(moving_pattern(4, 64, 64)).frames == 4
    finally:
        proxy.close()


def _encodes(c: Any, video: np.ndarray) -> bool:
    try:
        return bool(c.encode(video).frames == len(video))
    except SidecarUnavailable:
        return False


def noisy(frames: int) -> np.ndarray:
    """Content that compresses badly, so outputs are big."""
    return np.random.default_rng(1).integers(0, 255, (frames, 144, 256, 3), dtype=np.uint8)


def test_output_disk_full(make_daemon, connect, tmp_path: Path) -> None:
    """A real ENOSPC: the output root on a 1 MiB tmpfs."""
    with tmpfs(tmp_path / "small", "1M") as root:
        d = make_daemon(output_dir=str(root))
        with connect(d) as c:
            with pytest.raises(ResourceExhausted, match="no space left") as info:
                c.encode(noisy(40), crf=0, path="big/out.mp4")
            assert info.value.reason is Reason.DISK_FULL
            assert list((root / "big").iterdir()) == []  # the partial file is gone
            assert c.encode(moving_pattern(2, 32, 32), path="small.mp4").frames == 2
            status = c.status()
        assert status.pool["active_leases"] <= 1


def test_output_file_size_limit(make_daemon, connect) -> None:
    """The same failure where mounting is not allowed: a file-size limit on the daemon."""
    d = make_daemon(slabs=4, slab_size="1MiB")
    limit = 3 * 1024 * 1024
    # Set on the running daemon, not in a preexec_fn: a fork of this process while its
    # gRPC threads run can take gRPC's state into the child before it execs.
    assert d.process is not None
    resource.prlimit(d.process.pid, resource.RLIMIT_FSIZE, (limit, limit))
    with connect(d) as c:
        with pytest.raises(ResourceExhausted, match="file size limit") as info:
            c.encode(noisy(60), crf=0, path="big/out.mp4")
        assert info.value.reason is Reason.DISK_FULL
        assert [p for p in (d.output_dir / "big").iterdir()] == []
        # On the same kept connection: the failed encode's stop must not stop this one.
        frames, _ = decode(c.encode(moving_pattern(4, 64, 64)).data or b"")
        assert len(frames) == 4


def test_shm_too_small_is_a_clear_startup_error(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "shm", "8M") as shm:
        daemon = Daemon(new_prefix(), shm_dir=str(shm), slabs=2, slab_size="16MiB")
        try:
            with pytest.raises(RuntimeError, match="exited with status 1"):
                daemon.start()
            log = daemon.log()
            assert "has 8MiB free but the slab pool needs 32MiB" in log
            assert os.listdir(shm) == []
        finally:
            daemon.cleanup()


# One Encode call (under half the pool), and a stream (over half). Each encode would take
# seconds on a fast core: the deadline, not the machine's speed, must be what ends it.
@pytest.mark.parametrize(
    ("frames", "height", "width", "slabs"), [(50, 576, 1024, 8), (200, 288, 512, 4)]
)
def test_deadline_stops_the_encode_and_leaves_nothing(
    make_daemon, connect, frames: int, height: int, width: int, slabs: int
) -> None:
    d = make_daemon(slabs=slabs, slab_size="16MiB")
    long_video = moving_pattern(frames, height, width)
    with connect(d) as c:
        with pytest.raises(DeadlineExceeded):
            c.encode(long_video, preset="veryslow", threads=1, path="late.mp4", timeout=0.5)
        assert wait_until(lambda: c.status().active_encodes == 0)
        status = c.status()
        assert status.pool["active_leases"] == 0
        assert status.counters["encodes_failed"] >= 1
    assert list(d.output_dir.iterdir()) == []  # no temp file, no partial output


def test_pool_exhausted_is_bounded(make_daemon, connect) -> None:
    d = make_daemon(slabs=1, slab_size="1MiB", max_lease_wait=0.5)
    with connect(d) as a, connect(d) as b:
        held = a.lease(1024 * 1024)
        t0 = time.monotonic()
        with pytest.raises(ResourceExhausted):
            b.lease(4096, wait=10)  # capped by the daemon's --max-lease-wait
        assert time.monotonic() - t0 < 3
        a.release(held)
        b.release(b.lease(4096))


def test_a_daemon_killed_mid_stream_leaves_no_partial_file(make_daemon) -> None:  # type: ignore[no-untyped-def]
    """kill -9 while a stream writes its file: the client is told the daemon went away
    and the video must be sent again; the next daemon on that prefix removes the dead
    one's partial file, and no file of anyone else's that looks like one."""
    d = make_daemon()
    out = d.output_dir
    (out / "jobs").mkdir(parents=True)
    lookalikes = [
        out / ".midstream.mp4.1a2b3c4d.part",  # the old naming: not provably ours
        out / "jobs" / ".a.mp4.vsp-0badc0de-0badc0de-00000000.part",  # another daemon's
    ]
    for path in lookalikes:
        path.write_bytes(b"not the daemon's")
    chunk = moving_pattern(8, 64, 64)
    with (
        d.client() as c,
        pytest.raises(SidecarUnavailable) as info,
        c.stream(fps=24, path="jobs/midstream.mp4") as s,
    ):
        s.write(chunk)
        assert wait_until(lambda: any((out / "jobs").glob(".midstream.mp4.vsp-*.part")))
        d.kill()
        for _ in range(50):
            s.write(chunk)
            time.sleep(0.02)
    message = str(info.value)
    assert message.startswith("the daemon went away during the encode"), message
    assert "the video was not written; send it again" in message
    partial = list((out / "jobs").glob(".midstream.mp4.vsp-*.part"))
    assert len(partial) == 1  # what kill -9 leaves
    d.start()
    assert wait_until(lambda: not partial[0].exists(), timeout=10), d.log()
    assert "removed 1 partial files a killed instance left" in d.log()
    assert all(path.read_bytes() == b"not the daemon's" for path in lookalikes)
    assert not (out / "jobs" / "midstream.mp4").exists()


def test_a_live_package_on_a_full_disk_fails_its_encode_cleanly(
    make_daemon, connect, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A real ENOSPC under a live package: DISK_FULL, as for files; no half-written file
    is left in the package; the daemon serves on."""
    from client import Live

    with tmpfs(tmp_path / "small", "1M") as root:
        d = make_daemon(output_dir=str(root))
        with connect(d) as c:
            with pytest.raises(ResourceExhausted, match="no space left") as info:
                c.encode(noisy(40), crf=0, live=Live("full", segment_s=1, part_s=0.25))
            assert info.value.reason is Reason.DISK_FULL
            assert "live package" in str(info.value)
            assert not [p.name for p in (root / "full").iterdir() if p.name.startswith(".")]
            assert c.encode(moving_pattern(2, 32, 32)).frames == 2
