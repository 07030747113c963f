"""Prometheus metrics for the whole deployment, read from Redis when Prometheus scrapes `GET /metrics`.

Workers are separate processes on separate machines, so a counter in one process's memory would
show only that process: each worker adds what a finished job did to counters in Redis, once per job
(on the write that first counted it), and any API replica reads those, the Celery queue and its
oldest job. Labels come only from fixed sets (queue, status, kind, citation status, direction),
never from ids, so the number of series stays bounded however many jobs run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import get_args

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse

from worker.jobs.models import CitationStatus, Job, JobKind, JobResult

from .broker_messages import message_job_id
from .keys import METRICS_KEY, PROVIDER_WAITING_KEY, UNACKED_KEY, queue_lanes
from .results import ResultsStore

FINISHED = ("succeeded", "failed", "cancelled")
KINDS: tuple[str, ...] = get_args(JobKind)
CITATION_STATUSES: tuple[str, ...] = get_args(CitationStatus)
DIRECTIONS = ("input", "output")

MODEL_REQUEST = "model_request"
JOB = "job"
BUCKETS: dict[str, tuple[float, ...]] = {
    MODEL_REQUEST: (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0),
    JOB: (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0),
}


# --- what a finished job adds (pure) -------------------------------------------------------------


Stamp = tuple[str, datetime | None]  # a message's kind ("request" or "response") and its timestamp


def latencies_of(stamps: Iterable[Stamp]) -> list[float]:
    """Seconds from each request being prepared to its response arriving. pydantic-ai stamps both
    locally, so stored results hold the latency and no wrapper around the model is needed."""
    latencies: list[float] = []
    sent = None
    for kind, timestamp in stamps:
        if kind == "request":
            sent = timestamp
        elif kind == "response" and sent is not None and timestamp is not None:
            latencies.append(max(0.0, (timestamp - sent).total_seconds()))
            sent = None
    return latencies


def request_latencies(messages: Sequence[ModelMessage]) -> list[float]:
    return latencies_of(("request" if isinstance(m, ModelRequest) else "response" if isinstance(m, ModelResponse)
                         else "", m.timestamp) for m in messages)


def stored_latencies(new_messages_json: bytes) -> list[float]:
    """The same from a turn's stored messages, reading only each message's kind and timestamp:
    validating the whole history back into pydantic-ai's models cost more CPU than the rest of
    recording a finished job."""
    return latencies_of((m.get("kind", ""), _timestamp(m.get("timestamp"))) for m in json.loads(new_messages_json))


def _timestamp(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


@dataclass(frozen=True)
class JobObservation:
    status: str
    kind: str
    citation_statuses: tuple[str, ...] = ()  # one per question answered (committed turns of a failed job too)
    redirects: int = 0
    violations: int = 0
    model_requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    request_seconds: tuple[float, ...] = ()
    job_seconds: float | None = None


def observe(result: JobResult) -> JobObservation:
    latencies: list[float] = []
    for turn in result.turns:
        latencies += stored_latencies(turn.new_messages_json)
    return JobObservation(
        status=result.status,
        kind=result.kind,
        citation_statuses=tuple(t.citation_status for t in result.turns),
        redirects=sum(t.redirects for t in result.turns),
        violations=sum(t.violation for t in result.turns),
        model_requests=sum(t.n_requests for t in result.turns),
        input_tokens=sum(t.usage.input_tokens for t in result.turns),
        output_tokens=sum(t.usage.output_tokens for t in result.turns),
        request_seconds=tuple(latencies),
        job_seconds=max(0.0, (result.finished_at - result.started_at).total_seconds()),
    )


def _bucket_field(histogram: str, value: float) -> str | None:
    """Buckets are stored unaccumulated, named by their bound; above the last bound only `count` moves."""
    for bound in BUCKETS[histogram]:
        if value <= bound:
            return f"{histogram}:le:{bound:g}"
    return None


def increments(observation: JobObservation) -> dict[str, float]:
    """The hash fields one finished job adds to."""
    fields: dict[str, float] = {f"jobs:{observation.status}:{observation.kind}": 1}
    for citation_status in observation.citation_statuses:
        name = f"answers:{citation_status}"
        fields[name] = fields.get(name, 0) + 1
    for name, value in (
        ("redirects", observation.redirects),
        ("violations", observation.violations),
        ("model_requests", observation.model_requests),
        ("tokens:input", observation.input_tokens),
        ("tokens:output", observation.output_tokens),
    ):
        if value:
            fields[name] = value
    samples = [(MODEL_REQUEST, s) for s in observation.request_seconds]
    if observation.job_seconds is not None:
        samples.append((JOB, observation.job_seconds))
    for histogram, seconds in samples:
        bucket = _bucket_field(histogram, seconds)
        if bucket is not None:
            fields[bucket] = fields.get(bucket, 0) + 1
        fields[f"{histogram}:count"] = fields.get(f"{histogram}:count", 0) + 1
        fields[f"{histogram}:sum"] = fields.get(f"{histogram}:sum", 0.0) + seconds
    return fields


# --- the worker's side (called once per job, after the write that counted it) --------------------


def _add(store: ResultsStore, fields: Mapping[str, float]) -> None:
    """HINCRBYFLOAT for every field: one command for counts and sums alike (HINCRBY would refuse a
    field that a float had ever been added to)."""
    key = store.key(METRICS_KEY)
    with store.redis.pipeline(transaction=True) as pipe:
        for name, value in fields.items():
            pipe.hincrbyfloat(key, name, value)
        pipe.execute()


def finished_counts(result: JobResult) -> dict[str, float]:
    """What `ResultsStore.write_result(..., metrics=)` adds, in the write that counts the job."""
    return increments(observe(result))


def cancelled_counts(job: Job) -> dict[str, float]:
    return increments(JobObservation(status="cancelled", kind=job.kind))


def record_finished(store: ResultsStore, result: JobResult) -> None:
    """For a result written without its counts (tests, imports); the worker passes them to the write."""
    _add(store, finished_counts(result))


# --- the scrape (read Redis, then build the families from what was read) -------------------------


@dataclass(frozen=True)
class QueueState:
    depth: int
    oldest_age_s: float | None  # None: jobs are queued but the oldest one's batch is gone


@dataclass(frozen=True)
class Snapshot:
    queues: dict[str, QueueState]
    reserved: int
    counters: dict[str, float] = field(default_factory=dict)
    waiting_on_provider: int = 0  # H17: jobs whose request sits in a provider batch


def _submitted_at(store: ResultsStore, raw: bytes) -> float | None:
    """A Celery message carries no send time, but its task id is the job id, and the job's batch
    records when it was submitted."""
    task_id = message_job_id(raw)
    job = store.load_job(task_id) if task_id is not None else None
    batch = store.load_batch(job.batch_id) if job is not None else None
    return batch.created_at.timestamp() if batch is not None else None


def read_queue(store: ResultsStore, queue: str, now: float) -> QueueState:
    """Both lanes of the queue (H19) count; the age is that of the oldest job next in either."""
    # Celery's global_keyprefix is the store's prefix (settings.key_prefix)
    keys = [store.key(lane) for lane in queue_lanes(queue)]
    with store.redis.pipeline(transaction=True) as pipe:
        for key in keys:
            pipe.llen(key)
            pipe.lindex(key, -1)  # kombu LPUSHes and BRPOPs: the right end is the oldest
        replies = pipe.execute()
    depth = sum(int(n) for n in replies[::2])
    heads = [raw for raw in replies[1::2] if raw is not None]
    if depth == 0 or not heads:
        return QueueState(0, 0.0)
    known = [at for raw in heads if (at := _submitted_at(store, raw)) is not None]
    return QueueState(depth, max(0.0, now - min(known)) if known else None)


def read_snapshot(store: ResultsStore, queues: Iterable[str], now: float) -> Snapshot:
    raw = store.redis.hgetall(store.key(METRICS_KEY))
    return Snapshot(
        queues={queue: read_queue(store, queue, now) for queue in queues},
        reserved=int(store.redis.hlen(store.key(UNACKED_KEY))),
        counters={k.decode(): float(v) for k, v in raw.items()},
        waiting_on_provider=int(store.redis.scard(store.key(PROVIDER_WAITING_KEY))),
    )
