"""Provider batch mode on the worker (H17): a question's model requests go through the provider's
batch API, and the job lets go of its worker slot while the provider works.

pydantic-ai 2.68 does the batching: `BatchModelRequests` queues the requests made through one
instance on one event loop and submits them together, and with `PendingModelResponse` among the
output types a run ends as soon as its request is submitted, its history ending in a suspended
response that carries the batch ticket. What this module adds is the worker's side:

- one `BatchModelRequests` per worker process (`ProviderBatching`), registered on every batch-mode
  run of that process, so the same step of concurrent jobs lands in one provider batch;
- a suspended run is checkpointed in Redis (history and state together, like a commit, H4) and
  raises `RunSuspended`, which the task turns into a later delivery on the poll schedule;
- a later run, on any worker, resumes from that checkpoint with no prompt: pydantic-ai checks the
  same batch instead of submitting again, and the run either suspends again (next round) or ends;
- an abandoned request (its batch was cancelled by the user) is recorded, and the provider batch is
  cancelled once all of its requests are.

Each agent step is one provider round trip, so a question that searches, cites and answers takes
three rounds, each waiting up to the provider's batch window.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog
from pydantic import TypeAdapter
from pydantic_ai.capabilities import BatchModelRequests
from pydantic_ai.exceptions import ModelAPIError
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import Model
from pydantic_ai.models.batch import Batch as ProviderBatch
from pydantic_ai.models.batch import BatchRequest, EncodedBatchRequest
from pydantic_ai.output import PendingModelResponse
from pydantic_ai.run import AgentRunResult
from pydantic_ai.usage import UsageLimits

from capabilities import Deps, TagSigner
from worker.jobs.allowlist import ModelUnavailable
from worker.jobs.models import Job, TurnResult, Usage
from worker.settings import Settings
from worker.store.provider_batches import PendingRound, ProviderBatchStore

from .agents import BuiltAgent
from .llms import WireRecorder, sdk_retry_settings
from .turns import summarize_turn

TICKET = "batch"  # where pydantic-ai keeps a batch request's ticket in `provider_details` (F21)
BATCH_PROCESSING = "batch"  # `provider_details['processing']` of a response a batch produced (F21)
_HANDLE = TypeAdapter(ProviderBatch)

log = structlog.get_logger()

# Set by the task around starting a batch-mode job's run: called (on the loop) when the run hands a
# request to the batching queue, so the task can let go of its slot while the run waits (H17.2)
QUEUED: ContextVar[Callable[[], None] | None] = ContextVar("grounded_batch_request_queued", default=None)


class _Queueing(WireRecorder):
    """Records each request as sent and says when one joins the batching queue."""

    async def batch_encode(self, request: BatchRequest) -> EncodedBatchRequest:
        encoded = await super().batch_encode(request)
        if (queued := QUEUED.get()) is not None:
            queued()
        return encoded


class RunSuspended(Exception):  # noqa: N818 - not an error: the job waits on its provider
    """The run's request is in a provider batch and its checkpoint is saved: the job comes back
    after `delay_s` (the poll schedule), on whichever worker takes it."""

    def __init__(self, pending: PendingRound, delay_s: float) -> None:
        super().__init__(f"waiting on provider batch {pending.provider_batch} (round {pending.round}); "
                         f"next check in {delay_s:.1f} s")
        self.pending = pending
        self.delay_s = delay_s


class BatchRequestFailed(ModelAPIError):
    """H17: a request that failed in its provider batch after pydantic-ai's resubmissions (expired,
    rate-limited or failed ones are sent again in a new batch, up to GROUNDED_BATCH_MAX_RESUBMISSIONS).
    It is this job's error, final: re-running the job would only read the same result again."""

    def __init__(self, provider_batch: str, cause: ModelAPIError) -> None:
        super().__init__(cause.model_name, f"the request in provider batch {provider_batch} failed: "
                                           f"{type(cause).__name__}: {cause.message}")


@dataclass
class ProviderBatching:
    """What a worker process lends its batch-mode jobs: one batching capability, shared by all of
    them, and the store their checkpoints live in."""

    capability: BatchModelRequests
    store: ProviderBatchStore

    @classmethod
    def from_settings(cls, settings: Settings, store: ProviderBatchStore) -> ProviderBatching:
        capability = BatchModelRequests(
            max_requests=settings.batch_max_requests,
            max_wait=timedelta(seconds=settings.batch_max_wait_s),
            max_resubmissions=settings.batch_max_resubmissions,
            poll_interval=timedelta(seconds=settings.batch_poll_s),
            max_poll_interval=timedelta(seconds=settings.batch_max_poll_s),
        )
        return cls(capability, store)

    def batched(self, model: Model) -> Model:
        """The model as batching serves it; refuses a model without a batch API (a permanent job error)."""
        try:
            wrapped = self.capability.get_wrapper_model(model)
        except Exception as exc:  # pydantic-ai's UserError names the model that has no batch API
            raise ModelUnavailable(f"run.batch: {exc}") from None
        return wrapped or model

    async def cancel_if_abandoned(self, job: Job, pending: PendingRound, model: Model) -> bool:
        """H17: records the job's request as abandoned; the last abandoned request of a provider batch
        cancels the batch (best effort: the batch is already paid for what it ran)."""
        handle = await asyncio.to_thread(self.store.abandon, job, pending)
        if handle is None:
            return False
        try:
            await model.batch_cancel(_HANDLE.validate_python(handle))
        except Exception as exc:  # the job is cancelled either way; the provider expires what it keeps
            log.warning("provider_batch_not_cancelled", provider_batch=pending.provider_batch,
                        error=f"{type(exc).__name__}: {exc}")
            return False
        await asyncio.to_thread(self.store.note_cancelled, job, pending.provider_batch)
        return True


def ticket_of(response: ModelResponse) -> dict[str, Any] | None:
    """The batch ticket of a response: pending (`custom_id`, `batch` handle, `polls`) or, once the
    result arrived, what it came from (`id`, `custom_id`)."""
    details = response.provider_details or {}
    ticket = details.get(TICKET)
    return ticket if isinstance(ticket, dict) else None


def provider_batch_ids(messages: Iterable[ModelMessage]) -> list[str]:
    """Every provider batch the responses came from or wait on, in order, each once."""
    seen: dict[str, None] = {}
    for message in messages:
        if isinstance(message, ModelResponse) and (ticket := ticket_of(message)) is not None:
            batch = ticket.get("batch")
            batch_id = batch.get("id") if isinstance(batch, dict) else ticket.get("id")
            if isinstance(batch_id, str):
                seen.setdefault(batch_id)
    return list(seen)


def rounds_of(messages: Iterable[ModelMessage]) -> int:
    """Provider round trips that brought a response back."""
    return sum(1 for m in messages if isinstance(m, ModelResponse) and m.state != "suspended"
               and (m.provider_details or {}).get("processing") == BATCH_PROCESSING)


def job_messages(turns: Sequence[TurnResult]) -> list[ModelMessage]:
    return [m for turn in turns for m in ModelMessagesTypeAdapter.validate_json(turn.new_messages_json)]


def usage_of(messages: Iterable[ModelMessage]) -> Usage:
    """A resumed run's own usage leaves out the rounds before it, so a batched question's usage is
    summed from its responses."""
    responses = [m for m in messages if isinstance(m, ModelResponse)]
    return Usage(input_tokens=sum(m.usage.input_tokens for m in responses),
                 output_tokens=sum(m.usage.output_tokens for m in responses))


_UNPRICED: set[tuple[str | None, str | None, str | None]] = set()
"""(provider, model, provider url) that genai-prices has no price for. Its prices are a snapshot
loaded once per process, so an unknown model stays unknown; a local server's model is asked about
with every job, and each failed lookup cost about 30 µs a response."""


def cost_usd(messages: Iterable[ModelMessage]) -> float | None:
    """What the responses cost by genai-prices, at batch prices for batch results (pydantic-ai marks
    them `processing: batch`); None when any response's model or provider has no known price."""
    total = 0.0
    for message in messages:
        if not isinstance(message, ModelResponse) or message.state == "suspended":
            continue
        model = (message.provider_name, message.model_name, message.provider_url)
        if model in _UNPRICED:
            return None
        try:
            total += float(message.cost().total_price)
        except LookupError:  # an unknown model or provider: a local server, a new model
            _UNPRICED.add(model)
            return None
        except Exception:  # a response without usage
            return None
    return total


def batch_report(batch_mode: bool, turns: Sequence[TurnResult]) -> dict[str, Any]:
    """The result's processing fields (H17): how the job was processed, the provider batches its
    requests went through, the round trips, its usage and an estimated cost."""
    messages = job_messages(turns)
    return {
        "processing": BATCH_PROCESSING if batch_mode else "live",
        "provider_batches": provider_batch_ids(messages),
        "rounds": rounds_of(messages),
        "usage": usage_of(messages),
        "cost_usd": cost_usd(messages),
    }


CHECK_SLACK_S = 0.25  # a delivery this close to its batch's next check runs it rather than waiting again


async def _unless_checked_lately(batching: ProviderBatching, job: Job, pending: PendingRound) -> None:
    """Another job waiting on the same provider batch checked it recently and found it running: this
    delivery waits for that batch's next check without running anything (no history loaded into a
    run, no status request), so a batch's jobs are checked together, and resume together once it
    ended, which keeps their next step in one batch too."""
    next_check = await asyncio.to_thread(batching.store.next_check, pending.provider_batch)
    if next_check is not None and (wait_s := next_check - time.time()) > CHECK_SLACK_S:
        await asyncio.to_thread(batching.store.still_waiting, job)
        raise RunSuspended(pending, wait_s)


def _completed_steps(messages: Sequence[ModelMessage], since: int) -> int:
    return sum(1 for m in messages[since:] if isinstance(m, ModelResponse) and m.state != "suspended")


async def run_batched_turn(
    built: BuiltAgent,
    model: Any,
    batching: ProviderBatching,
    *,
    job: Job,
    turn: int,
    prompt: str,
    messages: list[ModelMessage],
    state: dict[str, Any],
    conversation_id: str,
    request_limit: int,
    signer: TagSigner,
) -> tuple[list[ModelMessage], dict[str, Any], TurnResult]:
    """One question in batch mode, from its start or from its saved round. Returns the question's
    history, state and result once it completes; raises `RunSuspended` after saving the round when
    its request is waiting in a provider batch."""
    pending, version = await asyncio.to_thread(batching.store.load_pending, job.id)
    if pending is not None and pending.turn != turn:
        pending = None  # an earlier question's round, committed since
    if pending is not None:
        await _unless_checked_lately(batching, job, pending)
        await asyncio.to_thread(batching.store.resumed, job)
        history = ModelMessagesTypeAdapter.validate_json(pending.messages_json)
        run_state, run_prompt = pending.state, None
        earlier_wire = [ModelMessagesTypeAdapter.validate_json(w) for w in pending.wire_json]
    else:
        history, run_state, run_prompt, earlier_wire = messages, state, prompt, []
    batched = batching.batched(model)
    deps = Deps(state=copy.deepcopy(run_state), conversation_id=conversation_id)
    wire: list[list[ModelMessage]] = []
    output_type = built.agent.output_type
    result: AgentRunResult[Any]
    try:
        result = await built.agent.run(
            run_prompt,
            message_history=list(history) or None,
            deps=deps,
            conversation_id=conversation_id,
            model=_Queueing(model, wire),  # the capability wraps it: batch_encode records each request
            model_settings=sdk_retry_settings(model),
            usage_limits=UsageLimits(request_limit=max(1, request_limit - _completed_steps(history, len(messages)))),
            capabilities=[batching.capability],
            output_type=[*output_type, PendingModelResponse] if isinstance(output_type, list)
            else [output_type, PendingModelResponse],
        )
    except ModelAPIError as exc:
        if pending is None:
            raise  # before any ticket (a failed submission): transient ones re-run the job (H6)
        raise BatchRequestFailed(pending.provider_batch, exc) from exc
    all_messages = result.all_messages()
    if isinstance(result.output, PendingModelResponse):
        response = result.output.response
        ticket = ticket_of(response) or {}
        handle = ticket.get("batch") or {}
        polls = int(ticket.get("polls", 0))
        saved = PendingRound(
            turn=turn,
            messages_json=ModelMessagesTypeAdapter.dump_json(all_messages).decode(),
            state=deps.state,
            wire_json=[ModelMessagesTypeAdapter.dump_json(w).decode() for w in [*earlier_wire, *wire]],
            provider_batch=str(handle.get("id", "")),
            custom_id=str(ticket.get("custom_id", "")),
            round=rounds_of(all_messages[len(messages):]) + 1,
        )
        delay = batched.continuation_delay(response)
        delay_s = float(delay) if delay is not None else batching.capability.poll_interval.total_seconds()
        await asyncio.to_thread(batching.store.set_next_check, saved.provider_batch, time.time() + delay_s)
        await asyncio.to_thread(batching.store.suspend, job, saved, handle=handle, delay_s=delay_s, version=version)
        log.info("job_waiting_on_provider", provider_batch=saved.provider_batch, round=saved.round,
                 polls=polls, delay_s=round(delay_s, 2))
        raise RunSuspended(saved, delay_s)
    new_messages = all_messages[len(messages):]
    turn_result = summarize_turn(
        question_text=prompt,
        history_length=len(messages),
        output=result.output,
        new_messages=new_messages,
        state=deps.state,
        namespaces=built.namespaces,
        signer=signer,
        conversation_id=conversation_id,
        usage=usage_of(new_messages),
        wire=[*earlier_wire, *wire],
    )
    return all_messages, deps.state, turn_result
