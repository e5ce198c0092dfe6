"""Both clients behind one blocking face, so that every client test runs against both.

`open_client("sync", socket)` is a plain `SidecarClient`. `open_client("async", socket)`
is an `AsyncSidecarClient` whose coroutines run to completion on its own event loop, in a
thread of its own (so replies are read while the test thread sleeps, as in a real
program); its streams and async iterators are made blocking the same way, and attributes
that are not coroutines pass through. Calls from several test threads become concurrent
tasks on that one loop.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

from client import AsyncSidecarClient, SidecarClient

TWINS = ("sync", "async")
CALL_LIMIT_S = 300  # a hung call fails its test instead of hanging the session


class _Loop:
    """An event loop running in a thread of its own."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if os.getpid() != self.pid:  # a child after fork: the loop's thread is not here
            return asyncio.run(coro)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(CALL_LIMIT_S)

    def stop(self) -> None:
        if os.getpid() == self.pid:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()


class Blocking:
    """`target` with its coroutines awaited, async context managers and iterators made
    blocking, through `runner`."""

    def __init__(self, target: Any, runner: _Loop) -> None:
        self._target = target
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._blocking(attr(*args, **kwargs))

        return call

    def _blocking(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            return self._blocking(self._runner.run(_awaited(value)))
        if isinstance(value, AsyncIterator):
            return self._iterate(value)
        if hasattr(value, "__aenter__"):
            return Blocking(value, self._runner)
        return value

    def _iterate(self, items: AsyncIterator[Any]) -> Iterator[Any]:
        while True:
            try:
                yield self._runner.run(_awaited(items.__anext__()))
            except StopAsyncIteration:
                return

    def __enter__(self) -> Blocking:
        self._runner.run(self._target.__aenter__())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._runner.run(self._target.__aexit__(*exc))


class AsyncTwin(Blocking):
    """An `AsyncSidecarClient` on a loop of its own; closing it stops the loop."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        runner = _Loop()
        super().__init__(runner.run(_made(target, kwargs)), runner)

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._runner.stop()


async def _made(target: str, kwargs: dict[str, Any]) -> AsyncSidecarClient:
    return AsyncSidecarClient(target, **kwargs)  # on the loop it will be used from


async def _awaited(value: Any) -> Any:
    return await value


def open_client(twin: str, target: str, **kwargs: Any) -> Any:
    """A client of either twin, used as `with open_client(...) as c:`."""
    if twin == "sync":
        return SidecarClient(target, **kwargs)
    return AsyncTwin(target, **kwargs)
