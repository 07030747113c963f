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


class RunHandedBack(RuntimeError):
    """H15: the worker is stopping and its soft-shutdown window ended before this run did; the run
    was cancelled (committing nothing, H4) so that the job can go back to the queue."""


class ProcessLoop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grounded-agent-loop", daemon=True)
        self.thread.start()
        self._running: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()
        self.handing_back = False

    def submit(self, make: Callable[[], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        """Starts the coroutine on the loop without waiting for it; context variables travel with it."""
        return asyncio.run_coroutine_threadsafe(make(), self.loop)

    def run(self, make: Callable[[], Coroutine[Any, Any, T]], *, timeout: float) -> T:
        """Runs the coroutine on the loop and waits for it. Context variables (the job's log
        bindings) travel with it; on timeout the run is cancelled, so it commits nothing (H4)."""
        with self._lock:
            if self.handing_back:
                raise RunHandedBack("the worker is stopping; the job goes back to the queue")
            future = self.submit(make)
            self._running.add(future)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RunTimedOut(f"the job did not finish within {timeout:g} s and was cancelled") from None
        except concurrent.futures.CancelledError:
            if self.handing_back:
                raise RunHandedBack("the worker's soft-shutdown window ended before the job did; "
                                    "it goes back to the queue") from None
            raise
        finally:
            with self._lock:
                self._running.discard(future)

    def hand_back(self) -> int:
        """H15: cancels every run still going (and any that would start), so each task can put its
        job back on the queue; returns how many were running."""
        with self._lock:
            self.handing_back = True
            running = list(self._running)
        for future in running:
            future.cancel()
        return len(running)

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

    @property
    def current(self) -> T | None:
        """This process's value if it was made, without making one."""
        with self._lock:
            if self._current is None or self._current[0] != os.getpid():
                return None
            return self._current[1]

    def reset(self) -> None:
        """Forget this process's value, so the next `get` makes a new one (tests change settings)."""
        with self._lock:
            self._current = None


_loop = PerProcess(ProcessLoop)


def process_loop() -> ProcessLoop:
    """This process's loop, made on first use (and again in a forked child)."""
    return _loop.get()


def hand_back_running_runs() -> int:
    """H15: hands back the runs of this process's loop, if it has one (a prefork parent has none)."""
    current = _loop.current
    return current.hand_back() if current is not None else 0
