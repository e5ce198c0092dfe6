"""A client attaches as it is made (`prepare`, on by default), in the background: the first
request then finds the slabs mapped (and, on a GPU worker, registered). A daemon that is
not there is met by the first request, with the usual error, never by the constructor;
a fork right after a client is made leaves the child a client it can use."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from client import SidecarClient, SidecarUnavailable
from client.patterns import moving_pattern
from tests.helpers import Daemon, decode, mapped_segments, psnr
from tests.test_integration import _in_a_forked_child
from tests.twins import open_client


def _attached_within(client: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while client._core.attachment is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_client_is_attached_before_its_first_request(daemon: Daemon, connect: Any) -> None:
    with daemon.client(prepare=False) as watcher:
        known = watcher.status().clients_attached
        with connect(daemon) as c:
            assert _attached_within(c, 10.0)  # no call made: the constructor's doing
            assert watcher.status().clients_attached == known + 1
            mapped = c._core.slabs
            first = c.encode(moving_pattern(4, 64, 96))
            assert first.frames == 4
            assert c._core.slabs is mapped  # the request found them mapped


def test_prepare_false_attaches_on_first_use(daemon: Daemon, connect: Any) -> None:
    with connect(daemon, prepare=False) as c:
        time.sleep(0.3)
        assert c._core.attachment is None
        assert c.encode(moving_pattern(2, 64, 96)).frames == 2
        assert c._core.attachment is not None


def test_no_daemon_is_the_first_requests_error_not_the_constructors(
    tmp_path: Path, twin: str
) -> None:
    socket = str(tmp_path / "nobody.sock")
    t0 = time.monotonic()
    with (
        open_client(twin, socket) as c,
        pytest.raises(SidecarUnavailable, match="no daemon answers at"),
    ):
        c.encode(moving_pattern(2, 64, 96))
    assert time.monotonic() - t0 < 8.0  # the early attach fails at once, as the request


def test_closing_at_once_waits_for_the_early_attach(daemon: Daemon) -> None:
    """Closed before its attach finished: no mapping is left behind it."""
    assert not mapped_segments(daemon.prefix)
    for _ in range(5):
        c = SidecarClient(daemon.socket)
        c.close()
        assert c._preparing is not None and not c._preparing.is_alive()
        assert not mapped_segments(daemon.prefix)


def test_a_fork_right_after_the_client_is_made_leaves_the_child_a_usable_client(
    daemon: Daemon, capfd: Any
) -> None:
    clip = moving_pattern(4, 64, 96)
    c = SidecarClient(daemon.socket)  # attaching on its own thread as the fork comes
    try:

        def child() -> bytes:
            return str(c.encode(clip).frames).encode()

        assert _in_a_forked_child(child, 30, capfd) == b"4"
        assert c.encode(clip).frames == 4  # the parent's client carries on
    finally:
        c.close()


def test_every_frame_of_a_prepared_clients_first_request_comes_back(daemon: Daemon) -> None:
    """A request made the moment the client is, racing its early attach."""
    clip = moving_pattern(6, 64, 96)
    with SidecarClient(daemon.socket) as c:
        result = c.encode(clip)
    frames, _ = decode(result.data)
    assert len(frames) == 6
    assert psnr(frames, clip) > 30
