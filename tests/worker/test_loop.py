"""The per-process event loop that runs every agent run of a worker process."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from structlog.contextvars import bound_contextvars, get_contextvars

from worker.runtime.loop import RunTimedOut, process_loop


def test_one_loop_per_process_on_its_own_thread() -> None:
    loop = process_loop()
    assert process_loop() is loop and loop.thread is not threading.current_thread()

    async def where() -> tuple[int, int]:
        return os.getpid(), threading.get_ident()

    assert loop.run(where, timeout=5) == (os.getpid(), loop.thread.ident)


def test_log_bindings_reach_the_run_on_the_loop() -> None:
    """Ids bound in the task reach the coroutine it submits (docs/design/architecture.md, "The life of one job")."""

    async def bindings() -> dict:
        return get_contextvars()

    with bound_contextvars(job_id="job_1", batch_id="batch_1"):
        assert process_loop().run(bindings, timeout=5) == {"job_id": "job_1", "batch_id": "batch_1"}


def test_a_run_past_its_timeout_is_cancelled() -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(RunTimedOut, match="did not finish within 0.2 s"):
        process_loop().run(forever, timeout=0.2)
    assert cancelled.wait(5)
