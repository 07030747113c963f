"""`GET /metrics`: Prometheus families built on every scrape from what the workers counted in Redis
(`worker.store.metrics`), so any API replica reports the same numbers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from worker.store.keys import QUEUE
from worker.store.metrics import (
    BUCKETS,
    CITATION_STATUSES,
    DIRECTIONS,
    FINISHED,
    JOB,
    KINDS,
    MODEL_REQUEST,
    Snapshot,
    read_snapshot,
)
from worker.store.results import ResultsStore


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
    answers = CounterMetricFamily(
        "grounded_answers", "Questions answered by finished jobs, by what grounds each answer (one per turn).",
        labels=["citation_status"])
    for citation_status in CITATION_STATUSES:
        answers.add_metric([citation_status], c.get(f"answers:{citation_status}", 0.0))
    tokens = CounterMetricFamily("grounded_model_tokens", "Model tokens used by finished jobs.", labels=["direction"])
    for direction in DIRECTIONS:
        tokens.add_metric([direction], c.get(f"tokens:{direction}", 0.0))
    waiting = GaugeMetricFamily(
        "grounded_jobs_waiting_on_provider",
        "Jobs whose model request sits in a provider batch (run.batch, H17); they hold no worker slot.",
        value=snapshot.waiting_on_provider,
    )
    return [
        depth,
        age,
        reserved,
        waiting,
        finished,
        answers,
        CounterMetricFamily("grounded_redirects", "Citation-policy redirects that reached a history (V5).",
                            value=c.get("redirects", 0.0)),
        CounterMetricFamily("grounded_policy_violations", "Questions answered in violation of the citation policy.",
                            value=c.get("violations", 0.0)),
        CounterMetricFamily("grounded_model_requests", "Model requests made by finished jobs.",
                            value=c.get("model_requests", 0.0)),
        CounterMetricFamily("grounded_provider_batches", "Provider batches that batch-mode jobs waited on (H17).",
                            value=c.get("provider_batches", 0.0)),
        CounterMetricFamily("grounded_provider_rounds",
                            "Batch-mode rounds: a request submitted to a provider batch and waited on (H17).",
                            value=c.get("provider_rounds", 0.0)),
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
    registry.register(GroundedCollector(store))
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
