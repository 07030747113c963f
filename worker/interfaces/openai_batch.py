"""OpenAI Batch API compatibility: a JSONL file of `/v1/chat/completions` or `/v1/responses`
requests becomes a grounded batch, and its results come back as the output and error files the
official `openai` client reads, each answer's body carrying a `grounding` object.

`OpenAIBatches` applies the pure shapes of `openai_format` to the stores. Rules: the config is the
operator's, named by `body.model` (I1); a file with any refused line fails whole, with each
refusal's line number (I2); output and error files are views of the stored results (I3); the
status is computed from the grounded batch when read (I4).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from worker.jobs.served import BrokenConfig, UnknownConfig
from worker.producer import Producer
from worker.store.files import FileStore, FileView, StoredFile, view_file_id
from worker.store.openai_batches import BatchProblem, Finalized, Moments, OpenAIBatchRecord, OpenAIBatchStore
from worker.store.results import new_id

from .openai_format import (
    BATCH_CODE,
    COMPLETION_WINDOWS,
    ENDPOINTS,
    INPUT_PURPOSE,
    LINE_CODE,
    MAX_METADATA_KEY,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE,
    OUTPUT_PURPOSE,
    OpenAIRequestError,
    adapt_lines,
    batch_object,
    capped,
    encoded,
    error_line,
    file_object,
    line_problems,
    not_found,
    output_line,
    refusal_line,
    tokens,
)


@dataclass
class Rendered:
    """What finalizing counts while it renders both files once: their sizes, and the batch's totals."""

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
        report = self.producer.validate(adapted.lines, config, tenant=tenant) if config_name is not None else None
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
                prompt, completion = tokens(result)
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
