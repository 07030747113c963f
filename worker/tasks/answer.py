"""The Celery task: thin. Receive a job id, then load, run (`worker.runtime`) and store (`worker.store`).

Only the id travels, so a redelivered or retried task re-reads the job and its batch. One failing
job never fails its batch: every outcome, failure included, is written as that job's result, and
only then does the task report it to Celery: a succeeded job returns its citation status, a failed
one raises `JobFailed` (H12), which Celery acknowledges like any finished task.
"""

from __future__ import annotations

from contextlib import nullcontext
from datetime import UTC, datetime

import structlog
from celery import Task, shared_task
from celery.exceptions import Reject

from worker.jobs.models import Batch, Job
from worker.runtime.conversations import take_turn
from worker.runtime.loop import RunHandedBack, RunTimedOut
from worker.runtime.provider_batches import RunSuspended
from worker.runtime.run import TransientModelError, failed_result
from worker.store.conversations import ConversationLock, ConversationStore
from worker.store.metrics import finished_counts
from worker.store.provider_batches import RoundSuperseded

from .celery_app import ANSWER_JOB
from .events import JobFailed, outcome_text, task_labels, turn_progress
from .leases import kept_alive
from .logs import bind_attempt, job_context
from .process import ProcessWorker, WorkerLost, process_worker, retry_delay, run_in_process_loop, worker_losses
from .provider_waits import (
    RunDetached,
    cancel_waiting,
    discard_round,
    run_batch_delivery,
    stale_delivery,
    wait_on_provider,
)
from .requeue import requeue_when_redis_is_down

log = structlog.get_logger()


# `throws`: a failed job is an expected outcome, logged in one line without a traceback
@shared_task(bind=True, name=ANSWER_JOB, max_retries=None, throws=(JobFailed,))
@requeue_when_redis_is_down
def answer_job(self: Task, job_id: str, lock_waits: int = 0, provider_waits: int = 0) -> str:
    worker = process_worker()
    job, batch, cancelled = worker.store.load_run(job_id)  # one round trip
    if job is None or batch is None:  # its batch was deleted or expired (H16): nothing to run or report
        log.warning("job_skipped", job_id=job_id, reason="job or batch not in the results store (deleted, expired, "
                    "or another deployment's key prefix)")
        return "skipped"
    with job_context(job, batch):
        if cancelled:
            cancel_waiting(worker, job, batch)  # H17: abandons a request waiting in a provider batch
            log.info("job_cancelled")
            return "cancelled"
        lock = None
        if job.kind != "question":
            lock = take_turn(ConversationStore(worker.store), job, worker.settings)
            if lock is None:  # H5: another job of this conversation runs, or is ahead in line
                delay = retry_delay(lock_waits, None, worker.settings)
                log.info("conversation_busy", delay_s=round(delay, 2))
                raise self.retry(countdown=delay, max_retries=None,
                                 kwargs={**(self.request.kwargs or {}), "lock_waits": lock_waits + 1},
                                 **task_labels(job))
        try:
            if stale_delivery(worker, job, batch, provider_waits):  # H17: a dead worker's copy; a newer one goes on
                log.warning("job_delivery_stale", provider_waits=provider_waits)
                return "superseded"
            with kept_alive(lock) if lock is not None else nullcontext():  # H14: a held lock lives with this worker
                return _answer(self, worker, job, batch, lock_waits, provider_waits, lock)
        finally:
            if lock is not None:
                lock.release()


def _answer(task: Task, worker: ProcessWorker, job: Job, batch: Batch, lock_waits: int, provider_waits: int,
            lock: ConversationLock | None) -> str:
    """Waiting for a conversation's lock or on a provider batch (H17) is not a failed attempt, so it
    spends no retries. A conversation job's lock goes with its result write (H5)."""
    retries = task.request.retries - lock_waits - provider_waits
    attempts, handed_back = worker.store.begin_attempt(job)
    bind_attempt(attempts)
    started_at = datetime.now(UTC)
    lost = worker_losses(attempts, task.request.retries - lock_waits, handed_back)  # provider waits started runs
    try:
        if lost >= worker.settings.max_worker_losses:
            raise WorkerLost(lost)
        if batch.config.run.batch:
            result = run_batch_delivery(worker, job, batch, attempts, started_at, turn_progress(task, job))
        else:
            result = run_in_process_loop(worker, job, batch, attempts, started_at, turn_progress(task, job))
    except RunHandedBack as exc:  # H15: back to the head of the queue now, for another worker
        worker.store.note_handback(job)
        log.warning("job_handed_back", attempts=attempts)
        raise Reject(str(exc), requeue=True) from None
    except (RunSuspended, RunDetached) as exc:  # H17: the slot is freed until the next check
        if not worker.store.cancel_requested(batch.id):
            wait_on_provider(task, worker, job, exc, provider_waits)
        cancel_waiting(worker, job, batch)
        return "cancelled"
    except RoundSuperseded:  # H17: a redelivery of this job saved a round first and carries it on
        log.warning("job_round_superseded")
        return "superseded"
    except TransientModelError as exc:
        if retries < batch.config.run.retries:
            delay = retry_delay(retries, exc.retry_after, worker.settings)
            worker.store.note_retry(job, delay_s=delay, error=str(exc))
            log.warning("job_retrying", error=str(exc), delay_s=round(delay, 2), attempts=attempts)
            raise task.retry(countdown=delay, max_retries=None, **task_labels(job)) from None
        result = failed_result(job, batch, exc, attempts=attempts, started_at=started_at, checkpoint=exc.committed)
    except (RunTimedOut, WorkerLost) as exc:
        result = failed_result(job, batch, exc, attempts=attempts, started_at=started_at)
    worker.store.write_result(result, total=batch.total, metrics=finished_counts(result),  # counted once (H10)
                              alongside=lock.release_in if lock is not None else None)
    discard_round(worker, job, batch)
    turn = result.turns[-1] if result.turns else None
    log.info(
        "job_finished",
        status=result.status,
        error=result.error.type if result.error else None,
        citation_status=turn.citation_status if turn else None,
        redirects=turn.redirects if turn else None,
        n_requests=turn.n_requests if turn else None,
        attempts=result.attempts,
        model=result.model,
    )
    if result.status == "failed":
        raise JobFailed.of(result)  # H12: after the result is stored and counted
    return outcome_text(result)
