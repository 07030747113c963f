"""What one worker process lends every job it runs: its settings, results store and runtime (agent
and model caches, signer), made once per process after any fork; and the process loop a job's
runs are submitted to."""

from __future__ import annotations

import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from worker.jobs.models import Batch, Job, JobResult
from worker.runtime.agents import AgentCache
from worker.runtime.conversations import run_conversation_job
from worker.runtime.embedders import EmbedderCache
from worker.runtime.llms import ModelCache
from worker.runtime.loop import PerProcess, process_loop
from worker.runtime.provider_batches import ProviderBatching
from worker.runtime.run import Commit, Runtime, run_job
from worker.settings import Settings, get_settings
from worker.store.conversations import ConversationStore
from worker.store.provider_batches import ProviderBatchStore
from worker.store.results import ResultsStore

LOOP_GRACE_S = 30  # the run cancels itself at its timeout; this outer wait only catches a stuck loop


class WorkerLost(RuntimeError):
    """acks_late redelivers a job whose worker died, so a job that is itself what kills its worker
    (out of memory, a crash in native code) would be redelivered for ever: after
    GROUNDED_MAX_WORKER_LOSSES such deaths it fails instead, and the rest of its batch goes on."""

    def __init__(self, losses: int) -> None:
        super().__init__(f"the worker running this job died {losses} times before it finished "
                         "(GROUNDED_MAX_WORKER_LOSSES); it is failed instead of being redelivered again")


def worker_losses(attempts: int, retries: int, handed_back: int) -> int:
    """Earlier starts that ended in no outcome: not finished, no retry asked, not handed back at a
    shutdown (H15). Only these could be the job's own doing; a kill -9 of a process that ran
    several jobs cannot be pinned on one of them, so each of those counts against all of them."""
    return max(attempts - 1 - retries - handed_back, 0)


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
        agents=AgentCache(signer=signer, corpora_dir=settings.corpora_dir,
                          embedders=EmbedderCache.from_settings(settings), tenant_corpora=settings.tenant_corpora),
        models=ModelCache(allowlist=settings.model_allowlist, endpoint_key_bindings=settings.endpoint_key_bindings),
        signer=signer,
        batching=ProviderBatching.from_settings(settings, ProviderBatchStore(store)),  # H17: one per process
    )
    return ProcessWorker(settings, store, runtime)


_worker = PerProcess(_make_process_worker)


def process_worker() -> ProcessWorker:
    """One store, agent cache and model cache per worker process, made after any fork."""
    return _worker.get()


def retry_delay(retries: int, retry_after: float | None, settings: Settings) -> float:
    """The provider's Retry-After when it sent one; otherwise exponential backoff with jitter, so
    workers that failed together do not retry together. Capped by retry_max_s; the waiting job's
    delivery is renewed like a running one's (H14), so a countdown of any length is safe."""
    if retry_after is not None:
        return min(max(retry_after, 0.0), settings.retry_max_s)
    delay = settings.retry_base_s * (2**retries)
    return min(delay * random.uniform(0.8, 1.2), settings.retry_max_s)


def job_run(worker: ProcessWorker, job: Job, batch: Batch, attempts: int, started_at: datetime,
            commit: Commit) -> tuple[Callable[[], Coroutine[Any, Any, JobResult]], float]:
    """The job's runs as a coroutine factory for the process loop, and how long they may take."""
    timeout_s = min(batch.config.run.timeout_s, worker.settings.task_soft_limit_s)
    if job.kind != "question":
        conversations = ConversationStore(worker.store)
        return (lambda: run_conversation_job(job, batch, worker.runtime, conversations, attempts=attempts,
                                             started_at=started_at, timeout_s=timeout_s, progress=commit),
                timeout_s)
    return (lambda: run_job(job, batch, worker.runtime, attempts=attempts, started_at=started_at,
                            timeout_s=timeout_s, commit=commit),
            timeout_s)


def run_in_process_loop(worker: ProcessWorker, job: Job, batch: Batch, attempts: int, started_at: datetime,
                        commit: Commit) -> JobResult:
    """Runs the job on this process's event loop and waits for it: one loop per process
    (docs/design/architecture.md, "Queue")."""
    make, timeout_s = job_run(worker, job, batch, attempts, started_at, commit)
    return process_loop().run(make, timeout=timeout_s + LOOP_GRACE_S)
