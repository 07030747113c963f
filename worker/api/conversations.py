"""`/v1/conversations`: follow-up turns on a stored conversation, and its turns so far.

A follow-up carries the user's question and nothing else the agent would read: history, tool calls
and evidence state are the server's, so a client can neither forge evidence nor rewind a ledger.
Conversations are tenant-scoped like batches: another tenant's conversation is a 404.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from starlette.concurrency import run_in_threadpool

from worker.jobs.lines import JobLineError
from worker.jobs.models import Job
from worker.store.conversations import (
    CompositionMismatch,
    ConversationMeta,
    ConversationNotFound,
    ConversationStore,
    StoredTurn,
)
from worker.store.results import ResultsStore

from .deps import CallerDep, ProducerDep

FOLLOW_UP_KEYS = ("question", "config", "custom_id", "metadata")
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such conversation for this token's tenant"}}

conversations = APIRouter(prefix="/v1/conversations", tags=["conversations"])


def _reject(problem: str) -> HTTPException:
    return HTTPException(422, problem)


async def _follow_up_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        raise _reject(f"body: {exc}") from None
    if not isinstance(body, dict):
        raise _reject("body must be a JSON object with `question`")
    unknown = sorted(set(body) - set(FOLLOW_UP_KEYS))
    if unknown:
        raise _reject(
            f"keys {unknown} are not accepted: a follow-up sends only the user's `question` (and optionally "
            "`config`, `custom_id`, `metadata`); history, tool calls, tool results and evidence state are kept "
            "by the server and never taken from a client"
        )
    return body


@conversations.post(
    "/{conversation_id}/turns",
    status_code=status.HTTP_202_ACCEPTED,
    responses={**_NOT_FOUND, 409: {"description": "the config's composition differs from the conversation's (H3)"},
               422: {"description": "the question or config is not acceptable; nothing was enqueued"}},
)
async def add_turn(conversation_id: str, request: Request, producer: ProducerDep, caller: CallerDep) -> dict[str, Any]:
    """Queues one more user turn. It runs after every earlier job of the conversation, with the
    conversation's stored history, state and composition."""
    body = await _follow_up_body(request)
    question: Any = body.get("question")  # parse_batch checks it, as it checks every line
    try:
        job: Job = await run_in_threadpool(
            producer.follow_up, conversation_id, question, tenant=caller.tenant,
            config=body.get("config"), custom_id=body.get("custom_id"), metadata=body.get("metadata"),
        )
    except ConversationNotFound as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    except CompositionMismatch as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except JobLineError as exc:
        raise _reject(exc.problem) from None
    return {"conversation_id": conversation_id, "job_id": job.id, "batch_id": job.batch_id, "state": "queued"}


def _committed(turn: StoredTurn, kind: str, *, wire: bool) -> dict[str, Any]:
    exclude = {"new_messages_json"} if wire else {"new_messages_json", "wire"}
    result = turn.result.model_dump(mode="json", exclude=exclude)
    return {"job_id": turn.job_id, "custom_id": turn.custom_id, "kind": kind, "status": "succeeded",
            "question": result.pop("question_text"), **result}


def conversation_view(results: ResultsStore, store: ConversationStore, meta: ConversationMeta, *,
                      wire: bool = False) -> dict[str, Any]:
    """Every turn in the order it runs: committed ones with their answers and citations, then those
    still queued, running, failed or cancelled, with their job's state."""
    version, length = store.summary(meta.id)
    committed: dict[str, list[StoredTurn]] = {}
    for turn in store.turns(meta.id):
        committed.setdefault(turn.job_id, []).append(turn)
    turns: list[dict[str, Any]] = []
    for job_id in store.job_ids(meta.id):
        job = results.load_job(job_id)
        done = committed.get(job_id, [])
        if job is None:  # its batch expired or was deleted (H16); what it committed is the conversation's
            turns += [_committed(turn, "conversation" if job_id == meta.id else "follow_up", wire=wire)
                      for turn in done]
            continue
        turns += [_committed(turn, job.kind, wire=wire) for turn in done]
        pending = job.prompts()[len(done):]
        if pending:
            state = results.job_state(job)
            result = results.load_result(job.id) if state == "failed" else None
            error = result.error.model_dump() if result is not None and result.error is not None else None
            turns += [{"job_id": job.id, "custom_id": job.custom_id, "kind": job.kind, "status": state,
                       "question": question, "error": error} for question in pending]
    return {
        "id": meta.id,
        "created_at": meta.created_at.isoformat(),
        "model": meta.config.model,
        "composition": meta.composition.model_dump(),
        "version": version,
        "history_length": length,
        "turns": [{"turn": n, **turn} for n, turn in enumerate(turns, start=1)],
    }


@conversations.get("/{conversation_id}", responses=_NOT_FOUND)
def get_conversation(conversation_id: str, producer: ProducerDep, caller: CallerDep,
                     wire: bool = False) -> dict[str, Any]:
    """`wire=true` adds each turn's requests as the model saw them (after compaction)."""
    meta = producer.conversations.load_meta(conversation_id)
    if meta is None or meta.tenant != caller.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"conversation {conversation_id!r} not found")
    return conversation_view(producer.store, producer.conversations, meta, wire=wire)
