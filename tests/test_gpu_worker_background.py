"""What a GPU worker does beside its requests, without a GPU: the background's slab
registrations wait for a pause in the requests' copies (`client._cuda.CudaHost.
register_all`), as the driver's lock they take would hold up the copies queued meanwhile
(a stand-in runtime records when each slab is registered); and a uint8 video goes as
rgb24 only until the process has loaded the elementwise kernels; and a worker that exits
while the background is busy waits for its step under way."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from client import _cuda
from client._cuda import CudaHost
from client._cuda_runtime import ELEMENTWISE_LOADED
from client._video import gpu_wire_format

SLABS = (1 << 20, 2 << 20, 3 << 20)


class Maps:
    def addresses(self) -> list[int]:
        return list(SLABS)

    def slab_of(self, address: int) -> tuple[int, int] | None:
        base = address & ~((1 << 20) - 1)
        return (base, 1 << 20) if base in SLABS else None


class Runtime:
    def __init__(self) -> None:
        self.registered: list[tuple[int, float]] = []

    def register(self, address: int, size: int) -> int:
        self.registered.append((address, time.monotonic()))
        return _cuda.CUDA_SUCCESS

    def clear_error(self) -> None:
        pass


def host_with(runtime: Runtime) -> CudaHost:
    host = CudaHost(maps=cast(Any, Maps()))
    host._runtime = cast(Any, runtime)
    return host


def copies_until(host: CudaHost, until: float, stop: threading.Event) -> threading.Thread:
    """Copies queued every millisecond until `until`, or `stop`."""

    def copy() -> None:
        while time.monotonic() < until and not stop.is_set():
            host.copying()
            time.sleep(0.001)

    thread = threading.Thread(target=copy)
    thread.start()
    return thread


def test_slabs_are_registered_once_the_copies_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cuda, "REGISTER_QUIET_S", 0.1)
    monkeypatch.setattr(_cuda, "REGISTER_DEFER_S", 30.0)
    runtime = Runtime()
    host = host_with(runtime)
    until = time.monotonic() + 0.4
    copies = copies_until(host, until, threading.Event())
    host.register_all(quiet=True)
    copies.join()
    assert [address for address, _ in runtime.registered] == list(SLABS)
    assert all(when >= until for _, when in runtime.registered)
    host.register_all(quiet=True)  # each once
    assert len(runtime.registered) == len(SLABS)


def test_copies_that_never_pause_hold_registration_back_only_so_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_cuda, "REGISTER_QUIET_S", 0.1)
    monkeypatch.setattr(_cuda, "REGISTER_DEFER_S", 0.2)
    runtime = Runtime()
    host = host_with(runtime)
    stop = threading.Event()
    copies = copies_until(host, time.monotonic() + 10.0, stop)
    try:
        t0 = time.monotonic()
        host.register_all(quiet=True)
        assert [address for address, _ in runtime.registered] == list(SLABS)
        assert time.monotonic() - t0 < 5.0  # 0.2 s a slab, not the ten seconds of copies
    finally:
        stop.set()
        copies.join()


def test_a_request_registers_its_own_slab_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pause is the background's: a request needing a slab registers it itself."""
    monkeypatch.setattr(_cuda, "REGISTER_QUIET_S", 10.0)
    runtime = Runtime()
    host = host_with(runtime)
    host.copying()
    t0 = time.monotonic()
    assert host.ensure_registered_at(SLABS[1] + 100)
    assert time.monotonic() - t0 < 5.0
    assert [address for address, _ in runtime.registered] == [SLABS[1]]


def test_uint8_goes_as_4_2_0_once_the_elementwise_kernels_are_loaded() -> None:
    small = np.zeros((4, 256, 448, 3), np.uint8)  # as a tensor on the GPU would be
    was = ELEMENTWISE_LOADED.is_set()
    try:
        ELEMENTWISE_LOADED.clear()
        assert gpu_wire_format(small, "uint8") == "rgb24"  # a plain copy: no kernel to load
        assert gpu_wire_format(small, "float16") == "yuv420p"  # converted there anyway
        ELEMENTWISE_LOADED.set()
        assert gpu_wire_format(small, "uint8") == "yuv420p"
    finally:
        if not was:
            ELEMENTWISE_LOADED.clear()


def test_a_worker_exiting_at_once_waits_for_the_background_step_under_way(
    tmp_path: Path,
) -> None:
    """A worker whose first request ends before the background has loaded the kernels
    exits then: the interpreter ending a thread that is inside CUDA kills the process
    ("terminate called without an active exception"), so the exit waits for the step
    under way, and the background registers nothing more."""
    log = tmp_path / "background.log"
    script = textwrap.dedent(
        f"""
        import time
        from typing import Any, cast
        from client import _cuda
        from tests.test_gpu_worker_background import Maps

        def loading(device: Any = None) -> None:  # stands for the kernels' first launches
            time.sleep(0.5)
            with open({str(log)!r}, "a") as f:
                f.write("loaded\\n")

        class Runtime:
            def register(self, address: int, size: int) -> int:
                with open({str(log)!r}, "a") as f:
                    f.write(f"registered {{address}}\\n")
                return _cuda.CUDA_SUCCESS

        _cuda.warm_elementwise = loading
        host = _cuda.CudaHost(maps=cast(Any, Maps()))
        host._runtime = cast(Any, Runtime())
        host.warm_in_background()
        time.sleep(0.05)  # the background is inside the load; the worker ends here
        """
    )
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == ["loaded"]
    assert time.monotonic() - t0 < 30.0
