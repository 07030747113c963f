"""Which question a run is working on (L1, L3, L13, L14), decided from the record and the history.

Pure functions: `for_run` gathers the loaded state, the history and the prompt, and applies what
these return. Only `record.in_progress` decides between a new question and a resumption; the
history's shape is used to compute an identity and to refuse an unmistakable resumption without a
recorded question, never to choose between the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.output import PendingModelResponse

from .ledger import CapabilityEvidenceRecord

NO_RECORDED_IDENTITY = "no recorded question identity"


def question_identity(messages: Sequence[ModelMessage], prompt: Any) -> int:
    """L1. The index of the question's opening request: a promptless history that ends in a
    request has that request sent as the question's first (F2), otherwise the framework appends
    one. Every participant derives the same number from the same history, with no shared counter."""
    if prompt is None and messages and isinstance(messages[-1], ModelRequest):
        return len(messages) - 1
    return len(messages)


def paused(output: Any) -> bool:
    """L6. A run that ends waiting for deferred tool results, or for a response its provider is still
    working on (a batch request, L16), has not finished its question: a later run resumes it."""
    return isinstance(output, DeferredToolRequests | PendingModelResponse)


def suspended(messages: Sequence[ModelMessage]) -> bool:
    """L16. The history ends in a response the provider is still working on (`state='suspended'`)."""
    return bool(messages) and isinstance(messages[-1], ModelResponse) and messages[-1].state == "suspended"


def awaits_model(messages: Sequence[ModelMessage]) -> bool:
    """L14. True only when the history cannot be a finished question: its last response issued
    tool calls or is still suspended at its provider (L16), or its last request carries a retry. A
    plain tool return is ambiguous (it can be a finished structured answer), so it does not count."""
    if not messages:
        return False
    last = messages[-1]
    if isinstance(last, ModelResponse):
        return last.state == "suspended" or any(isinstance(part, ToolCallPart) for part in last.parts)
    return any(
        isinstance(part, RetryPromptPart) or (isinstance(part, ToolReturnPart) and part.outcome == "retried")
        for part in last.parts
    )


def state_carried(record: CapabilityEvidenceRecord) -> bool:
    """L13. Only a record some run has established carries a question: a host-seeded default has
    `question: None`, so it cannot pass for a carried one."""
    return record.question is not None


def refuse_unrecorded_resumption(
    record: CapabilityEvidenceRecord, messages: Sequence[ModelMessage], namespace: str
) -> None:
    """L14. A guessed identity would attach the unfinished question's declarations to the wrong
    question with no visible error, so a resumption the record knows nothing about fails loudly."""
    if not record.in_progress and awaits_model(messages):
        raise RuntimeError(
            f"{namespace}: the history awaits the model but the state holds {NO_RECORDED_IDENTITY}; "
            f"carry deps.state[{namespace!r}] from the run that started this question"
        )
