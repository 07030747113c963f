"""Submitting and cancelling batches: what the API and the CLI share beyond `parse_batch`.

A batch is validated whole, stored, and only then enqueued, one task per job carrying only the
job id; a rejected batch stores and enqueues nothing. A follow-up is a one-job batch on a stored
conversation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from celery import Celery

from worker.jobs.allowlist import ModelUnavailable, check_model_allowed
from worker.jobs.composition import corpora_for, known_corpora
from worker.jobs.lines import CONFIG_LINE, BatchReport, JobLineError, parse_batch
from worker.jobs.models import Batch, Job, JobConfig
from worker.jobs.served import BrokenConfig, config_name, read_config
from worker.settings import Settings
from worker.store.conversations import (
    CompositionMismatch,
    ConversationNotFound,
    ConversationStore,
    StoredComposition,
    composition_differences,
)
from worker.store.deletion import delete_batch
from worker.store.keys import FRESH_PRIORITY, QUEUE
from worker.store.provider_batches import ProviderBatchStore
from worker.store.results import ResultsStore
from worker.store.retention import longer_than_allowed
from worker.tasks.celery_app import ANSWER_JOB, create_app
from worker.tasks.events import task_labels


class NotFound(LookupError):
    """Absent or another tenant's: the two read the same, so a token cannot learn what other tenants
    hold. Every interface reports it with this message (the API as a 404)."""

    def __init__(self, kind: str, object_id: str) -> None:
        super().__init__(f"{kind} {object_id!r} not found")
        self.kind, self.object_id = kind, object_id


class Producer:
    def __init__(self, settings: Settings, *, store: ResultsStore | None = None, app: Celery | None = None) -> None:
        self.settings = settings
        self.store = store or ResultsStore.from_url(
            settings.redis_url, prefix=settings.key_prefix, compress_over=settings.compress_over_bytes,
            retention_s=settings.retention_s,
        )
        self.app = app or create_app(settings)
        self.conversations = ConversationStore(self.store)

    def served_corpora(self, tenant: str | None = None) -> list[str] | None:
        """What this producer can see of the workers' corpora, narrowed to what `tenant` may name
        (H13); None when nothing can be said here (no corpora folder, an API on another machine, and
        no scope for the tenant), leaving the unknown-corpus check to the workers. Without a tenant,
        the operator's view: every corpus served."""
        served = known_corpora(self.settings.corpora_dir) if self.settings.corpora_dir.is_dir() else None
        return served if tenant is None else corpora_for(tenant, self.settings.tenant_corpora, served)

    def served_config(self, name: str | None = None) -> tuple[str, JobConfig]:
        """I1: the registered config a caller that cannot send one means, by name (or the default).
        Raises UnknownConfig naming the served ones, or BrokenConfig for an unreadable file."""
        chosen = config_name(self.settings.configs, name, self.settings.default_config)
        return chosen, read_config(chosen, self.settings.configs[chosen])

    def check_served_configs(self) -> None:
        """Every registered config reads, and the default names one: checked when a server starts."""
        default = self.settings.default_config
        if default is not None and default not in self.settings.configs:
            served = ", ".join(sorted(self.settings.configs)) or "none"
            raise BrokenConfig(f"GROUNDED_DEFAULT_CONFIG {default!r} is not in GROUNDED_CONFIGS (served: {served})")
        for name, path in self.settings.configs.items():
            read_config(name, path)

    def validate(
        self,
        lines: Iterable[str | bytes | Mapping[str, Any]],
        config: JobConfig | Mapping[str, Any] | str,
        *,
        tenant: str | None = None,
    ) -> BatchReport:
        """Every line and the config; `tenant` (the submitter's) limits the corpora it may name (H13)."""
        report = parse_batch(lines, config, corpora=self.served_corpora(tenant),
                             max_lines=self.settings.max_batch_lines)
        return self._operator_checks(report)

    def _operator_checks(self, report: BatchReport) -> BatchReport:
        """What the operator's settings refuse at submission: a model outside GROUNDED_MODEL_ALLOWLIST
        (a job the workers would refuse is never queued), and a retention longer than the deployment's
        (H16: a batch may only shorten it)."""
        if report.config is not None:
            try:
                check_model_allowed(report.config, self.settings.model_allowlist)
            except ModelUnavailable as exc:
                report.errors.insert(0, JobLineError(CONFIG_LINE, str(exc)))
            too_long = longer_than_allowed(report.config.retention_days, self.settings.retention_days)
            if too_long is not None:
                report.errors.insert(0, JobLineError(CONFIG_LINE, too_long))
        return report

    def submit(self, report: BatchReport, *, tenant: str, arm: str | None = None) -> Batch:
        batch, jobs = self.store.create_batch(report, tenant=tenant, arm=arm)
        starts = [job for job in jobs if job.kind == "conversation"]
        if starts:  # stored before they run, so follow-ups can be sent (and queue) at once
            with self.store.redis.pipeline(transaction=False) as pipe:
                for job in starts:
                    self.conversations.create(job.conversation_id or job.id, tenant=tenant, config=batch.config,
                                              job_id=job.id, batch_id=batch.id, pipe=pipe)
                pipe.execute()
        self._enqueue(jobs)
        return batch

    def _enqueue(self, jobs: list[Job]) -> None:
        """Publishes go out in Redis pipelines (kombu's producer batch, 1,000 commands each) and the
        queue is declared once, not per task: one round trip and one declaration per task made a
        10,000-job batch take 5 s to accept (bench/submission.py)."""
        with self.app.producer_or_acquire() as producer, producer.batch():
            producer.maybe_declare(self.app.amqp.queues[QUEUE])
            for job in jobs:
                self.app.send_task(ANSWER_JOB, args=[job.id], task_id=job.id, queue=QUEUE, producer=producer,
                                   priority=FRESH_PRIORITY, declare=[], **task_labels(job))

    def follow_up(
        self,
        conversation_id: str,
        question: str,
        *,
        tenant: str,
        config: JobConfig | Mapping[str, Any] | str | None = None,
        custom_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Job:
        """One more user turn on a stored conversation, as a one-job batch. Only the question travels:
        the history and state are the server's. Raises ConversationNotFound (also for another tenant's
        conversation), CompositionMismatch (H3) or JobLineError; nothing is stored or enqueued then."""
        meta = self.conversations.load_meta(conversation_id)
        if meta is None or meta.tenant != tenant:
            raise ConversationNotFound(conversation_id)
        line = {"custom_id": custom_id or f"{conversation_id}:follow-up", "question": question,
                "metadata": {} if metadata is None else metadata}
        report = self._operator_checks(
            parse_batch([line], meta.config if config is None else config, corpora=self.served_corpora(tenant)))
        if not report.ok:
            raise report.errors[0]
        assert report.config is not None
        differences = composition_differences(meta.composition, StoredComposition.of(report.config.composition))
        if differences:
            raise CompositionMismatch(conversation_id, differences)
        spec = report.jobs[0].model_copy(update={"kind": "follow_up", "conversation_id": conversation_id})
        _, (job,) = self.store.create_batch(BatchReport(config=report.config, jobs=[spec]), tenant=tenant)
        self.conversations.add_job(conversation_id, job.id, batch_id=job.batch_id)
        self._enqueue([job])
        return job

    def owned_batch(self, batch_id: str, tenant: str) -> Batch:
        batch = self.store.load_batch(batch_id)
        if batch is None or batch.tenant != tenant:
            raise NotFound("batch", batch_id)
        return batch

    def cancel(self, batch_id: str) -> None:
        """Jobs waiting on their provider (H17) are delivered again at once instead of at their next
        check, so each abandons its request (cancelling provider batches nobody waits on) in seconds."""
        self.store.request_cancel(batch_id)
        waiting = [job for job_id in ProviderBatchStore(self.store).waiting_jobs(batch_id)
                   if (job := self.store.load_job(job_id)) is not None]
        if waiting:
            self._enqueue(waiting)

    def delete(self, batch_id: str, tenant: str) -> int:
        """H16: the batch and everything under it, now; raises NotFound for another tenant's. A running
        batch stops with it: its queued jobs are skipped, and what its running jobs still write is
        discarded. Returns how many keys were removed."""
        self.owned_batch(batch_id, tenant)
        return delete_batch(self.store, batch_id, tenant)
