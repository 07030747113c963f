"""OpenAI Batch API compatibility: a JSONL file of `/v1/chat/completions` or `/v1/responses`
requests becomes a grounded batch, and its results come back as the output and error files the
official `openai` client reads, each answer's body carrying a `grounding` object.

The pure parts come first (lines in, status, objects and lines out); `OpenAIBatches` applies them
to the stores. Rules: the config is the operator's, named by `body.model` (I1); a file with any
refused line fails whole, with each refusal's line number (I2); output and error files are views
of the stored results (I3); the status is computed from the grounded batch when read (I4).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.jobs.lines import JobLineError
from worker.jobs.models import Job, JobResult
from worker.jobs.served import BrokenConfig, UnknownConfig
from worker.producer import NotFound, Producer
from worker.store.files import FileStore, FileView, StoredFile
from worker.store.openai_batches import BatchProblem, Finalized, Moments, OpenAIBatchRecord, OpenAIBatchStore
from worker.store.results import BatchProgress, new_id

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


def _tokens(result: JobResult) -> tuple[int, int]:
    return sum(t.usage.input_tokens for t in result.turns), sum(t.usage.output_tokens for t in result.turns)


def _hex(job: Job) -> str:
    return job.id.removeprefix("job_")


def response_body(endpoint: str, model: str | None, job: Job, result: JobResult) -> dict[str, Any]:
    """I3. The body the endpoint would return, its text the (last) answer, plus `grounding`."""
    text = answer_text(result.turns[-1].answer)
    created = int(result.finished_at.timestamp())
    prompt, completion = _tokens(result)
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


def view_file_id(batch_id: str, view: FileView) -> str:
    """Derived from the batch, so two API replicas finalizing one batch name the same files."""
    return f"file-{batch_id.removeprefix('batch_')}-{view}"


# --- the service -------------------------------------------------------------------------------------


@dataclass
class Rendered:
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    output_bytes: int = 0
    error_bytes: int = 0


class OpenAIBatches:
    """Files and batches for one deployment; every method takes the caller's tenant (I5)."""

    def __init__(self, producer: Producer, *, clock: Callable[[], float] = time.time) -> None:
        self.producer, self.clock = producer, clock
        self.files = FileStore(producer.store)
        self.batches = OpenAIBatchStore(producer.store)

    def _now(self) -> int:
        return int(self.clock())

    # --- files ---------------------------------------------------------------------------------

    def upload(self, tenant: str, *, filename: str, purpose: str, content: bytes) -> dict[str, Any]:
        if purpose != INPUT_PURPOSE:
            raise OpenAIRequestError(400, f"purpose {purpose!r} is not accepted here; upload batch input files "
                                          f"with purpose {INPUT_PURPOSE!r}", param="purpose")
        stored = self.files.upload(tenant=tenant, filename=filename, purpose=purpose, content=content, now=self._now())
        return file_object(stored)

    def file(self, tenant: str, file_id: str) -> StoredFile:
        stored = self.files.load(file_id)
        if stored is None or stored.tenant != tenant:
            raise not_found("file", file_id)
        return stored

    def file_content(self, tenant: str, file_id: str) -> Iterator[bytes]:
        stored = self.file(tenant, file_id)
        if stored.view_of is None:
            content = self.files.content(file_id)
            if content is None:
                raise not_found("file", file_id)
            return iter([content])
        loaded = self.batches.load(stored.view_of)
        assert loaded is not None, "a view's batch outlives it"
        record, moments = loaded
        assert stored.view is not None
        return self._view_lines(record, moments, stored.view)

    # --- batches -------------------------------------------------------------------------------

    def create(self, tenant: str, *, input_file_id: str, endpoint: str, completion_window: str,
               metadata: dict[str, str] | None) -> dict[str, Any]:
        if endpoint not in ENDPOINTS:
            raise OpenAIRequestError(400, f"endpoint {endpoint!r} is not served here; accepted: {', '.join(ENDPOINTS)}",
                                     param="endpoint")
        if completion_window not in COMPLETION_WINDOWS:
            raise OpenAIRequestError(400, f"completion_window {completion_window!r} is not accepted; accepted: "
                                          f"{', '.join(COMPLETION_WINDOWS)}", param="completion_window")
        _check_metadata(metadata)
        stored = self.file(tenant, input_file_id)
        if stored.purpose != INPUT_PURPOSE:
            raise OpenAIRequestError(400, f"file {input_file_id!r} has purpose {stored.purpose!r}; a batch reads a "
                                          f"file uploaded with purpose {INPUT_PURPOSE!r}", param="input_file_id")
        content = self.files.content(input_file_id)
        if content is None:
            raise not_found("file", input_file_id)
        adapted = adapt_lines(content.splitlines(), endpoint)
        problems = list(adapted.problems)
        config_name: str | None = None
        try:
            config_name, config = self.producer.served_config(adapted.model)
        except UnknownConfig as exc:
            problems += ([BatchProblem(code=LINE_CODE, line=n, param="body.model", message=str(exc),
                                       custom_id=adapted.custom_ids.get(n)) for n in adapted.model_lines]
                         or [BatchProblem(code=BATCH_CODE, message=str(exc))])
        except BrokenConfig as exc:
            raise OpenAIRequestError(503, str(exc)) from None
        report = self.producer.validate(adapted.lines, config) if config_name is not None else None
        if report is not None:
            problems += line_problems(report.errors, adapted.custom_ids)
        now = self._now()
        record = OpenAIBatchRecord(
            id=new_id("batch"), tenant=tenant, endpoint=endpoint, input_file_id=input_file_id,
            completion_window=completion_window, metadata=metadata, model=config_name or adapted.model,
            created_at=now, expires_at=now + COMPLETION_WINDOWS[completion_window], errors=capped(problems))
        if report is None or not report.ok or record.errors:
            return self._refuse(record)
        batch = self.producer.submit(report, tenant=tenant)
        record = record.model_copy(update={"id": batch.id})
        self.batches.create(record)
        return self._object(record)

    def _refuse(self, record: OpenAIBatchRecord) -> dict[str, Any]:
        """I2: failed at once, nothing enqueued; the error file lists every refusal."""
        self.batches.create(record)
        size = sum(len(encoded(refusal_line(p))) for p in record.errors)
        view = StoredFile(id=view_file_id(record.id, "errors"), tenant=record.tenant, filename=f"{record.id}_errors.jsonl",
                          purpose=OUTPUT_PURPOSE, bytes=size, created_at=record.created_at, view_of=record.id,
                          view="errors")
        self.files.add_view(view)
        self.batches.mark(record.id, "finalized", Finalized(at=record.created_at, completed=0, failed=0,
                                                            error_file_id=view.id))
        return self._object(record)

    def _load(self, tenant: str, batch_id: str) -> tuple[OpenAIBatchRecord, Moments]:
        loaded = self.batches.load(batch_id)
        if loaded is None or loaded[0].tenant != tenant:
            raise not_found("batch", batch_id)
        return loaded

    def retrieve(self, tenant: str, batch_id: str) -> dict[str, Any]:
        record, _ = self._load(tenant, batch_id)
        return self._object(record)

    def _moments(self, batch_id: str) -> Moments:
        loaded = self.batches.load(batch_id)
        assert loaded is not None, "a batch's record is read before its moments"
        return loaded[1]

    def _object(self, record: OpenAIBatchRecord) -> dict[str, Any]:
        """Reads the grounded batch and applies what happened since the last read (I4): a cancel made
        elsewhere, an expired window (the rest of the batch is cancelled), a finish (its files)."""
        if record.errors:
            return batch_object(record, self._moments(record.id), None)
        store = self.producer.store
        progress = store.progress(record.id)
        if progress is None:
            raise not_found("batch", record.id)
        moments = self._moments(record.id)
        if moments.finalized is None:
            now = self._now()
            if progress.cancel_requested and moments.cancelling_at is None and moments.expired_at is None:
                self.batches.mark(record.id, "cancelling_at", now)
            elif not progress.finished and not progress.cancel_requested and now >= record.expires_at:
                self.batches.mark(record.id, "expired_at", now)
                self.producer.cancel(record.id)
            if progress.finished:
                self._finalize(record, self._moments(record.id))
            moments, progress = self._moments(record.id), store.progress_of(record.id)
        finished = store.finished_at(record.id)
        return batch_object(record, moments, progress, finished_at=int(finished.timestamp()) if finished else None)

    def _finalize(self, record: OpenAIBatchRecord, moments: Moments) -> None:
        totals = Rendered()
        for job, result in self.producer.store.iter_jobs_with_results(record.id):
            out = output_line(record.endpoint, record.model, job, result)
            if out is not None:
                totals.completed += 1
                totals.output_bytes += len(encoded(out))
            err = error_line(job, result, expired=moments.expired_at is not None)
            if err is not None:
                totals.failed += 1
                totals.error_bytes += len(encoded(err))
            if result is not None:
                prompt, completion = _tokens(result)
                totals.input_tokens += prompt
                totals.output_tokens += completion
        now = self._now()
        ids: dict[FileView, str | None] = {"output": None, "errors": None}
        sizes: tuple[tuple[FileView, int], ...] = (("output", totals.output_bytes), ("errors", totals.error_bytes))
        for view, size in sizes:
            if size:
                stored = StoredFile(id=view_file_id(record.id, view), tenant=record.tenant,
                                    filename=f"{record.id}_{view}.jsonl", purpose=OUTPUT_PURPOSE, bytes=size,
                                    created_at=now, view_of=record.id, view=view)
                ids[view] = self.files.add_view(stored).id
        self.batches.mark(record.id, "finalized", Finalized(
            at=now, completed=totals.completed, failed=totals.failed, output_file_id=ids["output"],
            error_file_id=ids["errors"], input_tokens=totals.input_tokens, output_tokens=totals.output_tokens))

    def _view_lines(self, record: OpenAIBatchRecord, moments: Moments, view: FileView) -> Iterator[bytes]:
        """The same lines `_finalize` counted, rendered again from the stored results (I3)."""
        if record.errors:
            for problem in record.errors:
                yield encoded(refusal_line(problem))
            return
        expired = moments.expired_at is not None
        for job, result in self.producer.store.iter_jobs_with_results(record.id):
            line = (output_line(record.endpoint, record.model, job, result) if view == "output"
                    else error_line(job, result, expired=expired))
            if line is not None:
                yield encoded(line)

    def cancel(self, tenant: str, batch_id: str) -> dict[str, Any]:
        record, moments = self._load(tenant, batch_id)
        if not record.errors and moments.finalized is None:
            self.producer.cancel(batch_id)
            self.batches.mark(batch_id, "cancelling_at", self._now())
        return self._object(record)

    def page(self, tenant: str, *, after: str | None, limit: int) -> dict[str, Any]:
        try:
            ids, more = self.batches.page(tenant, after=after, limit=limit)
        except LookupError:
            raise OpenAIRequestError(400, f"after {after!r} is not one of this tenant's batches; pass the last id of "
                                          "the previous page", param="after") from None
        data = [self.retrieve(tenant, batch_id) for batch_id in ids]
        return {"object": "list", "data": data, "first_id": ids[0] if ids else None,
                "last_id": ids[-1] if ids else None, "has_more": more}


def _check_metadata(metadata: Mapping[str, Any] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_KEYS:
        raise OpenAIRequestError(400, f"metadata holds at most {MAX_METADATA_KEYS} keys, got {len(metadata)}",
                                 param="metadata")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise OpenAIRequestError(400, f"metadata[{key!r}]: keys are strings of at most {MAX_METADATA_KEY} "
                                          f"characters and values strings of at most {MAX_METADATA_VALUE}",
                                     param="metadata")
