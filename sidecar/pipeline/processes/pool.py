"""Encoder processes: videos encoded outside the daemon's GIL.

Opening libx264 takes 3-5 ms and PyAV holds the GIL through it, so in one process a
ready encoder opened for the next request stalls the request being encoded, and eight
clients' opens and per-frame calls queue behind one lock; eight long videos' per-frame
calls do too. So every MP4 without audio whose frames are all in leases, and which is not
cut into segments (see segments), goes to a pool of encoder processes (`main`),
each with its own GIL and its own ready encoder. A process answers, then opens its next
encoder while another takes the next request: back-to-back requests alternate between
processes and never wait for an open. For that, a request that takes the only encoder
ready for its settings has a free process open another at once, while it encodes; so as
many stay ready as requests for those settings run at once. A long encode reports
progress over the pipe, and a request cancelled meanwhile tells its process to stop.

Three processes start with the daemon and stay, or one more than the encodes the daemon
runs at once where that is more (`kept`): a clip of a few small frames encodes faster
than an encoder opens, so with two, back-to-back requests would wait for the other one's
open; and a first burst of as many clients as there are encode slots finds a process for
each instead of starting them while it runs (on the H100, eight fresh clients' third and
fourth waves took up to 3x the steady time while five processes started beside them). More
start on demand, in the background, one for every request that found
all of them busy (about 0.3 s each; requests meanwhile encode in the daemon), up to
`limit`. Every process closes its encoder and trims its heap after `idle_s` without
work (`--idle-release`, 30 s), so an idle daemon gives the encoders' memory back; the
processes beyond those kept stay up for `KEEP_PEAK_S` more (ten minutes), so that a burst
after a pause finds as many as the last one needed, and only an open to pay (3-5 ms),
not a process start (about 0.3 s of a core each, while the burst runs). A process that
dies costs no request: its frames are still in the leases and another process takes them
(a second death fails the request). Processes that exit
before they are up (a broken environment: a library the child cannot load, a limit on
processes) are said in the log and tried again after 1, 2, 4... up to 60 s, not three
times a second: requests meanwhile encode in the daemon.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from ...codec.memory import RELEASE_S
from ..encoding.warm import EncoderKey
from .handle import STOP_WAIT_S, EncoderProcess, log_stopped
from .main import Prepare

log = logging.getLogger(__name__)

KEEP = 3  # started with the daemon and kept, at least
KEEP_PEAK_S = 600.0  # processes beyond those kept, idle this long past `idle_s`, stop
MAINTAIN_S = 1.0  # how often the pool looks for idle processes to stop
START_RETRY_S = (1.0, 60.0)  # first and longest wait after processes fail to start
STALE_S = 1.0  # a ready encoder unused this long may be replaced by one for other settings


def kept(limit: int, concurrent: int) -> int:
    """Processes started with the daemon and kept: `KEEP`, or one more than the encodes
    that run at once (`concurrent`, 0: not known), within `limit`."""
    return min(limit, max(KEEP, concurrent + 1 if concurrent > 0 else 0))


def _ranked(
    procs: list[EncoderProcess], key: EncoderKey, now: float
) -> list[tuple[int, EncoderProcess]]:
    """`procs` by how soon each would encode `key` (see `EncoderProcess.rank`). An
    encoder is spare when unused for `STALE_S`, or when another of `procs` holds one
    for the same settings."""
    held = Counter(p.holds for p in procs)
    ranks = [
        (p.rank(key, held[p.holds] > 1 or now - p.idle_since > STALE_S), i)
        for i, p in enumerate(procs)
    ]
    return [(rank, procs[i]) for rank, i in sorted(ranks)]


def _prepare_another(
    others: list[EncoderProcess],
    key: EncoderKey,
    now: float,
    prepare: Prepare,
    found_ready: bool,
) -> None:
    """Unless one of `others` holds an encoder for `key`, have one open it now: a
    spare one. When the request found none ready either, the settings are wanted back to
    back: then an encoder others may want goes too, the least used; and one more opens
    even while another is opening for `key`, since requests come faster than opens (a
    client on the framed socket, on two cores, found none ready in most of 30 requests)."""
    ranked = _ranked(others, key, now)  # ranked anew: which encoders are spare changed
    if not ranked or ranked[0][0] == 0 or (ranked[0][0] == 1 and found_ready):
        return
    spare = [p for rank, p in ranked if rank == 2]
    if not spare and not found_ready:
        spare = [p for _, p in ranked if not p.opening]
    if spare:
        min(spare, key=lambda p: p.idle_since).prepare(prepare)


class EncoderProcesses:
    """Up to `limit` encoder processes, started when requests need them; beyond the
    first `kept(limit, concurrent)`, each stops after `idle_s` without work."""

    def __init__(self, limit: int, idle_s: float = RELEASE_S, concurrent: int = 0) -> None:
        self.limit = limit
        self.idle_s = idle_s
        self.kept = kept(limit, concurrent)  # started at once, and never stopped for idling
        self._slab_paths: list[str] = []
        self._procs: list[EncoderProcess] = []
        self._wanted = 0  # processes the traffic asks for
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.spawned = 0
        self.hits = 0  # encodes that found the process's encoder ready
        self.misses = 0
        self._failed_rounds = 0  # checks in a row that found such processes
        self._next_start = 0.0  # monotonic time before which none is started

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def start(self, slab_paths: list[str]) -> None:
        if not self.enabled:
            return
        self._slab_paths = slab_paths
        self._wanted = self.kept
        self._thread = threading.Thread(target=self._maintain, name="encoder-processes")
        self._thread.daemon = True
        self._thread.start()

    def wait_started(self, timeout: float) -> bool:
        """Wait, at most `timeout` seconds, until the processes kept from the start are up
        (their first encode done); False if they are not by then (requests are encoded
        in the daemon meanwhile, as ever)."""
        want = self.kept
        deadline = time.monotonic() + timeout
        while self.ready < want:
            if time.monotonic() >= deadline or self._closed or self._failed_rounds:
                return False  # (processes that exit before they are up: not worth a wait)
            time.sleep(0.02)
        return True

    @property
    def count(self) -> int:
        return len(self._procs)

    @property
    def ready(self) -> int:
        """Processes up and not broken (started ones said so)."""
        with self._lock:
            for proc in self._procs:
                if not proc.busy:
                    proc.poll()
            return sum(p.started and not p.broken for p in self._procs)

    def take(self, key: EncoderKey, prepare: Prepare | None = None) -> EncoderProcess | None:
        """The free process that can start on `key` soonest, or None (encode in the
        daemon): none is up yet, or all are busy. Give it back with `give()`. With
        `prepare`, another free process opens an encoder for the next such request,
        unless one is ready or opening already."""
        if not self.enabled or self._closed:
            return None
        now = time.monotonic()
        with self._lock:
            free = [p for p in self._procs if not p.busy]
            for proc in free:
                proc.poll()
            usable = [p for p in free if p.started and not p.broken]
            ranked = _ranked(usable, key, now)
            if not ranked:
                # Every process is busy: the traffic runs more at once than there are.
                # Each request that finds them so asks for one more, so a burst of eight
                # starts the processes it needs at once, not one per wave of requests.
                # (A new setting, or a process still opening, is no reason: starting one
                # costs more CPU than the open it would save.)
                self._wanted = min(self.limit, max(self._wanted, len(self._procs)) + 1)
                self._wake.set()
                return None
            rank, best = ranked[0]
            best.busy, best.taken_ready = True, rank == 0
            if prepare is not None:
                others = [p for p in usable if p is not best]
                _prepare_another(others, key, now, prepare, found_ready=rank == 0)
            return best

    def give(self, proc: EncoderProcess, warm: bool | None = None) -> None:
        """Hand `proc` back; `warm` says whether the process used the encoder it had
        ready (None: no answer). A hit is that, with the encoder ready when taken."""
        with self._lock:
            if warm is not None:
                hit = warm and proc.taken_ready
                self.hits += hit
                self.misses += not hit
            proc.busy = False
            proc.idle_since = time.monotonic()
            if proc.broken:
                self._procs.remove(proc)
            else:
                return
        # Reaped on a thread of its own: a killed process takes a while to go on a busy
        # host, and the request it served (cancelled, or failed) ends now, not then.
        threading.Thread(target=_reap, args=(proc,), name="encoder-reaper", daemon=True).start()

    def _maintain(self) -> None:
        while not self._closed:
            self._wake.wait(MAINTAIN_S)
            self._wake.clear()
            if self._closed:
                return
            self._stop_idle()
            while not self._closed and self._spawn_one():
                pass

    def _spawn_one(self) -> bool:
        with self._lock:
            if len(self._procs) >= self._wanted or time.monotonic() < self._next_start:
                return False
        try:
            proc = EncoderProcess(self._slab_paths, self.idle_s)
        except OSError as exc:
            log.warning("cannot start an encoder process: %s", exc)
            with self._lock:
                self._wanted = len(self._procs)
            return False
        with self._lock:
            if self._closed:
                idle = [proc]
            else:
                self._procs.append(proc)
                self.spawned += 1
                log.debug("started encoder process %d", proc.popen.pid)
                return True
        for extra in idle:
            extra.stop()
        return False

    def _stop_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            for proc in self._procs:
                if not proc.busy:
                    proc.poll()
            dead = [p for p in self._procs if not p.busy and p.broken]
            idle = list(dead)
            spare = len(self._procs) - len(idle) - self.kept
            idle += [
                p
                for p in self._procs
                if not p.busy and not p.broken and now - p.idle_since > self.idle_s + KEEP_PEAK_S
            ][: max(0, spare)]
            for proc in idle:
                self._procs.remove(proc)
            if idle:
                self._wanted = max(len(self._procs), self.kept)
            retry_s = self._count_failed_starts(dead, now)
        for proc in idle:
            proc.stop()
        for proc in dead:
            if proc.started:
                log_stopped(proc.popen)
        failed = [proc.popen.returncode for proc in dead if not proc.started]
        if failed:
            log.warning(
                "%d encoder process(es) exited before they were up (exit codes %s); "
                "encoding in the daemon, next try in %.0f s",
                len(failed),
                ", ".join(sorted({str(code) for code in failed})),
                retry_s,
            )

    def _count_failed_starts(self, dead: list[EncoderProcess], now: float) -> float:
        """Back off starting processes while they exit before they are up; once one is
        up, start them at once again. The wait before the next start (under the lock)."""
        if any(not p.started for p in dead):
            self._failed_rounds += 1
            first, longest = START_RETRY_S
            wait = min(longest, first * (1 << min(self._failed_rounds - 1, 16)))
            self._next_start = now + wait
            return wait
        if any(p.started and not p.broken for p in self._procs):
            self._failed_rounds = 0
        return 0.0

    def close(self) -> None:
        """Stop every process; one still encoding is left to end with the daemon."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)
        with self._lock:
            idle = [p for p in self._procs if not p.busy]
            self._procs.clear()
        for proc in idle:
            proc.stop()


def _reap(proc: EncoderProcess) -> None:
    proc.stop()  # reaped: its exit code is known
    log_stopped(proc.popen)
