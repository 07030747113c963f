"""Prometheus metrics for the whole deployment, read from Redis when Prometheus scrapes `GET /metrics`.

Workers are separate processes on separate machines, so a counter in one process's memory would
show only that process: each worker adds what a finished job did to counters in Redis, once per job
(on the write that first counted it), and any API replica reads those, the Celery queue and its
oldest job. Labels come only from fixed sets (queue, status, kind, direction), never from ids, so
the number of series stays bounded however many jobs run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
)

from .app import QUEUE
from .jobs import Job, JobKind, JobResult
from .results import ResultsStore

METRICS_KEY = "metrics"  # one hash under the key prefix: counters and histogram buckets
UNACKED_KEY = "unacked"  # kombu's hash of delivered, unacknowledged messages (under global_keyprefix)

FINISHED = ("succeeded", "failed", "cancelled")
KINDS: tuple[str, ...] = get_args(JobKind)
DIRECTIONS = ("input", "output")

MODEL_REQUEST = "model_request"
JOB = "job"
BUCKETS: dict[str, tuple[float, ...]] = {
    MODEL_REQUEST: (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0),
    JOB: (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0),
}


# --- what a finished job adds (pure) -------------------------------------------------------------


def request_latencies(messages: Sequence[ModelMessage]) -> list[float]:
    """Seconds from each request being prepared to its response arriving. pydantic-ai stamps both
    locally, so stored results hold the latency and no wrapper around the model is needed."""
    latencies: list[float] = []
    sent = None
    for message in messages:
        if isinstance(message, ModelRequest):
            sent = message.timestamp
        elif isinstance(message, ModelResponse) and sent is not None:
            latencies.append(max(0.0, (message.timestamp - sent).total_seconds()))
            sent = None
    return latencies


@dataclass(frozen=True)
class JobObservation:
    status: str
    kind: str
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
        latencies += request_latencies(ModelMessagesTypeAdapter.validate_json(turn.new_messages_json))
    return JobObservation(
        status=result.status,
        kind=result.kind,
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
    for histogram, value in samples:
        bucket = _bucket_field(histogram, value)
        if bucket is not None:
            fields[bucket] = fields.get(bucket, 0) + 1
        fields[f"{histogram}:count"] = fields.get(f"{histogram}:count", 0) + 1
        fields[f"{histogram}:sum"] = fields.get(f"{histogram}:sum", 0.0) + value
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


def record_finished(store: ResultsStore, result: JobResult) -> None:
    _add(store, increments(observe(result)))


def record_cancelled(store: ResultsStore, job: Job) -> None:
    _add(store, increments(JobObservation(status="cancelled", kind=job.kind)))


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


def _submitted_at(store: ResultsStore, raw: bytes) -> float | None:
    """A Celery message carries no send time, but its task id is the job id, and the job's batch
    records when it was submitted."""
    try:
        task_id = json.loads(raw)["headers"]["id"]
    except (ValueError, KeyError, TypeError):
        return None
    job = store.load_job(task_id)
    batch = store.load_batch(job.batch_id) if job is not None else None
    return batch.created_at.timestamp() if batch is not None else None


def read_queue(store: ResultsStore, queue: str, now: float) -> QueueState:
    key = store.key(queue)  # Celery's global_keyprefix is the store's prefix (settings.key_prefix)
    depth = int(store.redis.llen(key))
    if depth == 0:
        return QueueState(0, 0.0)
    oldest = store.redis.lindex(key, -1)  # kombu LPUSHes and BRPOPs: the right end is the oldest
    if oldest is None:
        return QueueState(0, 0.0)
    submitted = _submitted_at(store, oldest)
    return QueueState(depth, max(0.0, now - submitted) if submitted is not None else None)


def read_snapshot(store: ResultsStore, queues: Iterable[str], now: float) -> Snapshot:
    raw = store.redis.hgetall(store.key(METRICS_KEY))
    return Snapshot(
        queues={queue: read_queue(store, queue, now) for queue in queues},
        reserved=int(store.redis.hlen(store.key(UNACKED_KEY))),
        counters={k.decode(): float(v) for k, v in raw.items()},
    )


def _histogram(name: str, documentation: str, histogram: str, counters: Mapping[str, float]) -> HistogramMetricFamily:
    cumulative, buckets = 0.0, []
    for bound in BUCKETS[histogram]:
        cumulative += counters.get(f"{histogram}:le:{bound:g}", 0.0)
        buckets.append((floatToGoString(bound), cumulative))
    buckets.append(("+Inf", counters.get(f"{histogram}:count", 0.0)))
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=counters.get(f"{histogram}:sum", 0.0))


def families(snapshot: Snapshot) -> list[Metric]:
    c = snapshot.counters
    depth = GaugeMetricFamily("grounded_queue_depth", "Jobs waiting in the Celery queue (the list KEDA scales on).",
                              labels=["queue"])
    age = GaugeMetricFamily("grounded_queue_oldest_job_age_seconds",
                            "Seconds since the oldest queued job's batch was submitted; 0 when the queue is empty.",
                            labels=["queue"])
    for queue, state in snapshot.queues.items():
        depth.add_metric([queue], state.depth)
        if state.oldest_age_s is not None:
            age.add_metric([queue], state.oldest_age_s)
    reserved = GaugeMetricFamily(
        "grounded_jobs_reserved",
        "Jobs workers have taken and not yet acknowledged: running, prefetched or waiting out a retry countdown.",
        value=snapshot.reserved,
    )
    finished = CounterMetricFamily("grounded_jobs_finished", "Jobs finished, counted once per job.",
                                   labels=["status", "kind"])
    for status in FINISHED:
        for kind in KINDS:
            finished.add_metric([status, kind], c.get(f"jobs:{status}:{kind}", 0.0))
    tokens = CounterMetricFamily("grounded_model_tokens", "Model tokens used by finished jobs.", labels=["direction"])
    for direction in DIRECTIONS:
        tokens.add_metric([direction], c.get(f"tokens:{direction}", 0.0))
    return [
        depth,
        age,
        reserved,
        finished,
        CounterMetricFamily("grounded_redirects", "Citation-policy redirects that reached a history (V5).",
                            value=c.get("redirects", 0.0)),
        CounterMetricFamily("grounded_policy_violations", "Questions answered in violation of the citation policy.",
                            value=c.get("violations", 0.0)),
        CounterMetricFamily("grounded_model_requests", "Model requests made by finished jobs.",
                            value=c.get("model_requests", 0.0)),
        tokens,
        _histogram("grounded_model_request_duration_seconds",
                   "From a model request being prepared to its response arriving.", MODEL_REQUEST, c),
        _histogram("grounded_job_duration_seconds", "From a job's last start to its result.", JOB, c),
    ]


class GroundedCollector:
    """Reads Redis on every scrape, so any API replica reports the same numbers."""

    def __init__(self, store: ResultsStore, queues: Sequence[str] = (QUEUE,), clock: Callable[[], float] = time.time) -> None:
        self.store, self.queues, self.clock = store, tuple(queues), clock

    def collect(self) -> Iterable[Metric]:
        return families(read_snapshot(self.store, self.queues, self.clock()))


def registry_for(store: ResultsStore) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GroundedCollector(store))  # type: ignore[arg-type]
    return registry


router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
def metrics(request: Request) -> Response:
    """Aggregates only (no tenant's data), so it is served without a token, like Flower's /metrics;
    keep it on the cluster network."""
    state: Any = request.app.state
    if getattr(state, "metrics_registry", None) is None:
        state.metrics_registry = registry_for(state.producer.store)
    return Response(generate_latest(state.metrics_registry), media_type=CONTENT_TYPE_LATEST)
