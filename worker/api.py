"""The producer HTTP API (FastAPI). `create_api` only assembles; each resource is a router.

Bearer tokens map to tenants, and a tenant sees only its own batches and jobs: anything else is a
404, so a token cannot even learn that another tenant's batch exists.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from .api_guards import install_guards
from .config import Settings, get_settings
from .jobs import Batch, Job
from .metrics import router as metrics_router
from .producer import Producer

bearer = HTTPBearer(auto_error=False)


@dataclass(frozen=True)
class Caller:
    tenant: str


class BatchSubmission(BaseModel):
    """JSON form of a submission; the same fields travel as multipart form parts with a JSONL `file`."""

    config: dict[str, Any] | str = Field(description="the job config: a mapping, or YAML/JSON text")
    lines: list[dict[str, Any] | str] = Field(description="one job per item, as a JSONL line would hold it")
    arm: str | None = Field(default=None, description="a label for evaluation arms (e.g. 'on' / 'off')")


def producer(request: Request) -> Producer:
    return request.app.state.producer


def current_caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Caller:
    tokens: dict[str, str] = request.app.state.settings.api_tokens
    if credentials is not None:
        presented = credentials.credentials.encode()
        for token, tenant in tokens.items():
            if hmac.compare_digest(presented, token.encode()):
                return Caller(tenant=tenant)
    raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a valid bearer token is required",
                        headers={"WWW-Authenticate": "Bearer"})


ProducerDep = Annotated[Producer, Depends(producer)]
CallerDep = Annotated[Caller, Depends(current_caller)]
_NOT_FOUND = {404: {"description": "no such batch for this token's tenant"}}


def owned_batch(batch_id: str, producer: ProducerDep, caller: CallerDep) -> Batch:
    batch = producer.store.load_batch(batch_id)
    if batch is None or batch.tenant != caller.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"batch {batch_id!r} not found")
    return batch


OwnedBatch = Annotated[Batch, Depends(owned_batch)]

batches = APIRouter(prefix="/v1/batches", tags=["batches"])
jobs = APIRouter(prefix="/v1/jobs", tags=["jobs"])
health = APIRouter(tags=["health"])


async def _submission(request: Request) -> BatchSubmission:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        form = await request.form()
        upload, config = form.get("file"), form.get("config")
        if upload is None or isinstance(upload, str) or not isinstance(config, str):
            raise HTTPException(422, [{"line": 0, "problem": "multipart needs a JSONL `file` and a `config` part"}])
        text = (await upload.read()).decode("utf-8", errors="replace")
        arm = form.get("arm")
        return BatchSubmission(config=config, lines=text.splitlines(), arm=arm if isinstance(arm, str) else None)
    try:
        return BatchSubmission.model_validate_json(await request.body())
    except ValueError as exc:
        raise HTTPException(422, [{"line": 0, "problem": f"body: {exc}"}]) from None


@batches.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={422: {"description": "per-line errors (line 0: the config); nothing was enqueued"}},
    openapi_extra={
        "requestBody": {
            "content": {
                "application/json": {"schema": BatchSubmission.model_json_schema()},
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["file", "config"],
                        "properties": {
                            "file": {"type": "string", "format": "binary", "description": "JSONL, one job a line"},
                            "config": {"type": "string", "description": "the job config, YAML or JSON"},
                            "arm": {"type": "string"},
                        },
                    }
                },
            },
            "required": True,
        }
    },
)
async def submit_batch(request: Request, producer: ProducerDep, caller: CallerDep) -> JSONResponse:
    body = await _submission(request)
    report = await run_in_threadpool(producer.validate, body.lines, body.config)
    if not report.ok:
        raise HTTPException(422, [e.as_dict() for e in report.errors])
    batch = await run_in_threadpool(producer.submit, report, tenant=caller.tenant, arm=body.arm)
    progress = await run_in_threadpool(producer.store.progress, batch.id)
    assert progress is not None
    return JSONResponse(progress.as_dict(), status_code=status.HTTP_201_CREATED)


@batches.get("")
def list_batches(
    producer: ProducerDep, caller: CallerDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[dict[str, Any]]:
    out = []
    for batch_id in producer.store.tenant_batches(caller.tenant, limit=limit):
        progress = producer.store.progress(batch_id)
        if progress is not None:
            out.append(progress.as_dict())
    return out


@batches.get("/{batch_id}", responses=_NOT_FOUND)
def get_batch(batch: OwnedBatch, producer: ProducerDep) -> dict[str, Any]:
    progress = producer.store.progress(batch.id)
    assert progress is not None
    return {**progress.as_dict(), "model": batch.config.model, "config": batch.config.model_dump(mode="json")}


@batches.get(
    "/{batch_id}/results",
    responses={**_NOT_FOUND, 200: {"content": {"application/x-ndjson": {}}, "description": "one JobResult a line"}},
)
def get_results(batch: OwnedBatch, producer: ProducerDep) -> StreamingResponse:
    """Finished jobs in submission order; while the batch runs, what has finished so far."""

    def lines() -> Iterator[bytes]:
        for raw in producer.store.iter_results_raw(batch.id):
            yield raw + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@batches.get("/{batch_id}/events", responses=_NOT_FOUND)
def get_events(
    batch: OwnedBatch,
    producer: ProducerDep,
    after: Annotated[str | None, Query(pattern=r"^\d{1,20}(-\d{1,20})?$", description="an event id")] = None,
    count: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> list[dict[str, Any]]:
    try:
        events = producer.store.events(batch.id, after=after, count=count)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc)) from None
    return [{"id": eid, **fields} for eid, fields in events]


@batches.post("/{batch_id}/cancel", status_code=status.HTTP_202_ACCEPTED, responses=_NOT_FOUND)
def cancel_batch(batch: OwnedBatch, producer: ProducerDep) -> dict[str, Any]:
    """Queued jobs are skipped as workers reach them; running jobs finish and are recorded."""
    producer.cancel(batch.id)
    progress = producer.store.progress(batch.id)
    assert progress is not None
    return progress.as_dict()


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


@health.get("/healthz")
def healthz(producer: ProducerDep) -> JSONResponse:
    try:
        producer.store.redis.ping()
    except redis.RedisError as exc:
        return JSONResponse({"status": "unavailable", "redis": str(exc)}, status_code=503)
    return JSONResponse({"status": "ok"})


def create_api(settings: Settings | None = None, *, producer: Producer | None = None) -> FastAPI:
    """An API without tokens would serve everyone as no one, so it refuses to start."""
    settings = settings or get_settings()
    if not settings.api_tokens:
        raise RuntimeError("GROUNDED_API_TOKENS is not set: give the API at least one token=tenant pair")
    api = FastAPI(title="grounded-worker", version="0.1.0",
                  description="Submit question batches; read answers with their citation outcomes.")
    api.state.settings = settings
    api.state.producer = producer or Producer(settings)
    install_guards(api, max_request_bytes=settings.max_request_bytes)
    api.include_router(health)
    api.include_router(metrics_router)
    api.include_router(batches, dependencies=[Depends(current_caller)])
    api.include_router(jobs, dependencies=[Depends(current_caller)])
    from .conversations_api import (
        conversations,  # these routers build on this module's dependencies
    )
    from .report_api import reports

    api.include_router(reports, dependencies=[Depends(current_caller)])
    api.include_router(conversations, dependencies=[Depends(current_caller)])
    return api
