"""What every interface shows of an answer: its text and what grounds it (citation status, the
cited chunks with their document and pages, redirects, violations), computed from a stored result.

One view for the MCP tools, the OpenAI Batch output lines and the chat, so a citation reads the
same wherever a user meets it.
"""

from __future__ import annotations

import json
from typing import Any

from worker.jobs.models import CitedChunk, JobResult, TurnResult


def answer_text(answer: Any) -> str:
    """A structured answer is shown as its JSON; interfaces that carry text need one string."""
    if answer is None:
        return ""
    return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)


def citation_view(cited: CitedChunk) -> dict[str, Any]:
    return {
        "document": cited.document_title or cited.document_uri,
        "document_id": cited.document_id,
        "document_uri": cited.document_uri,
        "page": cited.page_numbers[0] if cited.page_numbers else None,
        "pages": list(cited.page_numbers),
        "chunk_id": cited.chunk_id,
        "capability": cited.capability,
    }


def grounding_view(turn: TurnResult) -> dict[str, Any]:
    return {
        "citation_status": turn.citation_status,
        "citations": [citation_view(c) for c in turn.cited],
        "redirects": turn.redirects,
        "violations": int(turn.violation),
    }


def turn_view(turn: TurnResult) -> dict[str, Any]:
    return {"question": turn.question_text, "answer": answer_text(turn.answer), **grounding_view(turn)}


def result_grounding(result: JobResult) -> dict[str, Any]:
    """The last answer's grounding (the one a reply carries as its text); a conversation adds every
    turn's, in order, since each turn was a question of its own."""
    last = result.turns[-1]
    view: dict[str, Any] = {**grounding_view(last), "job_id": result.job_id,
                            "policy_registered": result.policy_registered,
                            "compactor_registered": result.compactor_registered}
    if len(result.turns) > 1:
        view["turns"] = [turn_view(t) for t in result.turns]
    return view


def result_view(result: JobResult) -> dict[str, Any]:
    """A finished job without its transcript: what a caller reads to use the answers."""
    return {
        "custom_id": result.custom_id,
        "job_id": result.job_id,
        "kind": result.kind,
        "conversation_id": result.conversation_id,
        "status": result.status,
        "error": result.error.model_dump() if result.error else None,
        "turns": [turn_view(t) for t in result.turns],
    }
