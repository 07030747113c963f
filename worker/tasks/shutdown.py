"""H15: a stopping worker finishes what it can within a window, then hands the rest back at once.

SIGTERM (a KEDA scale-down, a rolling deploy, `docker stop`) starts Celery's warm shutdown: the
worker takes no new jobs, jobs it reserved but never started go back to the queue, and running
jobs may finish. Left alone, a warm shutdown waits for the longest job (up to the hard limit,
11 minutes) and a pod's grace period must cover it. Instead, `GROUNDED_SOFT_SHUTDOWN_S` after the
signal, every run still going is cancelled (committing nothing, H4) and its task puts the job back
at the head of the queue, where another worker takes it within a poll. A stop with no running job
ends at once; Celery's own soft shutdown would sleep out the whole window, and its cancellation
cannot stop a thread.
"""

from __future__ import annotations

import threading
from typing import Any

import structlog

from worker.runtime.loop import hand_back_running_runs
from worker.settings import get_settings

log = structlog.get_logger()


def hand_back_after_window(window_s: float) -> threading.Timer:
    """Starts the window's clock; a daemon timer, so a worker whose jobs all finished exits without it."""

    def hand_back() -> None:
        count = hand_back_running_runs()
        log.warning("soft_shutdown_window_ended", handed_back=count, window_s=window_s)

    timer = threading.Timer(window_s, hand_back)
    timer.daemon = True
    timer.start()
    return timer


def on_worker_shutting_down(sig: str = "", how: str = "", exitcode: int = 0, **_: Any) -> None:
    """Connected to Celery's worker_shutting_down (worker/app.py). Only a warm shutdown waits for
    running jobs; a cold one (SIGQUIT, a second Ctrl+C) ends them itself."""
    if how != "Warm":
        return
    window_s = get_settings().soft_shutdown_s
    log.info("soft_shutdown_started", signal=sig, window_s=window_s)
    hand_back_after_window(window_s)
