"""One long-lived event loop per worker process, on its own thread (API-NOTES §3).

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
from typing import Any, TypeVar

T = TypeVar("T")


class RunTimedOut(TimeoutError):
    """The job's runs outlasted run.timeout_s (or the worker's soft limit); the run was cancelled."""


class ProcessLoop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grounded-agent-loop", daemon=True)
        self.thread.start()

    def run(self, make: Callable[[], Coroutine[Any, Any, T]], *, timeout: float) -> T:
        """Runs the coroutine on the loop and waits for it. Context variables (the job's log
        bindings) travel with it; on timeout the run is cancelled, so it commits nothing (H4)."""
        future = asyncio.run_coroutine_threadsafe(make(), self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RunTimedOut(f"the job did not finish within {timeout:g} s and was cancelled") from None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


_lock = threading.Lock()
_current: tuple[int, ProcessLoop] | None = None


def process_loop() -> ProcessLoop:
    """This process's loop, made on first use (and again in a forked child)."""
    global _current
    with _lock:
        if _current is None or _current[0] != os.getpid():
            _current = (os.getpid(), ProcessLoop())
        return _current[1]
