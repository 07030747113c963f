"""`/openai/v1/files`: the OpenAI Files API as the Batch API uses it: upload a JSONL input file
(purpose `batch`), describe a file, and download one (an input, or a batch's output or error file).

Files are the token's tenant's (another tenant's file is a 404) and an upload is bounded by
GROUNDED_MAX_REQUEST_BYTES like every body; its lines are checked when a batch reads it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from worker.interfaces.openai_format import OpenAIRequestError, file_object

from .deps import CallerDep, OpenAIDep
from .streaming import in_chunks

PREFIX = "/openai/v1"
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "`{error: {message, type, param, code}}`"},
    404: {"description": "no such file for this token's tenant"},
}

files = APIRouter(prefix=f"{PREFIX}/files", tags=["openai"])


@files.post("", responses=_ERRORS, openapi_extra={"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary", "description": "JSONL, one request a line"},
        "purpose": {"type": "string", "enum": ["batch"]}}}}}}})
async def create_file(request: Request, service: OpenAIDep, caller: CallerDep) -> dict[str, Any]:
    async with request.form(max_files=1, max_fields=8) as form:
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile) or not isinstance(purpose, str):
            raise OpenAIRequestError(400, "a file upload is multipart/form-data with a `file` part and a `purpose`",
                                     param="file")
        content = await upload.read()
        filename = upload.filename or "upload.jsonl"
    return await run_in_threadpool(service.upload, caller.tenant, filename=filename, purpose=purpose, content=content)


@files.get("/{file_id}", responses=_ERRORS)
def retrieve_file(file_id: str, service: OpenAIDep, caller: CallerDep) -> dict[str, Any]:
    return file_object(service.file(caller.tenant, file_id))


@files.get("/{file_id}/content", responses={**_ERRORS, 200: {"content": {"application/octet-stream": {}}}})
def file_content(file_id: str, service: OpenAIDep, caller: CallerDep) -> StreamingResponse:
    """An upload as it was sent; a batch's output or error file rendered from its stored results."""
    return StreamingResponse(in_chunks(service.file_content(caller.tenant, file_id)),
                             media_type="application/octet-stream")
