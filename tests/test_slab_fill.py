"""The page-table fill of a process's slab mappings (`client._slabs.ProcessMaps`) against
clients letting go of them at the same time: a slab is never unmapped while the kernel
fills it, and an address unmapped before the fill reaches it is not left marked filled
for the next mapping placed there (which would then go unfilled)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from client import _slabs
from client._slabs import ProcessMaps, SlabInfo

SIZE = 1 << 20


def _slab(tmp_path: Path, name: str = "slab0") -> SlabInfo:
    (tmp_path / name).write_bytes(bytes(SIZE))
    return SlabInfo(0, name, SIZE)


def _fill_held(
    maps: ProcessMaps, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Thread, threading.Event]:
    """A fill of `maps` on a thread of its own, held inside the kernel's call until the
    event returned is set."""
    started, go = threading.Event(), threading.Event()
    real = _slabs._madvise

    def held(address: int, size: int, advice: int) -> bool:
        started.set()
        assert go.wait(10)
        return real(address, size, advice)

    monkeypatch.setattr(_slabs, "_madvise", held)
    fill = threading.Thread(target=maps._fill)
    fill.start()
    assert started.wait(10)
    return fill, go


def _mapped(tmp_path: Path) -> tuple[ProcessMaps, str, int]:
    """A process's maps holding one slab: the maps, the slab's path and its address (the
    array let go of, so that only the mapping holds it)."""
    maps = ProcessMaps()
    path, array = maps.acquire(str(tmp_path), _slab(tmp_path))
    return maps, path, int(array.ctypes.data)


def test_a_slab_let_go_of_during_its_fill_is_unmapped_once_the_fill_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    maps, path, address = _mapped(tmp_path)
    fill, go = _fill_held(maps, monkeypatch)
    release = threading.Thread(target=maps.release, args=(path,))
    release.start()
    time.sleep(0.2)
    assert release.is_alive()  # waits for the kernel to finish with the range
    go.set()
    fill.join(10)
    release.join(10)
    assert not release.is_alive() and not maps.addresses()
    assert address not in maps._populated


def test_a_slab_unmapped_before_the_fill_reaches_it_is_not_marked_filled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    maps, path, address = _mapped(tmp_path)
    seen = maps.addresses()  # what a fill started now would go through
    maps.release(path)
    called: list[int] = []
    monkeypatch.setattr(_slabs, "_madvise", lambda a, s, v: called.append(a) or True)
    monkeypatch.setattr(maps, "addresses", lambda: seen)
    maps._fill()
    assert called == [] and address not in maps._populated
    # The next mapping, wherever the kernel places it, is filled.
    monkeypatch.undo()
    monkeypatch.setattr(_slabs, "_madvise", lambda a, s, v: called.append(a) or True)
    _, array = maps.acquire(str(tmp_path), _slab(tmp_path, "slab1"))
    maps.populate()
    assert called == [int(array.ctypes.data)]


def test_clients_mapping_a_new_daemons_slab_during_a_fill_share_one_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new daemon's slab by the same name replaces the old mapping once its fill ends;
    a second client mapping it meanwhile is not lost to the first one's."""
    maps = ProcessMaps()
    maps.acquire(str(tmp_path), _slab(tmp_path))
    fill, go = _fill_held(maps, monkeypatch)
    (tmp_path / "slab0").unlink()  # the new daemon's segment, larger
    (tmp_path / "slab0").write_bytes(bytes(2 * SIZE))
    new = SlabInfo(0, "slab0", 2 * SIZE)
    got: list[int] = []

    def acquire() -> None:
        got.append(int(maps.acquire(str(tmp_path), new)[1].ctypes.data))

    clients = [threading.Thread(target=acquire) for _ in range(2)]
    for client in clients:
        client.start()
        time.sleep(0.1)
    go.set()
    for thread in (fill, *clients):
        thread.join(10)
    assert len(got) == 2 and got[0] == got[1]
    (mapping,) = maps._maps.values()
    assert mapping.users == 2 and mapping.array.size == 2 * SIZE
