"""A Celery app with one task that does nothing: the bare round trip the queue benchmark compares
against. Same broker settings as worker/app.py where they bear on latency (acks late, prefetch 1,
JSON), plus a result backend, since the round trip ends when the producer has the result.

`celery -A bench.celery_noop worker` with BENCH_NOOP_REDIS_URL set.
"""

from __future__ import annotations

import os

from celery import Celery

URL = os.environ.get("BENCH_NOOP_REDIS_URL", "redis://127.0.0.1:6379/15")

app = Celery("bench_noop", broker=URL, backend=URL)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    task_default_queue="bench-noop",
    broker_connection_retry_on_startup=True,
)


@app.task(name="bench.noop")
def noop(job_id: str) -> str:
    return job_id
