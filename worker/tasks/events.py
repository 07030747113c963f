"""What Celery's event stream (and so Flower) shows of a job: readable arguments and turn progress.

Only the job id travels in a task, which tells an operator nothing; the labels name the batch and
the custom_id beside it. A conversation can run for minutes, so each committed turn sends a
`task-progress` event: Flower shows the task in state PROGRESS with "k/n turns answered" as its
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

from worker.jobs.models import Job

if TYPE_CHECKING:
    from worker.runtime.run import Checkpoint, Commit

PROGRESS_EVENT = "task-progress"  # Flower files it under the custom state PROGRESS
PROGRESS_STATE = "PROGRESS"

log = structlog.get_logger()


def task_labels(job: Job) -> dict[str, str]:
    """`argsrepr`/`kwargsrepr` for `send_task`: shown in Flower and in task events, never passed to the task."""
    return {
        "argsrepr": repr((job.id,)),
        "kwargsrepr": repr({"batch_id": job.batch_id, "custom_id": job.custom_id, "kind": job.kind}),
    }


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
