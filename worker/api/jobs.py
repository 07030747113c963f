"""`/v1/jobs/{id}`: one job, its state and its result."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, HTTPException, status

from worker.jobs.models import Job

from .deps import CallerDep, ProducerDep

jobs = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@jobs.get("/{job_id}", responses={404: {"description": "no such job for this token's tenant"}})
def get_job(job_id: str, producer: ProducerDep, caller: CallerDep) -> dict[str, Any]:
    job: Job | None = producer.store.load_job(job_id)
    batch = producer.store.load_batch(job.batch_id) if job is not None else None
    if job is None or batch is None or batch.tenant != caller.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found")
    raw = producer.store.load_result_raw(job.id)
    return {
        "job": job.model_dump(mode="json"),
        "state": producer.store.job_state(job),
        "result": json.loads(raw) if raw is not None else None,
    }
