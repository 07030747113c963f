"""`/v1/batches`: submit a batch, list a tenant's batches, follow one, read its results and events,
cancel it, delete it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from worker.producer import NotFound, Producer

from .deps import CallerDep, OwnedBatch, ProducerDep
from .streaming import in_chunks

if TYPE_CHECKING:
    from worker.jobs.models import Batch

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such batch for this token's tenant"}}
MAX_WAIT_S = 60.0  # one long poll; a client that waits longer asks again
MAX_WAITERS = 100  # long polls blocked at once, each on a thread and a Redis connection; more queue for a thread


class BatchSubmission(BaseModel):
    """JSON form of a submission; the same fields travel as multipart form parts with a JSONL `file`."""

    config: dict[str, Any] | str = Field(description="the job config: a mapping, or YAML/JSON text")
    lines: list[dict[str, Any] | str] = Field(description="one job per item, as a JSONL line would hold it")
    arm: str | None = Field(default=None, description="a label for evaluation arms (e.g. 'on' / 'off')")


batches = APIRouter(prefix="/v1/batches", tags=["batches"])


async def _part_text(form: FormData, name: str) -> str | None:
    """A form part as text, whether it was sent as a file (`curl -F config=@job.yaml`) or as a
    value (`-F config=<job.yaml`): both are what a user means by "this file's content"."""
    part = form.get(name)
    if part is None or isinstance(part, str):
        return part
    return (await part.read()).decode("utf-8", errors="replace")


async def _submission(request: Request) -> BatchSubmission:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        form = await request.form()
        text, config = await _part_text(form, "file"), await _part_text(form, "config")
        if text is None or config is None:
            missing = " and ".join(f"`{name}`" for name, part in (("file", text), ("config", config)) if part is None)
            raise HTTPException(422, [{"line": 0, "problem": f"multipart has no {missing} part: send the JSONL as "
                                       "`file` and the job config as `config` (e.g. curl -F file=@questions.jsonl "
                                       "-F config=@job.yaml)"}])
        arm = await _part_text(form, "arm")
        return BatchSubmission(config=config, lines=text.splitlines(), arm=arm)
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
                            "config": {"type": "string", "description": "the job config, YAML or JSON "
                                       "(a text value or a file)"},
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
    accepted = await run_in_threadpool(_accept, producer, body, caller.tenant)
    return JSONResponse(accepted, status_code=status.HTTP_201_CREATED)


def _accept(producer: Producer, body: BatchSubmission, tenant: str) -> dict[str, Any]:
    """Validate, store and enqueue, then read the batch's status back, in one hop to a worker
    thread: a hop per step made each step wait for a free thread and then for the event loop."""
    report = producer.validate(body.lines, body.config, tenant=tenant)
    if not report.ok:
        raise HTTPException(422, [e.as_dict() for e in report.errors])
    batch = producer.submit(report, tenant=tenant, arm=body.arm)
    progress = producer.store.progress(batch.id)
    assert progress is not None
    return progress.as_dict()


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


def _batch_view(batch: Batch, producer: Producer) -> dict[str, Any]:
    progress = producer.store.progress(batch.id)
    if progress is None:  # deleted (H16) or expired while a long poll waited
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(NotFound("batch", batch.id)))
    return {**progress.as_dict(), "model": batch.config.model, "config": batch.config.model_dump(mode="json"),
            "expires_at": batch.expires_at.isoformat() if batch.expires_at else None}


@batches.get("/{batch_id}", responses=_NOT_FOUND)
async def get_batch(
    request: Request, batch: OwnedBatch, producer: ProducerDep,
    wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="hold the reply until the batch has finished "
                                   "or this many seconds have passed (long polling; `state` says which)")] = 0,
) -> dict[str, Any]:
    """A waiting request holds a thread of its own pool (`MAX_WAITERS`), so waiters never take the
    threads every other route runs on."""
    if wait_s:
        deadline = time.monotonic() + wait_s
        await anyio.to_thread.run_sync(lambda: producer.store.wait_finished(batch.id, deadline - time.monotonic()),
                                       limiter=request.app.state.batch_waiters)
    return await run_in_threadpool(_batch_view, batch, producer)


@batches.get(
    "/{batch_id}/results",
    responses={**_NOT_FOUND, 200: {"content": {"application/x-ndjson": {}}, "description": "one JobResult a line"}},
)
def get_results(batch: OwnedBatch, producer: ProducerDep) -> StreamingResponse:
    """Finished jobs in submission order; while the batch runs, what has finished so far."""

    lines = (raw + b"\n" for raw in producer.store.iter_results_raw(batch.id))
    return StreamingResponse(in_chunks(lines), media_type="application/x-ndjson")


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


@batches.delete("/{batch_id}", responses=_NOT_FOUND)
def delete_batch(batch: OwnedBatch, producer: ProducerDep) -> dict[str, Any]:
    """H16: the batch, its jobs, results, events and the conversations it started leave Redis now; a
    running batch stops (queued jobs are skipped, what running jobs still write is discarded)."""
    producer.delete(batch.id, batch.tenant)
    return {"id": batch.id, "object": "batch", "deleted": True}
