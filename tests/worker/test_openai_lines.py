"""The pure core of the OpenAI Batch compatibility: lines in, the status, and the lines out, checked
against the official client's own types (no server, no Redis)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from openai.types import Batch
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from worker.interfaces.openai_format import (
    CHAT,
    RESPONSES,
    adapt_lines,
    batch_object,
    error_line,
    output_line,
    refusal_line,
    status_of,
)
from worker.jobs.lines import parse_batch
from worker.jobs.models import CitedChunk, Job, JobError, JobResult, TurnResult, Usage
from worker.store.openai_batches import BatchProblem, Finalized, Moments, OpenAIBatchRecord
from worker.store.results import BatchProgress

NOW = 1_800_000_000
CONFIG = {"agent": {"model": "extractive", "capabilities": [{"PassageSearchCapability": {"corpus": "handbook"}}]}}


def record(**extra: object) -> OpenAIBatchRecord:
    return OpenAIBatchRecord(id="batch_1", tenant="acme", endpoint=CHAT, input_file_id="file-1",
                             completion_window="24h", model="handbook-qa", created_at=NOW,
                             expires_at=NOW + 86_400, **extra)  # type: ignore[arg-type]


def progress(*, finished: bool = False, cancel: bool = False, succeeded: int = 0, failed: int = 0) -> BatchProgress:
    return BatchProgress(batch_id="batch_1", tenant="acme", total=3, queued=3 - succeeded - failed, running=0,
                         succeeded=succeeded, failed=failed, cancelled=0, cancel_requested=cancel,
                         finished=finished, created_at=datetime.now(UTC))


FINAL = Finalized(at=NOW + 60, completed=2, failed=1, output_file_id="file-o", error_file_id="file-e")


@pytest.mark.parametrize(
    ("moments", "state", "expected"),
    [
        (Moments(), progress(), "in_progress"),
        (Moments(cancelling_at=NOW), progress(cancel=True), "cancelling"),
        (Moments(), progress(finished=True, succeeded=3), "finalizing"),
        (Moments(expired_at=NOW), progress(cancel=True), "finalizing"),
        (Moments(finalized=FINAL), progress(finished=True, succeeded=2, failed=1), "completed"),
        (Moments(cancelling_at=NOW, finalized=FINAL), progress(finished=True, cancel=True), "cancelled"),
        (Moments(expired_at=NOW, finalized=FINAL), progress(finished=True, cancel=True), "expired"),
    ],
)
def test_I4_status_follows_the_grounded_batch(moments: Moments, state: BatchProgress, expected: str) -> None:
    assert status_of(record(), moments, state) == expected
    parsed = Batch.model_validate(batch_object(record(), moments, state, finished_at=NOW + 30))
    assert parsed.status == expected and parsed.request_counts is not None and parsed.request_counts.total == 3


def test_I2_a_refused_batch_is_failed_with_its_problems() -> None:
    refused = record(errors=[BatchProblem(code="invalid_request", line=4, message="custom_id is required")])
    parsed = Batch.model_validate(batch_object(refused, Moments(), None))
    assert parsed.status == "failed" and parsed.failed_at == NOW and parsed.in_progress_at is None
    assert parsed.errors is not None and parsed.errors.data is not None
    assert [(e.line, e.message) for e in parsed.errors.data] == [(4, "custom_id is required")]
    assert refusal_line(refused.errors[0])["error"] == {"code": "invalid_request", "message": "custom_id is required",
                                                        "line": 4, "param": None}


def lines(*objects: object) -> list[bytes]:
    return [json.dumps(o).encode() if not isinstance(o, bytes) else o for o in objects]


def test_I1_adapted_lines_keep_their_numbers_and_name_one_config() -> None:
    adapted = adapt_lines(lines(
        {"custom_id": "a", "url": CHAT, "body": {"model": "qa", "messages": [{"role": "user", "content": "q"}]}},
        b"",
        b"{broken",
        {"custom_id": "b", "url": CHAT, "body": {"model": "other", "messages": [{"role": "user", "content": "q"}]}},
        {"custom_id": "c", "url": "/v1/embeddings", "body": {"messages": [{"role": "user", "content": "q"}]}},
    ), CHAT)
    assert adapted.model == "qa" and adapted.model_lines == [1]
    assert [(p.line, p.param) for p in adapted.problems] == [(4, "body.model"), (5, "url")]
    assert adapted.custom_ids == {1: "a", 4: "b", 5: "c"}
    report = parse_batch(adapted.lines, CONFIG)
    assert [e.line_no for e in report.errors] == [3]  # parse_batch numbers the same lines
    assert report.jobs[0].metadata == {"requested_model": "qa"}


def test_responses_input_reads_as_chat_messages_and_other_keys_are_refused_by_parse_line() -> None:
    adapted = adapt_lines(lines(
        {"custom_id": "s", "url": RESPONSES, "body": {"input": "one question"}},
        {"custom_id": "l", "url": RESPONSES, "body": {"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "first"}]},
            {"role": "user", "content": "second"}]}},
        {"custom_id": "t", "url": RESPONSES, "body": {"input": "q", "instructions": "be terse"}},
        {"custom_id": "f", "url": RESPONSES, "body": {"input": [{"type": "function_call_output", "output": "x"}]}},
        {"custom_id": "n", "url": RESPONSES, "body": {"model": "qa"}},
    ), RESPONSES)
    assert [(p.line, p.param) for p in adapted.problems] == [(5, "body.input")]
    report = parse_batch(adapted.lines, CONFIG)
    assert [(j.custom_id, j.kind, j.prompts()) for j in report.jobs] == [
        ("s", "question", ["one question"]), ("l", "conversation", ["first", "second"])]
    problems = {e.line_no: e.problem for e in report.errors}
    assert "['instructions'] are not accepted" in problems[3]
    assert "tool calls and tool results are not accepted" in problems[4]


def job(custom_id: str = "q1") -> Job:
    return Job(id="job_abc", batch_id="batch_1", line_no=1, custom_id=custom_id, kind="question", question="q")


def result(status: str = "succeeded") -> JobResult:
    cited = CitedChunk(capability="passages", chunk_id="c-1", document_id="d-1", document_uri="file://h.md",
                       document_title="Handbook", content="x", page_numbers=[2, 3])
    turn = TurnResult(question_identity=0, question_text="q", answer="the answer", citation_status="grounded",
                      cited=[cited], redirects=1, usage=Usage(input_tokens=10, output_tokens=4))
    now = datetime.fromtimestamp(NOW, UTC)
    return JobResult(job_id="job_abc", batch_id="batch_1", custom_id="q1", kind="question", model="extractive",
                     status=status, turns=[turn] if status == "succeeded" else [],  # type: ignore[arg-type]
                     error=None if status == "succeeded" else JobError(type="ModelHTTPError", message="boom"),
                     started_at=now, finished_at=now)


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_I3_output_lines_parse_as_the_endpoints_bodies_with_grounding(endpoint: str) -> None:
    line = output_line(endpoint, "handbook-qa", job(), result())
    assert line is not None and line["custom_id"] == "q1" and line["response"]["status_code"] == 200
    body = line["response"]["body"]
    if endpoint == CHAT:
        parsed = ChatCompletion.model_validate(body)
        assert parsed.choices[0].message.content == "the answer" and parsed.usage and parsed.usage.total_tokens == 14
    else:
        assert Response.model_validate(body).output_text == "the answer"
    assert body["grounding"]["citations"] == [{"document": "Handbook", "document_id": "d-1", "document_uri": "file://h.md",
                                              "page": 2, "pages": [2, 3], "chunk_id": "c-1", "capability": "passages"}]
    assert body["grounding"]["citation_status"] == "grounded" and body["grounding"]["redirects"] == 1
    assert error_line(job(), result(), expired=False) is None


def test_I3_error_lines_for_failed_cancelled_and_expired_requests() -> None:
    failed = error_line(job(), result("failed"), expired=False)
    assert failed is not None and failed["error"] is None and failed["response"]["status_code"] == 500
    assert failed["response"]["body"]["error"]["message"] == "boom"
    assert output_line(CHAT, "m", job(), result("failed")) is None
    cancelled, expired = error_line(job(), None, expired=False), error_line(job(), None, expired=True)
    assert cancelled and expired and cancelled["response"] is None
    assert (cancelled["error"]["code"], expired["error"]["code"]) == ("batch_cancelled", "batch_expired")
