"""One encoder process, as the daemon sees it: started, handed jobs, told to stop, and
killed when it does not (see `pool` for the pool of them, `main` for the
process itself)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from pathlib import Path
from typing import NoReturn

from ...codec.memory import RELEASE_S
from ...errors import EncodeFailed
from ..encoding.warm import EncoderKey, interned
from .main import Answer, Assignment, FramesEncoded, Prepare, Ready, Stop

log = logging.getLogger(__name__)

STOP_WAIT_S = 2.0  # a process told to leave, then killed

STOP_POLL_S = 0.05  # how soon a cancelled request's process is told to stop
# A process told to stop looks for it after every frame and between the packets of the
# encoder's final drain; one that has not answered this long after is killed, so that a
# cancelled encode stops within about a second whatever it was doing: hung (or stopped:
# SIGSTOP, a debugger), or inside one long encoder call (x264 at placebo took 3 s for one
# packet of 640x480 on two cores). That costs only the cancelled request: its frames are
# in its leases, which come back, and the pool starts another process (see `give`).
STOP_GRACE_S = 0.5
# Said when a process that was up dies (the OOM killer, a crash); the pool starts another.
STOPPED = "encoder process %d stopped (exit code %s, negative: killed by that signal)"


class ProcessGone(EncodeFailed):
    """The encoder process died before answering (its frames are still in the leases)."""


class EncoderProcess:
    """The daemon's end of one encoder process. Not thread-safe: the pool hands each to
    one job at a time."""

    def __init__(self, slab_paths: list[str], idle_s: float = RELEASE_S) -> None:
        ours, theirs = socket.socketpair()
        package_root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        argv = [
            sys.executable,
            "-m",
            "sidecar.pipeline.processes.main",
            str(theirs.fileno()),
            str(idle_s),
        ]
        try:
            self.popen = subprocess.Popen(
                [*argv, *slab_paths],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C reaches the daemon only
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        # One poll object for the pipe: Connection.poll() builds a selector on each call
        # (tens of microseconds beside encoder threads), and a request polls a few times.
        self._poller = select.poll()
        self._poller.register(self.conn.fileno(), select.POLLIN)
        self.started = False  # said it is up
        self.opening = False  # opening its next encoder, for `next_key`
        self.next_key: EncoderKey | None = None
        self.ready_key: EncoderKey | None = None
        self.busy = False
        self.taken_ready = False  # its encoder was ready for the job it was taken for
        self.broken = False
        self.idle_since = time.monotonic()

    def poll(self) -> None:
        """Take in what the process said while nobody was waiting for it."""
        try:
            while not self.broken and self._readable(0.0):
                self._heard(self.conn.recv())
        except (EOFError, OSError):
            self.broken = True

    @property
    def holds(self) -> EncoderKey | None:
        """The settings of the encoder this process has ready, or is opening."""
        return self.next_key if self.opening else self.ready_key

    def rank(self, key: EncoderKey, spare: bool) -> int:
        """How soon this process would encode `key`: lower is sooner. Ready for it;
        opening one for it (a wait shorter than an open); an open, in a process with
        nothing ready or with an encoder to `spare`; an encoder others may still want."""
        if self.holds == key:
            return 1 if self.opening else 0
        if self.holds is None or (spare and not self.opening):
            return 2
        return 3

    def prepare(self, job: Prepare) -> None:
        """Have the process open an encoder for `job`'s settings while it waits."""
        try:
            self.conn.send(job)
        except OSError:
            self.broken = True
            return
        self.opening, self.next_key, self.ready_key = True, job.key, None
        self.idle_since = time.monotonic()

    async def encode(
        self,
        job: Assignment,
        progress: Callable[[int], None] = lambda frames: None,
        stopped: Callable[[], bool] = lambda: False,
    ) -> Answer:
        """Run `job` there, passing on its progress; once `stopped()`, the process is
        told to stop (it answers Cancelled). ProcessGone if it dies meanwhile, or is
        killed for not answering within `STOP_GRACE_S` of that. Awaited on the event
        loop, which watches the pipe (see `process_route.InEncoderProcess`)."""
        told_to_stop_at: float | None = None
        # A process still opening an encoder for `job` reads it once that is done.
        waits = self.opening and self.next_key == job.key
        sent_at = time.perf_counter()
        try:
            self.conn.send(job)
            while True:
                if told_to_stop_at is None and stopped():
                    self.conn.send(Stop())
                    told_to_stop_at = time.monotonic()
                # Checked whatever the process says: one that sends progress and does not
                # stop is killed as surely as one that says nothing.
                if told_to_stop_at is not None and (
                    time.monotonic() - told_to_stop_at > STOP_GRACE_S
                ):
                    self._kill_hung()
                if not await self._readable_from_loop(STOP_POLL_S):
                    continue
                message = self.conn.recv()
                if isinstance(message, Answer):
                    if message.in_file:
                        message.memfd = self._descriptor()
                    if waits and "open" in message.timings_s:
                        message.timings_s["open"] += max(0.0, message.received_at - sent_at)
                    self.opening, self.next_key, self.ready_key = True, job.key, None
                    return message
                if isinstance(message, FramesEncoded):
                    progress(message.frames)
                else:
                    self._heard(message)
        except (EOFError, OSError):
            self.broken = True
            raise ProcessGone("an encoder process stopped during the encode") from None

    async def _readable_from_loop(self, timeout_s: float) -> bool:
        """`_readable`, waited for on the running loop, at most `timeout_s`."""
        if self._readable(0.0):
            return True
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        fd = self.conn.fileno()
        loop.add_reader(fd, wake)
        timer = loop.call_later(timeout_s, wake)
        try:
            await woken
        finally:
            timer.cancel()
            loop.remove_reader(fd)
            # uvloop (libuv) made it non-blocking to watch it; the pipe's reads and
            # writes (multiprocessing's) want it blocking.
            os.set_blocking(fd, True)
        return self._readable(0.0)

    def _kill_hung(self) -> NoReturn:
        log.warning(
            "encoder process %d did not stop within %.1f s of being told to (hung, or in "
            "one long encoder call); killed it, and another starts",
            self.popen.pid,
            STOP_GRACE_S,
        )
        self.popen.kill()
        self.broken = True
        raise ProcessGone("an encoder process did not stop when told, and was killed")

    def _descriptor(self) -> int:
        """The memfd a large answer's bytes are in, sent right after it."""
        try:
            return int(recv_handle(self.conn))
        except RuntimeError:  # something else came: the process is not to be trusted
            raise EOFError("no descriptor after a large answer") from None

    def _readable(self, timeout_s: float) -> bool:
        """Whether the process said something (or is gone: the next read raises)."""
        return bool(self._poller.poll(timeout_s * 1000))

    def _heard(self, message: object) -> None:
        if isinstance(message, Ready):
            self.started = True
            self.opening = False
            self.ready_key = None if message.key is None else interned(message.key)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        with contextlib.suppress(OSError, KeyError, ValueError):
            self._poller.unregister(self.conn.fileno())  # before its number can be reused
        with contextlib.suppress(OSError):
            self.conn.close()
        try:
            self.popen.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def log_stopped(popen: subprocess.Popen[bytes]) -> None:
    """Say that an encoder process ended; with `--log-json`, its pid and exit code as keys."""
    extra = {"encoder_pid": popen.pid, "exit_code": popen.returncode}
    log.warning(STOPPED, popen.pid, popen.returncode, extra=extra)
