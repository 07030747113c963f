"""Synthetic stored results (H10) with known fields, built through the real ledger and real messages,
so evaluation tests (V6) recompute from exactly what a worker would have stored."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)

from capabilities.ledger import CapabilityEvidenceRecord, EvidenceRef
from capabilities.policy import POLICY_NAMESPACE, redirect_text
from capabilities.tags import TagSigner
from tests.harness import SIGNER, pc, ps
from worker.jobs.models import CitedChunk, JobError, JobResult, TurnResult

Status = Literal["grounded", "ungrounded", "missing"]
NOW = datetime(2026, 1, 1, tzinfo=UTC)
CHUNK_TEXT = "The service listens on port 8080 by default."


def ledger(status: Status) -> CapabilityEvidenceRecord:
    """Question 0: a search at epoch 2, then (unless missing) a cite at epoch 3."""
    record = CapabilityEvidenceRecord()
    record.begin_question(0)
    record.note_evidence(2)
    if status != "missing":
        refs = [EvidenceRef(capability="passages", chunk_id="c-1")] if status == "grounded" else []
        record.declare(refs, epoch=3, retrieved_now=["c-1"])
    record.end_question()
    return record


def stored(
    custom_id: str,
    *,
    answerable: bool | None,
    status: Status = "grounded",
    answer: str = "It listens on port 8080.",
    redirects: int = 0,
    stored_redirects: int | None = None,
    violation: bool = False,
    policy: bool = True,
    n_requests: int = 3,
    failed: bool = False,
    signer: TagSigner = SIGNER,
    reference_answer: str | None = "port 8080",
    stored_status: Status | None = None,
    batch_id: str = "batch-1",
) -> JobResult:
    question = f"question {custom_id}?"
    messages: list[Any] = [
        ModelRequest(parts=[UserPromptPart(question)]),
        ModelResponse(parts=[ps("port")]),
    ]
    if status != "missing":
        messages.append(ModelResponse(parts=[pc(*(["c-1"] if status == "grounded" else []))]))
    for _ in range(redirects):
        messages += [
            ModelResponse(parts=[TextPart(answer)]),
            ModelRequest(parts=[UserPromptPart(redirect_text(["passages_cite"], None, 0, signer=signer))]),
        ]
    messages.append(ModelResponse(parts=[TextPart(answer)]))
    state: dict[str, Any] = {
        "passages": {"citation_index": {}, "citations": [], "document_filter": None, "working_set": {},
                     "evidence": ledger(status).model_dump(mode="json")},
    }
    if policy:
        state[POLICY_NAMESPACE] = {"violations": [0] if violation else []}
    metadata: dict[str, Any] = {}
    if answerable is not None:
        metadata["answerable"] = answerable
        if answerable and reference_answer:
            metadata["reference_answer"] = reference_answer
            metadata["gold_documents"] = ["handbook.md"]
    turn = TurnResult(
        question_identity=0,
        question_text=question,
        answer=answer,
        citation_status=stored_status or status,
        declared_refs=[{"capability": "passages", "chunk_id": "c-1"}] if status == "grounded" else [],
        cited=[CitedChunk(capability="passages", chunk_id="c-1", document_uri="handbook.md",
                          document_title="Handbook", content=CHUNK_TEXT, retrieved_this_question=True)]
        if status == "grounded" else [],
        redirects=redirects if stored_redirects is None else stored_redirects,
        violation=violation,
        n_requests=n_requests,
        new_messages_json=ModelMessagesTypeAdapter.dump_json(messages),
    )
    return JobResult(
        job_id=f"job-{batch_id}-{custom_id}",
        batch_id=batch_id,
        custom_id=custom_id,
        kind="question",
        metadata=metadata,
        status="failed" if failed else "succeeded",
        error=JobError(type="ModelHTTPError", message="status_code: 400") if failed else None,
        model="scripted",
        policy_registered=policy,
        turns=[] if failed else [turn],
        state_after={} if failed else state,
        started_at=NOW,
        finished_at=NOW,
    )


def synthetic_arm(batch_id: str = "batch-1", *, signer: TagSigner = SIGNER) -> list[JobResult]:
    """The V6 set: five results with known fields, one of them failed."""
    return [
        stored("u1", answerable=False, status="ungrounded", answer="The answer was not found in the knowledge base.",
               n_requests=3, batch_id=batch_id),
        stored("u2", answerable=False, status="grounded", answer="It listens on port 8080.", n_requests=3,
               batch_id=batch_id),
        stored("u3", answerable=False, status="missing", answer="Probably on Tuesdays.", redirects=1, violation=True,
               n_requests=5, batch_id=batch_id, signer=signer),
        stored("a1", answerable=True, status="grounded", answer="The service listens on port 8080.", n_requests=3,
               batch_id=batch_id),
        stored("a2", answerable=True, failed=True, batch_id=batch_id),
    ]


def synthetic_off_arm(batch_id: str = "off-1", *, signer: TagSigner = SIGNER) -> list[JobResult]:
    """The same questions without the policy: no redirect, no violation, and no policy state."""
    return [
        stored("u1", answerable=False, status="ungrounded", answer="The answer was not found in the knowledge base.",
               policy=False, batch_id=batch_id, signer=signer),
        stored("u2", answerable=False, status="grounded", answer="It listens on port 8080.", policy=False,
               batch_id=batch_id, signer=signer),
        stored("u3", answerable=False, status="missing", answer="Probably on Tuesdays.", policy=False,
               batch_id=batch_id, signer=signer),
        stored("a1", answerable=True, status="grounded", answer="The service listens on port 8080.", policy=False,
               batch_id=batch_id, signer=signer),
        stored("a2", answerable=True, failed=True, policy=False, batch_id=batch_id, signer=signer),
    ]
