"""The OpenAI Batch API's shapes, pure: lines in (read as `parse_batch` reads them), the Batch
status, and the objects and lines out that the official `openai` client parses. No store, no
Redis: `worker.interfaces.openai_batch` applies these to the stores.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.jobs.lines import JobLineError
from worker.jobs.models import Job, JobResult
from worker.producer import NotFound
from worker.store.files import StoredFile
from worker.store.openai_batches import BatchProblem, Finalized, Moments, OpenAIBatchRecord
from worker.store.results import BatchProgress

from .grounding import answer_text, result_grounding

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
ENDPOINTS = (CHAT, RESPONSES)
COMPLETION_WINDOWS = {"24h": 24 * 3600}
INPUT_PURPOSE, OUTPUT_PURPOSE = "batch", "batch_output"
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
MAX_REPORTED_PROBLEMS = 1000  # a refused 100,000-line file should not store 100,000 problems
LINE_CODE, BATCH_CODE = "invalid_request", "config_unavailable"
CANCELLED_CODE, EXPIRED_CODE = "batch_cancelled", "batch_expired"


class OpenAIRequestError(Exception):
    """A request refused in the shape the OpenAI client reads: `{"error": {message, type, param, code}}`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def not_found(kind: str, object_id: str) -> OpenAIRequestError:
    """I5: absent and another tenant's read the same, with the message every interface gives."""
    return OpenAIRequestError(404, str(NotFound(kind, object_id)), code="not_found")


# --- lines in --------------------------------------------------------------------------------------


@dataclass
class AdaptedLines:
    """The file's lines in the shape `parse_batch` reads, numbered as in the file, with what only an
    OpenAI batch can get wrong (a line's url, mixed models) already found."""

    lines: list[bytes | Any]
    model: str | None = None  # the first body.model: it names the served config (I1)
    model_lines: list[int] = field(default_factory=list)
    problems: list[BatchProblem] = field(default_factory=list)
    custom_ids: dict[int, str] = field(default_factory=dict)


def _responses_item(item: Any) -> Any:
    """A Responses input item as a chat message, so parse_line judges both the same way."""
    if not isinstance(item, dict):
        return item
    if item.get("type") in ("function_call", "function_call_output"):
        return {"role": "tool"}  # refused by parse_line: the worker's capabilities are the only tools
    message = {k: v for k, v in item.items() if k != "type"}
    content = item.get("content")
    if isinstance(content, list):
        message["content"] = [{"type": "text", "text": p.get("text")} if isinstance(p, dict)
                              and p.get("type") == "input_text" else p for p in content]
    return message


def responses_body(body: dict[str, Any]) -> dict[str, Any]:
    """`{model, input}` as `{model, messages}`; every other key stays, for parse_line to refuse."""
    rest = {k: v for k, v in body.items() if k != "input"}
    source = body.get("input")
    if isinstance(source, str):
        return {**rest, "messages": [{"role": "user", "content": source}]}
    if isinstance(source, list):
        return {**rest, "messages": [_responses_item(i) for i in source]}
    return rest


def adapt_lines(raw_lines: Iterable[bytes], endpoint: str) -> AdaptedLines:
    out = AdaptedLines(lines=[])
    for n, raw in enumerate(raw_lines, start=1):
        try:
            data = json.loads(raw) if raw.strip() else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = None  # parse_batch reports it with its line number
        if not isinstance(data, dict):
            out.lines.append(raw)
            continue
        if isinstance(data.get("custom_id"), str):
            out.custom_ids[n] = data["custom_id"]
        if data.get("url") != endpoint:
            out.problems.append(BatchProblem(
                code=LINE_CODE, line=n, param="url", custom_id=out.custom_ids.get(n),
                message=f"url {data.get('url')!r} is not the batch's endpoint {endpoint!r}; every line of a batch "
                        "calls the endpoint the batch was created for"))
        body = data.get("body")
        if isinstance(body, dict):
            model = body.get("model")
            if model is not None and not isinstance(model, str):
                out.problems.append(BatchProblem(code=LINE_CODE, line=n, param="body.model",
                                                 custom_id=out.custom_ids.get(n),
                                                 message="body.model must be the name of a served config"))
            elif model is not None and out.model is None:
                out.model, out.model_lines = model, [n]
            elif model is not None and model == out.model:
                out.model_lines.append(n)
            elif model is not None:
                out.problems.append(BatchProblem(
                    code=LINE_CODE, line=n, param="body.model", custom_id=out.custom_ids.get(n),
                    message=f"body.model {model!r} differs from line {out.model_lines[0]}'s {out.model!r}; "
                            "one config answers a whole batch"))
            if endpoint == RESPONSES:
                if not isinstance(body.get("input"), (str, list)):
                    out.problems.append(BatchProblem(code=LINE_CODE, line=n, param="body.input",
                                                     custom_id=out.custom_ids.get(n),
                                                     message="body.input must be a string or a list of messages"))
                data = {**data, "body": responses_body(body)}
        out.lines.append(data)
    return out


def line_problems(errors: Iterable[JobLineError], custom_ids: Mapping[int, str]) -> list[BatchProblem]:
    """parse_batch's refusals as the Batch object's `errors.data` (line None: the batch as a whole)."""
    return [BatchProblem(code=LINE_CODE if e.line_no else BATCH_CODE, line=e.line_no or None,
                         message=e.problem, custom_id=custom_ids.get(e.line_no)) for e in errors]


def capped(problems: list[BatchProblem]) -> list[BatchProblem]:
    ordered = sorted(problems, key=lambda p: (p.line or 0))
    if len(ordered) <= MAX_REPORTED_PROBLEMS:
        return ordered
    rest = len(ordered) - MAX_REPORTED_PROBLEMS
    return [*ordered[:MAX_REPORTED_PROBLEMS], BatchProblem(code=LINE_CODE, message=f"and {rest} more problems")]


# --- status ------------------------------------------------------------------------------------------


def status_of(record: OpenAIBatchRecord, moments: Moments, progress: BatchProgress | None) -> str:
    """I4. `validating` never shows: a file is validated whole while the batch is created."""
    if record.errors or progress is None:
        return "failed"
    if moments.finalized is not None:
        if moments.expired_at is not None:
            return "expired"
        return "cancelled" if progress.cancel_requested else "completed"
    if progress.finished or moments.expired_at is not None:
        return "finalizing"
    return "cancelling" if progress.cancel_requested else "in_progress"


# --- objects out -------------------------------------------------------------------------------------


def file_object(stored: StoredFile) -> dict[str, Any]:
    return {"id": stored.id, "object": "file", "bytes": stored.bytes, "created_at": stored.created_at,
            "filename": stored.filename, "purpose": stored.purpose, "status": "processed",
            "expires_at": stored.expires_at, "status_details": None}


def batch_object(record: OpenAIBatchRecord, moments: Moments, progress: BatchProgress | None,
                 *, finished_at: int | None = None) -> dict[str, Any]:
    status = status_of(record, moments, progress)
    fin = moments.finalized
    if progress is None:
        counts = {"total": 0, "completed": 0, "failed": 0}
    elif fin is not None:
        counts = {"total": progress.total, "completed": fin.completed, "failed": fin.failed}
    else:
        counts = {"total": progress.total, "completed": progress.succeeded, "failed": progress.failed}
    errors = {"object": "list", "data": [p.model_dump(exclude={"custom_id"}) for p in record.errors]}
    terminal_at = fin.at if fin is not None else None
    return {
        "id": record.id,
        "object": "batch",
        "endpoint": record.endpoint,
        "model": record.model,
        "errors": errors if record.errors else None,
        "input_file_id": record.input_file_id,
        "completion_window": record.completion_window,
        "status": status,
        "output_file_id": fin.output_file_id if fin else None,
        "error_file_id": fin.error_file_id if fin else None,
        "created_at": record.created_at,
        "in_progress_at": None if record.errors else record.created_at,
        "expires_at": record.expires_at,
        "finalizing_at": finished_at if progress is not None and not record.errors else None,
        "completed_at": terminal_at if status == "completed" else None,
        "failed_at": record.created_at if status == "failed" else None,
        "expired_at": moments.expired_at,
        "cancelling_at": moments.cancelling_at,
        "cancelled_at": terminal_at if status == "cancelled" else None,
        "request_counts": counts,
        "metadata": record.metadata,
        "usage": _batch_usage(fin) if fin is not None and not record.errors else None,
    }


def _batch_usage(fin: Finalized) -> dict[str, Any]:
    return {"input_tokens": fin.input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": fin.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": fin.input_tokens + fin.output_tokens}


def tokens(result: JobResult) -> tuple[int, int]:
    """Input and output tokens over all of a job's turns."""
    return sum(t.usage.input_tokens for t in result.turns), sum(t.usage.output_tokens for t in result.turns)


def _hex(job: Job) -> str:
    return job.id.removeprefix("job_")


def response_body(endpoint: str, model: str | None, job: Job, result: JobResult) -> dict[str, Any]:
    """I3. The body the endpoint would return, its text the (last) answer, plus `grounding`."""
    text = answer_text(result.turns[-1].answer)
    created = int(result.finished_at.timestamp())
    prompt, completion = tokens(result)
    grounding = result_grounding(result)
    if endpoint == RESPONSES:
        return {
            "id": f"resp_{_hex(job)}", "object": "response", "created_at": created, "status": "completed",
            "model": model, "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
            "output": [{"type": "message", "id": f"msg_{_hex(job)}", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}],
            "parallel_tool_calls": False, "temperature": None, "top_p": None, "tool_choice": "none", "tools": [],
            "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                      "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": prompt + completion},
            "grounding": grounding,
        }
    return {
        "id": f"chatcmpl-{_hex(job)}", "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": text, "refusal": None, "annotations": []}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        "system_fingerprint": None,
        "grounding": grounding,
    }


def request_line_id(job: Job) -> str:
    return f"batch_req_{_hex(job)}"


def output_line(endpoint: str, model: str | None, job: Job, result: JobResult | None) -> dict[str, Any] | None:
    if result is None or result.status != "succeeded" or not result.turns:
        return None
    return {"id": request_line_id(job), "custom_id": job.custom_id, "error": None,
            "response": {"status_code": 200, "request_id": job.id, "body": response_body(endpoint, model, job, result)}}


def error_line(job: Job, result: JobResult | None, *, expired: bool) -> dict[str, Any] | None:
    """A failed job answers 500 with its error; a job that never ran (cancelled, or stopped when the
    window expired) has no response, only the error code the Batch API uses for it."""
    base = {"id": request_line_id(job), "custom_id": job.custom_id}
    if result is None:
        code, why = ((EXPIRED_CODE, "the completion window expired before this request ran") if expired
                     else (CANCELLED_CODE, "the batch was cancelled before this request ran"))
        return {**base, "response": None, "error": {"code": code, "message": why}}
    if result.status == "succeeded" and result.turns:
        return None
    error = result.error
    message = error.message if error else "the job produced no answer"
    body = {"error": {"message": message, "type": error.type if error else "JobFailed", "param": None,
                      "code": "job_failed"}}
    return {**base, "error": None, "response": {"status_code": 500, "request_id": job.id, "body": body}}


def refusal_line(problem: BatchProblem) -> dict[str, Any]:
    """I2: a refused line in the error file, with its line number."""
    line_id = f"batch_req_line_{problem.line}" if problem.line else "batch_req_config"
    return {"id": line_id, "custom_id": problem.custom_id, "response": None,
            "error": {"code": problem.code, "message": problem.message, "line": problem.line, "param": problem.param}}


def encoded(line: Mapping[str, Any]) -> bytes:
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
