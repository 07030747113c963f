"""What Celery's event stream (and so Flower) shows of a job: readable arguments, its outcome and
turn progress.

Only the job id travels in a task, which tells an operator nothing; the labels name the batch and
the custom_id beside it, on every delivery (a retry sends a new message, which must carry them
again). A job's outcome is the task's: a succeeded job's task result is its citation status, and a
failed job's task fails with the job's error type and message (H12), so Flower's counts, badges and
exception column tell the truth. A conversation can run for minutes, so each committed turn sends
a `task-progress` event: Flower shows the task in state PROGRESS with "k/n turns answered" as its
result until it finishes. Celery's result backend is off (results live in our store), so
`update_state` has nowhere to write; events are the channel Flower reads.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from celery import Celery, Task
from kombu.exceptions import KombuError
from redis import RedisError

from worker.jobs.models import Job, JobResult

if TYPE_CHECKING:
    from worker.runtime.run import Checkpoint, Commit

PROGRESS_EVENT = "task-progress"  # Flower files it under the custom state PROGRESS
PROGRESS_STATE = "PROGRESS"
# Flower's task list (`grounded flower`): its default shows only name, id, state, times and worker,
# so a batch's jobs, their custom ids and outcomes could not be found there
FLOWER_TASK_COLUMNS = "name,uuid,state,kwargs,result,exception,received,runtime,retries,worker"

log = structlog.get_logger()


def task_labels(job: Job) -> dict[str, str]:
    """`argsrepr`/`kwargsrepr` for `send_task`: shown in Flower and in task events, never passed to the task."""
    return {
        "argsrepr": repr((job.id,)),
        "kwargsrepr": repr({"batch_id": job.batch_id, "custom_id": job.custom_id, "kind": job.kind}),
    }


class JobFailed(Exception):
    """H12. Raised by the task after a failed job's result is stored and counted: the task is a Celery
    FAILURE (acknowledged, not redelivered: a failure is an outcome) whose exception names the job's
    error type and message, instead of a SUCCESS that hides it. Its one argument is that text, so it
    pickles like any exception."""

    @classmethod
    def of(cls, result: JobResult) -> JobFailed:
        error = result.error
        return cls(f"{error.type}: {error.message}" if error else "the job failed without an error")


def outcome_text(result: JobResult) -> str:
    """A succeeded job's task result: the citation status of each question it answered, in order."""
    statuses = ", ".join(turn.citation_status for turn in result.turns)
    return f"{result.status}: {statuses}" if statuses else result.status


def progress_text(done: int, total: int) -> str:
    return f"{done}/{total} turns answered"


@dataclass(frozen=True)
class ProgressSender:
    app: Celery
    task_id: str
    hostname: str
    total: int

    def send(self, done: int) -> None:
        """Best effort: the turn is already committed, so a broker hiccup here must not fail the job."""
        try:
            with self.app.events.default_dispatcher(hostname=self.hostname) as dispatcher:
                dispatcher.send(PROGRESS_EVENT, uuid=self.task_id, turns_done=done, turns=self.total,
                                result=progress_text(done, self.total))
        except (OSError, KombuError, RedisError) as exc:
            log.warning("progress_event_not_sent", error=type(exc).__name__)


async def _nothing(checkpoint: Checkpoint) -> None:
    """A question job has nothing to resume and one turn is no progress to show."""


def turn_progress(task: Task, job: Job, then: Commit = _nothing) -> Commit:
    """The commit to give `run_job` (which runs on the process's event loop): `then`, followed by a
    progress event. Built in the task's thread from the bound task, whose request is thread-local."""
    request = task.request
    total = len(job.prompts())
    if total < 2 or not request.id or not request.hostname:
        return then
    sender = ProgressSender(task.app, request.id, request.hostname, total)

    async def commit(checkpoint: Checkpoint) -> None:
        await then(checkpoint)
        await asyncio.to_thread(sender.send, len(checkpoint.turns))

    return commit
