"""One long-lived event loop per worker process, on its own thread (docs/design/architecture.md, "Queue").

Celery runs no `async def` tasks, and an HTTP model client is bound to the loop it first ran on, so
every task of a process submits its agent run to this one loop. It is created lazily, so a prefork
child makes its own after the fork instead of inheriting a copy whose thread did not survive.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RunTimedOut(TimeoutError):
    """The job's runs outlasted run.timeout_s (or the worker's soft limit); the run was cancelled."""


class ProcessLoop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grounded-agent-loop", daemon=True)
        self.thread.start()

    def submit(self, make: Callable[[], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        """Starts the coroutine on the loop without waiting for it; context variables travel with it."""
        return asyncio.run_coroutine_threadsafe(make(), self.loop)

    def run(self, make: Callable[[], Coroutine[Any, Any, T]], *, timeout: float) -> T:
        """Runs the coroutine on the loop and waits for it. Context variables (the job's log
        bindings) travel with it; on timeout the run is cancelled, so it commits nothing (H4)."""
        future = self.submit(make)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RunTimedOut(f"the job did not finish within {timeout:g} s and was cancelled") from None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class PerProcess(Generic[T]):
    """One value per process, made on first use: a forked child makes its own instead of using the
    parent's copy, whose threads and connections did not survive the fork."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._current: tuple[int, T] | None = None

    def get(self) -> T:
        with self._lock:
            if self._current is None or self._current[0] != os.getpid():
                self._current = (os.getpid(), self._make())
            return self._current[1]

    def reset(self) -> None:
        """Forget this process's value, so the next `get` makes a new one (tests change settings)."""
        with self._lock:
            self._current = None


_loop = PerProcess(ProcessLoop)


def process_loop() -> ProcessLoop:
    """This process's loop, made on first use (and again in a forked child)."""
    return _loop.get()
