"""H10: what one answered question becomes in a job result, computed from the committed state and
the run's new messages alone (pure: evaluation recomputes the same numbers from stored results)."""

from __future__ import annotations

import base64
import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
)

from capabilities import (
    POLICY_NAMESPACE,
    CapabilityEvidenceRecord,
    CitationPolicyState,
    TagSigner,
    citation_status,
    declared_refs,
    redirects_delivered,
)
from worker.jobs.models import CitedChunk, TurnResult, Usage


def records_of(state: Mapping[str, Any], namespaces: Sequence[str]) -> list[tuple[str, CapabilityEvidenceRecord]]:
    """Each registered evidence capability's ledger, as committed (a namespace never used has none)."""
    out = []
    for namespace in namespaces:
        evidence = (state.get(namespace) or {}).get("evidence")
        if evidence is not None:
            out.append((namespace, CapabilityEvidenceRecord.model_validate(evidence)))
    return out


def question_identity(records: Sequence[tuple[str, CapabilityEvidenceRecord]], history_length: int) -> int:
    """L1: the records agree on it (L2); with no evidence capability it is where the prompt landed."""
    identities = {record.question for _, record in records if record.question is not None}
    if len(identities) > 1:
        raise RuntimeError(f"evidence records disagree on the question: {sorted(identities)}")
    return identities.pop() if identities else history_length


def _cited(
    state: Mapping[str, Any], namespace: str, chunk_id: str, record: CapabilityEvidenceRecord, q: int
) -> CitedChunk:
    index = (state.get(namespace) or {}).get("citation_index") or {}
    citation: dict[str, Any] = index.get(chunk_id) or next((c for c in index.values() if c.get("chunk_id") == chunk_id), {})
    occurrence = record.occurrences.get(chunk_id)
    return CitedChunk(
        capability=namespace,
        chunk_id=chunk_id,
        document_id=citation.get("document_id"),
        document_uri=citation.get("document_uri"),
        document_title=citation.get("document_title"),
        content=citation.get("content", ""),
        page_numbers=list(citation.get("page_numbers") or []),
        headings=list(citation.get("headings") or []),
        retrieved_this_question=occurrence is not None and q in occurrence.retrieved_in_questions,
    )


def recorded_violation(state: Mapping[str, Any], question: int) -> bool:
    """P12: a violation lives in the policy's own state; no policy key means no policy ran."""
    raw = state.get(POLICY_NAMESPACE)
    return raw is not None and question in CitationPolicyState.model_validate(raw).violations


def _digest_binaries(value: Any) -> Any:
    """Picture bytes become their digest: a transcript should show which picture was sent, and
    the bytes already live in the corpus (and in the history a conversation keeps)."""
    if isinstance(value, list):
        return [_digest_binaries(v) for v in value]
    if isinstance(value, dict):
        if value.get("kind") == "binary" and isinstance(value.get("data"), str):
            encoded = value["data"]
            data = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))  # pydantic's bytes encoding
            rest = {k: v for k, v in value.items() if k != "data"}
            return {**rest, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        return {k: _digest_binaries(v) for k, v in value.items()}
    return value


def wire_json(requests: Sequence[Sequence[ModelMessage]]) -> list[list[dict[str, Any]]]:
    """Each request of a run resends the messages before it, so a message is dumped (and its
    pictures digested) once, however many requests carried it."""
    dumped: dict[int, dict[str, Any]] = {}

    def once(message: ModelMessage) -> dict[str, Any]:
        key = id(message)  # every message is alive in `requests` while this runs
        if key not in dumped:
            dumped[key] = _digest_binaries(ModelMessagesTypeAdapter.dump_python([message], mode="json")[0])
        return dumped[key]

    return [[once(m) for m in r] for r in requests]


def summarize_turn(
    *,
    question_text: str,
    history_length: int,
    output: Any,
    new_messages: Sequence[ModelMessage],
    state: Mapping[str, Any],
    namespaces: Sequence[str],
    signer: TagSigner,
    conversation_id: str | None,
    usage: Usage,
    wire: Sequence[Sequence[ModelMessage]],
) -> TurnResult:
    records = records_of(state, namespaces)
    q = question_identity(records, history_length)
    ledgers = [record for _, record in records]
    refs = declared_refs(ledgers, question=q)
    by_namespace = dict(records)
    parts = [p for m in new_messages for p in m.parts]
    returns = [p for p in parts if isinstance(p, ToolReturnPart)]
    answer = output.model_dump(mode="json") if hasattr(output, "model_dump") else output
    return TurnResult(
        question_identity=q,
        question_text=question_text,
        answer=answer,
        citation_status=citation_status(ledgers, question=q),
        declared_refs=[{"capability": r.capability, "chunk_id": r.chunk_id} for r in refs],
        cited=[
            _cited(state, r.capability, r.chunk_id, by_namespace.get(r.capability, CapabilityEvidenceRecord()), q)
            for r in refs
        ],
        redirects=redirects_delivered(new_messages, signer, conversation_id, q),
        violation=recorded_violation(state, q),
        n_requests=sum(isinstance(m, ModelResponse) for m in new_messages),
        tool_calls=dict(Counter(p.tool_name for p in parts if isinstance(p, ToolCallPart))),
        failed_tool_returns=sum(p.outcome == "failed" for p in returns),
        retried_tool_returns=sum(p.outcome == "retried" for p in returns)
        + sum(isinstance(p, RetryPromptPart) for p in parts),
        usage=usage,
        wire=wire_json(wire),
        new_messages_json=ModelMessagesTypeAdapter.dump_json(list(new_messages)),
    )
