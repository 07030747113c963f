"""Waiting for something to finish by asking again: one loop for every caller that follows a batch
(the CLI, the demo, experiments, the HTTP client), so their timeouts behave alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class StillWaiting(TimeoutError, Generic[T]):
    """The wait ran out; `last` is what was seen last, so the caller can say how far it got."""

    def __init__(self, last: T, timeout_s: float) -> None:
        super().__init__(f"still not finished after {timeout_s:g} s")
        self.last, self.timeout_s = last, timeout_s


def poll_until(
    fetch: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout_s: float,
    interval_s: float = 0.5,
    on_each: Callable[[T], None] = lambda _: None,
    pause: Callable[[float], object] = time.sleep,
) -> T:
    """`fetch()` until `done` says so; raises StillWaiting after `timeout_s`. Whatever `fetch`
    raises (a batch that does not exist) propagates at once. `pause` waits between asks; one that
    returns early when the awaited thing happens (`ResultsStore.wait_finished`) ends the wait then."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fetch()
        on_each(value)
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise StillWaiting(value, timeout_s)
        pause(interval_s)
