"""The clients the daemon knows: one token per Attach, bounded in number."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import NotAttached

MAX_CLIENTS = 4096
# What of a client's chosen name reaches logs and status: these characters, others as "?".
_NOT_SHOWN = re.compile(r"[^A-Za-z0-9_.:@+-]")


@dataclass
class ClientInfo:
    name: str
    pid: int
    attached_at: float
    called_at: float  # its last call, on the monotonic clock


class Clients:
    def __init__(self, limit: int = MAX_CLIENTS) -> None:
        self._limit = limit
        self._clients: dict[str, ClientInfo] = {}

    def attach(self, name: str, pid: int, busy: Callable[[], set[str]]) -> str:
        """A fresh token. At the limit, the older half of the clients holding no lease
        (`busy()` gives the tokens that hold one) is forgotten first."""
        if len(self._clients) >= self._limit:
            self._forget_idle(busy())
        token = secrets.token_hex(16)
        self._clients[token] = ClientInfo(name[:128], pid, time.time(), time.monotonic())
        return token

    def name(self, token: str) -> str:
        """The client's name as logs and status show it (allow-listed characters only)."""
        info = self._clients.get(token)
        return _NOT_SHOWN.sub("?", info.name[:64]) if info is not None else "?"

    def check(self, token: str) -> None:
        """`token` is attached (else NotAttached), and called just now."""
        info = self._clients.get(token)
        if info is None:
            raise NotAttached("unknown client token; call Attach (the daemon may have restarted)")
        info.called_at = time.monotonic()

    def live(self, within: float, busy: set[str]) -> int:
        """Clients live now: in `busy` (holding a lease, an encode in flight, waiting for
        room), or that called within the last `within` seconds."""
        since = time.monotonic() - within
        clients = self._clients.items()
        return sum(token in busy or info.called_at >= since for token, info in clients)

    def __len__(self) -> int:
        return len(self._clients)

    def _forget_idle(self, busy: set[str]) -> None:
        idle = sorted(
            (t for t in self._clients if t not in busy), key=lambda t: self._clients[t].attached_at
        )
        for token in idle[: len(idle) // 2 + 1]:
            del self._clients[token]
