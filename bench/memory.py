"""The memory suite and the daemon's memory: RssAnon of it and its encoder processes."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from .common import (
    Row,
    summarise,
)
from .daemons import daemon


def status_kib(pid: int) -> dict[str, int]:
    """The KiB fields of /proc/PID/status (VmRSS, RssAnon, ...); empty once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    lines = [line.split() for line in status.splitlines() if line.endswith(" kB")]
    return {fields[0].rstrip(":"): int(fields[1]) for fields in lines}


def memory() -> list[Row]:
    """Idle daemon RSS, excluding the slabs (shared memory)."""
    with daemon() as d:
        time.sleep(2.0)
        fields = status_kib(d.pid)
    private_mib = (fields.get("RssAnon", 0) + fields.get("RssFile", 0)) / 1024
    row = summarise("idle_rss_excluding_slabs", "-", [private_mib])
    row.extra = {
        "rss_mib": round(fields.get("VmRSS", 0) / 1024, 1),
        "rss_anon_mib": round(fields.get("RssAnon", 0) / 1024, 1),
        "rss_file_mib": round(fields.get("RssFile", 0) / 1024, 1),
        "rss_shmem_mib": round(fields.get("RssShmem", 0) / 1024, 1),
        "private_mib": round(private_mib, 1),
    }
    print(f"idle daemon: {row.extra}", flush=True)
    return [row]


def children(pid: int) -> list[int]:
    """The live child processes of `pid`: for the daemon, its encoder processes."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids += [int(k) for k in (task / "children").read_text().split()]
    return sorted(set(kids))


def tree_rss_anon(pid: int) -> dict[str, Any]:
    """MiB of RssAnon: the daemon's, its processes' in all, and how many processes."""
    kids = children(pid)
    own, *theirs = (status_kib(p).get("RssAnon", 0) for p in [pid, *kids])
    return {
        "daemon_mib": round(own / 1024, 1),
        "processes": len(kids),
        "total_mib": round((own + sum(theirs)) / 1024, 1),
    }


class TreeMemory:
    """Samples `tree_rss_anon` every `every` seconds in a thread, from `start()` on;
    `after_load()` then lets the daemon idle and reports how its memory came back."""

    def __init__(self, pid: int, every: float = 1.0) -> None:
        self.pid, self.every = pid, every
        self.peak: dict[str, Any] = {}  # the sample with the most memory, under load
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)

    def start(self) -> TreeMemory:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = tree_rss_anon(self.pid)
            if sample["total_mib"] > self.peak.get("total_mib", -1):
                self.peak = sample
            self._stop.wait(self.every)

    def after_load(self, idle_s: float, every: float = 5.0) -> Row:
        """Stop sampling the load, idle `idle_s` seconds sampling every `every`, and
        return a row: MiB of RssAnon (daemon and encoder processes) at the end of the
        idle, with the peak under load and the idle samples in its details."""
        self._stop.set()
        self._thread.join()
        idle: list[dict[str, Any]] = []
        t0 = time.monotonic()
        while True:
            waited = time.monotonic() - t0
            idle.append({"idle_s": round(waited, 1), **tree_rss_anon(self.pid)})
            print(f"  memory after {waited:5.1f} s idle: {idle[-1]}", flush=True)
            if waited >= idle_s:
                break
            time.sleep(min(every, idle_s - waited))
        row = summarise("rss_anon_after_load_mib", "-", [idle[-1]["total_mib"]])
        row.suite = "memory"
        row.extra = {
            "idle_s": idle_s,
            "daemon_mib": idle[-1]["daemon_mib"],
            "processes": idle[-1]["processes"],
            "peak_under_load": self.peak,
            "end_of_load": idle[0],
            "idle": idle,
        }
        return row
