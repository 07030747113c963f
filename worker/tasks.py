"""Celery tasks: thin. Receive a job id, then load, run (worker/run.py) and store (worker/results.py).

Only the id travels, so a redelivered or retried task re-reads the job and its batch. One failing
job never fails its batch: every outcome, failure included, is written as that job's result.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from celery import Task

from .agents import AgentCache
from .app import ANSWER_JOB, app
from .config import Settings, get_settings
from .conversation_jobs import run_conversation_job, take_turn
from .conversations import ConversationStore
from .jobs import Batch, Job, JobResult
from .logs import bind_attempt, configure_logging, job_context
from .loop import PerProcess, RunTimedOut, process_loop
from .metrics import record_cancelled, record_finished
from .models import ModelCache
from .outages import requeue_when_redis_is_down
from .results import ResultsStore
from .run import Commit, Runtime, TransientModelError, failed_result, run_job
from .task_events import turn_progress

log = structlog.get_logger()
configure_logging()

LOOP_GRACE_S = 30  # the run cancels itself at its timeout; this outer wait only catches a stuck loop


class WorkerLost(RuntimeError):
    """acks_late redelivers a job whose worker died, so a job that is itself what kills its worker
    (out of memory, a crash in native code) would be redelivered for ever: after
    GROUNDED_MAX_WORKER_LOSSES such deaths it fails instead, and the rest of its batch goes on."""

    def __init__(self, losses: int) -> None:
        super().__init__(f"the worker running this job died {losses} times before it finished "
                         "(GROUNDED_MAX_WORKER_LOSSES); it is failed instead of being redelivered again")


@dataclass
class ProcessWorker:
    settings: Settings
    store: ResultsStore
    runtime: Runtime


def _make_process_worker() -> ProcessWorker:
    settings = get_settings()
    signer = settings.signer()
    store = ResultsStore.from_url(settings.redis_url, prefix=settings.key_prefix,
                                  compress_over=settings.compress_over_bytes)
    runtime = Runtime(
        agents=AgentCache(signer=signer, corpora_dir=settings.corpora_dir),
        models=ModelCache(allowlist=settings.model_allowlist, endpoint_key_bindings=settings.endpoint_key_bindings),
        signer=signer,
    )
    return ProcessWorker(settings, store, runtime)


_worker = PerProcess(_make_process_worker)


def process_worker() -> ProcessWorker:
    """One store, agent cache and model cache per worker process, made after any fork."""
    return _worker.get()


def retry_delay(retries: int, retry_after: float | None, settings: Settings) -> float:
    """The provider's Retry-After when it sent one; otherwise exponential backoff with jitter, so
    workers that failed together do not retry together. Capped by retry_max_s, which the
    visibility timeout already covers."""
    if retry_after is not None:
        return min(max(retry_after, 0.0), settings.retry_max_s)
    delay = settings.retry_base_s * (2**retries)
    return min(delay * random.uniform(0.8, 1.2), settings.retry_max_s)


def _run(worker: ProcessWorker, job: Job, batch: Batch, attempts: int, started_at: datetime,
         commit: Commit) -> JobResult:
    timeout_s = min(batch.config.run.timeout_s, worker.settings.task_soft_limit_s)
    if job.kind != "question":
        conversations = ConversationStore(worker.store)
        return process_loop().run(
            lambda: run_conversation_job(job, batch, worker.runtime, conversations, attempts=attempts,
                                         started_at=started_at, timeout_s=timeout_s, progress=commit),
            timeout=timeout_s + LOOP_GRACE_S,
        )
    return process_loop().run(
        lambda: run_job(job, batch, worker.runtime, attempts=attempts, started_at=started_at, timeout_s=timeout_s,
                        commit=commit),
        timeout=timeout_s + LOOP_GRACE_S,
    )


@app.task(bind=True, name=ANSWER_JOB, max_retries=None)
@requeue_when_redis_is_down
def answer_job(self, job_id: str, lock_waits: int = 0) -> str:  # type: ignore[no-untyped-def]
    worker = process_worker()
    job = worker.store.load_job(job_id)
    batch = worker.store.load_batch(job.batch_id) if job is not None else None
    if job is None or batch is None:
        log.error("job_missing", job_id=job_id)
        return "missing"
    with job_context(job, batch):
        if worker.store.cancel_requested(batch.id):
            if worker.store.mark_cancelled(job, total=batch.total):
                record_cancelled(worker.store, job)
            log.info("job_cancelled")
            return "cancelled"
        lock = None
        if job.kind != "question":
            lock = take_turn(ConversationStore(worker.store), job, worker.settings)
            if lock is None:  # H5: another job of this conversation runs, or is ahead in line
                delay = retry_delay(lock_waits, None, worker.settings)
                log.info("conversation_busy", delay_s=round(delay, 2))
                raise self.retry(countdown=delay, max_retries=None, kwargs={"lock_waits": lock_waits + 1})
        try:
            return _answer(self, worker, job, batch, lock_waits)
        finally:
            if lock is not None:
                lock.release()


def _answer(task: Task, worker: ProcessWorker, job: Job, batch: Batch, lock_waits: int) -> str:
    """Waiting for a conversation's lock is not a failed attempt, so it spends no retries."""
    retries = task.request.retries - lock_waits
    attempts = worker.store.begin_attempt(job)
    bind_attempt(attempts)
    started_at = datetime.now(UTC)
    lost = attempts - 1 - retries  # earlier starts that neither finished nor asked for a retry
    try:
        if lost >= worker.settings.max_worker_losses:
            raise WorkerLost(lost)
        result = _run(worker, job, batch, attempts, started_at, turn_progress(task, job))
    except TransientModelError as exc:
        if retries < batch.config.run.retries:
            delay = retry_delay(retries, exc.retry_after, worker.settings)
            worker.store.note_retry(job, delay_s=delay, error=str(exc))
            log.warning("job_retrying", error=str(exc), delay_s=round(delay, 2), attempts=attempts)
            raise task.retry(countdown=delay, max_retries=None) from None
        result = failed_result(job, batch, exc, attempts=attempts, started_at=started_at, checkpoint=exc.committed)
    except (RunTimedOut, WorkerLost) as exc:
        result = failed_result(job, batch, exc, attempts=attempts, started_at=started_at)
    if worker.store.write_result(result, total=batch.total):
        record_finished(worker.store, result)
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
    return result.status
