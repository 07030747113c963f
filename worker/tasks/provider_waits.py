"""A batch-mode job waiting on its provider (H14), on the Celery side: the task lets go of its slot
and comes back on the poll schedule, or, when its batch was cancelled, abandons its request.

A suspended run has saved its round (`worker.runtime.provider_batches`), so the task can end: Celery's
retry publishes the job again with a countdown (any worker may take it; the one holding the countdown
uses no pool slot) and acknowledges this delivery. These waits are counted apart from the job's
retries after transient errors (`run.retries`), like waiting for a conversation's lock.
"""

from __future__ import annotations

from typing import NoReturn

import structlog
from celery import Task

from worker.jobs.models import Batch, Job
from worker.runtime.loop import process_loop
from worker.runtime.provider_batches import RunSuspended
from worker.store.metrics import record_cancelled

from .events import task_labels
from .process import ProcessWorker

CANCEL_TIMEOUT_S = 60.0  # cancelling a provider batch is one HTTP call; the job is cancelled regardless

log = structlog.get_logger()


class WaitingOnProvider(Exception):  # noqa: N818 - not a failure: the reason Flower shows for the retry
    """H14. The job's request is in a provider batch; the task comes back at the next check."""


def wait_on_provider(task: Task, worker: ProcessWorker, job: Job, batch: Batch, suspended: RunSuspended,
                     provider_waits: int) -> NoReturn:
    raise task.retry(countdown=suspended.delay_s, max_retries=None, exc=WaitingOnProvider(str(suspended)),
                     kwargs={**(task.request.kwargs or {}), "provider_waits": provider_waits + 1},
                     **task_labels(job))


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
    if worker.store.mark_cancelled(job, total=batch.total):
        record_cancelled(worker.store, job)
        return True
    return False


def discard_round(worker: ProcessWorker, job: Job, batch: Batch) -> None:
    """The job's result is written: its saved round is no longer needed."""
    if batch.config.run.batch and worker.runtime.batching is not None:
        worker.runtime.batching.store.discard_pending(job)
