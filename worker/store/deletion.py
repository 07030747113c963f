"""Deleting a batch now, rather than at the end of its retention (H16).

Every key a batch can own is named from its id, its jobs' ids and the ids of the conversations it
started, so all of them are deleted by name in one transaction, whether they exist yet or not. A
job of the batch still running writes nothing that stays: its writes find the batch key gone and
delete themselves (`worker.store.retention.retain`), and a worker that takes a queued job of it
finds no job and skips it. Conversations the batch continued (its follow-ups) belong to the batch
that started them and stay.
"""

from __future__ import annotations

from worker.jobs.models import Job

from .files import FileView, view_file_id
from .keys import (
    ACTIVE_BATCHES_KEY,
    BATCH_CANCEL_KEY,
    BATCH_CANCELLED_JOBS_KEY,
    BATCH_DONE_KEY,
    BATCH_EVENTS_KEY,
    BATCH_FAILED_KEY,
    BATCH_FINISHED_KEY,
    BATCH_JOBS_KEY,
    BATCH_KEY,
    BATCH_RUNNING_KEY,
    BATCH_SUCCEEDED_KEY,
    CONVERSATION_JOBS_KEY,
    CONVERSATION_KEY,
    CONVERSATION_LOCK_KEY,
    CONVERSATION_TURNS_KEY,
    FILE_KEY,
    JOB_ATTEMPTS_KEY,
    JOB_HANDBACKS_KEY,
    JOB_KEY,
    OPENAI_BATCH_KEY,
    RESULT_KEY,
    TENANT_BATCHES_KEY,
    TENANT_OPENAI_BATCHES_KEY,
)
from .results import ResultsStore

BATCH_TEMPLATES = (BATCH_KEY, BATCH_JOBS_KEY, BATCH_DONE_KEY, BATCH_SUCCEEDED_KEY, BATCH_FAILED_KEY,
                   BATCH_RUNNING_KEY, BATCH_CANCELLED_JOBS_KEY, BATCH_CANCEL_KEY, BATCH_FINISHED_KEY,
                   BATCH_EVENTS_KEY, OPENAI_BATCH_KEY)
JOB_TEMPLATES = (JOB_KEY, JOB_ATTEMPTS_KEY, JOB_HANDBACKS_KEY, RESULT_KEY)
CONVERSATION_TEMPLATES = (CONVERSATION_KEY, CONVERSATION_TURNS_KEY, CONVERSATION_JOBS_KEY, CONVERSATION_LOCK_KEY)
FILE_VIEWS: tuple[FileView, ...] = ("output", "errors")
CHUNK = 1000


def batch_keys(store: ResultsStore, batch_id: str, jobs: list[Job]) -> list[str]:
    """Every key the stores may write for this batch (keys.py), existing or not."""
    keys = [store.key(t, batch_id=batch_id) for t in BATCH_TEMPLATES]
    keys += [store.key(FILE_KEY, file_id=view_file_id(batch_id, view)) for view in FILE_VIEWS]
    keys += [store.key(t, job_id=job.id) for job in jobs for t in JOB_TEMPLATES]
    keys += [store.key(t, conversation_id=job.conversation_id or job.id)
             for job in jobs if job.kind == "conversation" for t in CONVERSATION_TEMPLATES]
    return keys


def delete_batch(store: ResultsStore, batch_id: str, tenant: str) -> int:
    """Removes the batch and everything under it; returns how many keys existed."""
    ids = store.job_ids(batch_id)
    jobs = []
    for start in range(0, len(ids), CHUNK):
        raw = store.redis.mget([store.key(JOB_KEY, job_id=j) for j in ids[start : start + CHUNK]])
        jobs += [Job.model_validate_json(data) for data in raw if data is not None]
    keys = batch_keys(store, batch_id, jobs)
    with store.redis.pipeline(transaction=True) as pipe:
        for start in range(0, len(keys), CHUNK):
            pipe.delete(*keys[start : start + CHUNK])
        pipe.zrem(store.key(TENANT_BATCHES_KEY, tenant=tenant), batch_id)
        pipe.zrem(store.key(TENANT_OPENAI_BATCHES_KEY, tenant=tenant), batch_id)
        pipe.srem(store.key(ACTIVE_BATCHES_KEY), batch_id)
        *removed, _, _, _ = pipe.execute()
    return sum(removed)
