"""Conversation and follow-up jobs on the worker: their turn in line, then a run from the stored
conversation that commits after every turn.

A redelivered or retried job starts from the last commit, so it resumes at its first uncommitted
turn and re-runs it as the same question (same identity, H6/H7). A failed turn commits nothing (H4).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from worker.jobs.models import Batch, Job, JobResult
from worker.settings import Settings
from worker.store.conversations import (
    CompositionMismatch,
    ConversationLock,
    ConversationNotFound,
    ConversationStore,
    StoredComposition,
    StoredTurn,
    composition_differences,
    lock_ttl_s,
)

from .run import (
    Checkpoint,
    Commit,
    Runtime,
    commit_nothing,
    conversation_id_for,
    failed_result,
    run_job,
)

FINISHED = frozenset({"succeeded", "failed", "cancelled"})


def earlier_jobs_finished(conversations: ConversationStore, job: Job) -> bool:
    """H5: jobs of one conversation run in the order they were submitted, so a follow-up waits for
    every earlier job of its conversation, including one that is being retried."""
    ids = conversations.job_ids(conversation_id_for(job))
    if job.id not in ids:
        return True
    for earlier_id in ids[: ids.index(job.id)]:
        earlier = conversations.results.load_job(earlier_id)
        if earlier is not None and conversations.results.job_state(earlier) not in FINISHED:
            return False
    return True


def take_turn(conversations: ConversationStore, job: Job, settings: Settings) -> ConversationLock | None:
    """The conversation's lock, held only when this job is next in line; None means retry later."""
    lock = conversations.lock(conversation_id_for(job), ttl_s=lock_ttl_s(settings))
    if lock is None:
        return None
    if not earlier_jobs_finished(conversations, job):
        lock.release()
        return None
    return lock


async def run_conversation_job(
    job: Job,
    batch: Batch,
    runtime: Runtime,
    conversations: ConversationStore,
    *,
    attempts: int = 1,
    started_at: datetime | None = None,
    timeout_s: float | None = None,
    progress: Commit = commit_nothing,
) -> JobResult:
    """Loads the conversation (a conversation job creates it), refuses a different composition before
    the agent runs (H3), then runs the job's remaining turns, committing after each (H4)."""
    conversation_id = conversation_id_for(job)
    started_at = started_at or datetime.now(UTC)
    try:
        if job.kind == "conversation":
            await asyncio.to_thread(conversations.create, conversation_id, tenant=batch.tenant, config=batch.config,
                                    job_id=job.id, batch_id=batch.id)
        stored = await asyncio.to_thread(conversations.load, conversation_id)
        if stored is None:
            raise ConversationNotFound(conversation_id)
        differences = composition_differences(stored.meta.composition, StoredComposition.of(batch.config.composition))
        if differences:
            raise CompositionMismatch(conversation_id, differences)
    except (ConversationNotFound, CompositionMismatch) as exc:
        return failed_result(job, batch, exc, attempts=attempts, started_at=started_at)

    version = stored.version

    async def commit(checkpoint: Checkpoint) -> None:
        nonlocal version
        turn = StoredTurn(job_id=job.id, custom_id=job.custom_id, result=checkpoint.turns[-1])
        version = await asyncio.to_thread(conversations.commit, conversation_id, version=version,
                                          messages=checkpoint.messages, state=checkpoint.state, turn=turn)
        await progress(checkpoint)

    checkpoint = Checkpoint(messages=stored.messages, state=stored.state, turns=stored.turns_of(job.id))
    return await run_job(job, batch, runtime, attempts=attempts, started_at=started_at, checkpoint=checkpoint,
                         commit=commit, timeout_s=timeout_s)
