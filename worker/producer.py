"""Submitting and cancelling batches: what the API and the CLI share beyond `parse_batch`.

A batch is validated whole, stored, and only then enqueued, one task per job carrying only the
job id; a rejected batch stores and enqueues nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from celery import Celery

from .app import ANSWER_JOB, QUEUE, create_app
from .composition import known_corpora
from .config import Settings
from .jobs import Batch, BatchReport, JobConfig, parse_batch
from .results import ResultsStore
from .task_events import task_labels


class Producer:
    def __init__(self, settings: Settings, *, store: ResultsStore | None = None, app: Celery | None = None) -> None:
        self.settings = settings
        self.store = store or ResultsStore.from_url(
            settings.redis_url, prefix=settings.key_prefix, compress_over=settings.compress_over_bytes
        )
        self.app = app or create_app(settings)

    def served_corpora(self) -> list[str] | None:
        """What this producer can see of the workers' corpora; None when it has no corpora folder
        (an API on another machine), leaving the unknown-corpus check to the workers."""
        return known_corpora(self.settings.corpora_dir) if self.settings.corpora_dir.is_dir() else None

    def validate(
        self, lines: Iterable[str | bytes | Mapping[str, Any]], config: JobConfig | Mapping[str, Any] | str
    ) -> BatchReport:
        return parse_batch(lines, config, corpora=self.served_corpora(), max_lines=self.settings.max_batch_lines)

    def submit(self, report: BatchReport, *, tenant: str, arm: str | None = None) -> Batch:
        batch, jobs = self.store.create_batch(report, tenant=tenant, arm=arm)
        with self.app.producer_or_acquire() as producer:
            for job in jobs:
                self.app.send_task(ANSWER_JOB, args=[job.id], task_id=job.id, queue=QUEUE, producer=producer,
                                   **task_labels(job))
        return batch

    def cancel(self, batch_id: str) -> None:
        self.store.request_cancel(batch_id)
