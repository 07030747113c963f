"""`/openai/v1/batches`: the OpenAI Batch API over a JSONL file uploaded to `/openai/v1/files`.

Under its own prefix, so it never collides with the native `/v1/batches`; an accepted batch has the
same id in both. Which config answers is the operator's (`body.model` names a served config, I1);
allowlists and the line limit apply as for any submission. Errors are OpenAI-shaped.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request

from worker.interfaces.openai_format import OpenAIRequestError

from .deps import CallerDep, OpenAIDep
from .openai_files import PREFIX

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "`{error: {message, type, param, code}}`"},
    404: {"description": "no such batch (or input file) for this token's tenant"},
}


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


batches = APIRouter(prefix=f"{PREFIX}/batches", tags=["openai"])


@batches.post("", responses=_ERRORS)
def create_batch(body: BatchCreate, service: OpenAIDep, caller: CallerDep) -> dict[str, Any]:
    """Validates the whole file now: the batch is `in_progress`, or `failed` with `errors.data` (line
    numbers) and an error file, with nothing enqueued (I2)."""
    return service.create(caller.tenant, input_file_id=body.input_file_id, endpoint=body.endpoint,
                          completion_window=body.completion_window, metadata=body.metadata)


@batches.get("", responses=_ERRORS)
def list_batches(
    service: OpenAIDep,
    caller: CallerDep,
    after: Annotated[str | None, Query(description="the last id of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """Newest first, a cursor page at a time."""
    return service.page(caller.tenant, after=after, limit=limit)


@batches.get("/{batch_id}", responses=_ERRORS)
def retrieve_batch(batch_id: str, service: OpenAIDep, caller: CallerDep) -> dict[str, Any]:
    return service.retrieve(caller.tenant, batch_id)


@batches.post("/{batch_id}/cancel", responses=_ERRORS)
def cancel_batch(batch_id: str, service: OpenAIDep, caller: CallerDep) -> dict[str, Any]:
    """Queued requests are skipped (they land in the error file as `batch_cancelled`); running ones finish."""
    return service.cancel(caller.tenant, batch_id)


async def openai_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIRequestError)
    return JSONResponse(exc.body(), status_code=exc.status)
