"""A batch-mode job waiting on its provider (H17), on the Celery side: the task lets go of its slot
and comes back on the poll schedule, or, when its batch was cancelled, abandons its request.

A suspended run has saved its round (`worker.runtime.provider_batches`), so the task can end: Celery's
retry publishes the job again with a countdown (any worker may take it; the one holding the countdown
uses no pool slot) and acknowledges this delivery. These waits are counted apart from the job's
retries after transient errors (`run.retries`), like waiting for a conversation's lock.

A run also waits before its request is submitted: the process's batching queue collects requests
for up to GROUNDED_BATCH_MAX_WAIT_S. Holding the slot meanwhile would cap a provider batch at the
process's slots, so the task lets go as soon as the request is queued (H17.2): the run goes on in
the process's event loop under a lease, saves its round once submitted, and the job's next delivery,
already scheduled, resumes from it. A worker that dies meanwhile leaves an expiring lease, and the
next delivery starts again from the last saved round.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from datetime import datetime
from typing import NoReturn

import structlog
from celery import Task

from worker.jobs.models import Batch, Job, JobResult
from worker.runtime.loop import RunTimedOut, process_loop
from worker.runtime.provider_batches import QUEUED, RunSuspended
from worker.runtime.run import Commit
from worker.store.metrics import cancelled_counts, finished_counts

from .events import task_labels
from .process import LOOP_GRACE_S, ProcessWorker, job_run

CANCEL_TIMEOUT_S = 60.0  # cancelling a provider batch is one HTTP call; the job is cancelled regardless
LEASE_MARGIN_S = 30.0  # a detached run's lease outlasts the batching wait by this much

log = structlog.get_logger()


class WaitingOnProvider(Exception):  # noqa: N818 - not a failure: the reason Flower shows for the retry
    """H17. The job's request is in (or on its way to) a provider batch; the task comes back later."""


class RunDetached(Exception):  # noqa: N818 - not an error: the run goes on without a slot
    """The run's request is queued for the next provider batch and the run goes on in the event loop."""

    def __init__(self, message: str, delay_s: float) -> None:
        super().__init__(message)
        self.delay_s = delay_s


def wait_on_provider(task: Task, worker: ProcessWorker, job: Job, waiting: RunSuspended | RunDetached,
                     provider_waits: int) -> NoReturn:
    """The countdown is capped by GROUNDED_RETRY_MAX_S, like a retry's; the worker holding it renews
    its lease (H14), so no second worker takes it meanwhile. A delivery that comes back
    before its batch's next check waits again without running (`_unless_checked_lately`). The next
    delivery carries its number (`provider_waits`), so a stale copy of an older one stops
    (`stale_delivery`)."""
    assert worker.runtime.batching is not None
    retry = task.retry(countdown=min(waiting.delay_s, worker.settings.retry_max_s), max_retries=None,
                       exc=WaitingOnProvider(str(waiting)), throw=False,
                       kwargs={**(task.request.kwargs or {}), "provider_waits": provider_waits + 1},
                       **task_labels(job))
    worker.runtime.batching.store.scheduled(job, provider_waits + 1)
    raise retry


def stale_delivery(worker: ProcessWorker, job: Job, batch: Batch, provider_waits: int) -> bool:
    """A batch-mode job's delivery that an older provider wait scheduled, superseded by a newer one."""
    batching = worker.runtime.batching
    return batch.config.run.batch and batching is not None and batching.store.stale(job, provider_waits)


def run_batch_delivery(worker: ProcessWorker, job: Job, batch: Batch, attempts: int, started_at: datetime,
                       commit: Commit) -> JobResult:
    """One delivery of a batch-mode job: returns its result, or raises RunSuspended (its round is
    saved) or RunDetached (its request is queued and the run goes on without the slot)."""
    batching = worker.runtime.batching
    assert batching is not None
    store = batching.store
    if (lease_s := store.detached_for(job)) > 0:  # the job's run still waits in a worker's loop
        store.still_waiting(job)
        raise RunDetached("its run waits for its request to be submitted", lease_s + 0.5)
    make, timeout_s = job_run(worker, job, batch, attempts, started_at, commit)
    settled = threading.Event()
    token = QUEUED.set(settled.set)
    try:
        future = process_loop().submit(make)
    finally:
        QUEUED.reset(token)
    future.add_done_callback(lambda _: settled.set())
    if not settled.wait(timeout_s + LOOP_GRACE_S):
        future.cancel()
        raise RunTimedOut(f"the job did not finish within {timeout_s + LOOP_GRACE_S:g} s and was cancelled")
    if future.done():
        return future.result()
    max_wait_s = batching.capability.max_wait.total_seconds() if batching.capability.max_wait else 0.0
    store.detach(job, lease_s=max_wait_s + LEASE_MARGIN_S)
    future.add_done_callback(lambda done: _detached_run_ended(worker, job, batch, done))
    raise RunDetached("its request is queued for the next provider batch",
                      max_wait_s + batching.capability.poll_interval.total_seconds())


def _detached_run_ended(worker: ProcessWorker, job: Job, batch: Batch,
                        future: concurrent.futures.Future[JobResult]) -> None:
    """On the loop, when a detached run ends: normally it saved its round (RunSuspended) and the job's
    next delivery resumes it. A result it returned (a permanent failure) is written here; anything
    else is left to the next delivery, which starts from the last saved round."""
    batching = worker.runtime.batching
    assert batching is not None

    async def settle() -> None:
        await asyncio.to_thread(batching.store.release_detached, job)
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            result = future.result()
            await asyncio.to_thread(lambda: worker.store.write_result(result, total=batch.total,
                                                                        metrics=finished_counts(result)))
            await asyncio.to_thread(batching.store.discard_pending, job)
        elif isinstance(error, RunSuspended):
            if await asyncio.to_thread(worker.store.cancel_requested, batch.id):
                await batching.cancel_if_abandoned(job, error.pending, worker.runtime.models.get(batch.config))
        else:
            log.warning("detached_run_failed", job_id=job.id, error=f"{type(error).__name__}: {error}")

    asyncio.run_coroutine_threadsafe(settle(), process_loop().loop)  # called on the loop, or here if done already


def cancel_waiting(worker: ProcessWorker, job: Job, batch: Batch) -> bool:
    """A cancelled batch's job: its saved request is abandoned (the last abandoned request of a
    provider batch cancels that batch), then the job is counted as cancelled, once."""
    batching = worker.runtime.batching
    pending = batching.store.load_pending(job.id)[0] if batching is not None and batch.config.run.batch else None
    if batching is not None and pending is not None:
        async def abandon() -> bool:
            return await batching.cancel_if_abandoned(job, pending, worker.runtime.models.get(batch.config))

        if process_loop().run(abandon, timeout=CANCEL_TIMEOUT_S):
            log.info("provider_batch_cancelled", provider_batch=pending.provider_batch)
    elif batching is not None and batch.config.run.batch:
        batching.store.discard_pending(job)  # no longer waiting; a detached run abandons its own when it ends
    return worker.store.mark_cancelled(job, total=batch.total, metrics=cancelled_counts(job))


def discard_round(worker: ProcessWorker, job: Job, batch: Batch) -> None:
    """The job's result is written: its saved round is no longer needed."""
    if batch.config.run.batch and worker.runtime.batching is not None:
        worker.runtime.batching.store.discard_pending(job)
