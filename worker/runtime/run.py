"""Runs one job: one agent run per question, committing history and state together after each (H4).

A question job is one turn with no history. A conversation is the same loop over its turns,
carrying one `deps.state` dict and one message history from turn to turn (H11); `commit` is where a
stored conversation checkpoints them (a compare-and-set: runtime/conversations.py builds it over
store/conversations.py), so a redelivered job resumes at the next turn. A turn that fails commits
nothing.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelConnectionError,
    ModelHTTPError,
    ModelRateLimitError,
    ModelRequestTimeout,
    ModelServerError,
    ModelUnavailableError,
)
from pydantic_ai.messages import ModelMessage
from pydantic_ai.usage import UsageLimits

from capabilities import Deps, TagSigner
from worker.jobs.allowlist import ModelUnavailable, model_label
from worker.jobs.models import Batch, Job, JobError, JobResult, TurnResult, Usage
from worker.redaction import scrub
from worker.store.provider_batches import RoundSuperseded

from .agents import AgentCache, BuiltAgent
from .llms import ModelCache, WireRecorder, sdk_retry_settings
from .provider_batches import ProviderBatching, RunSuspended, batch_report, run_batched_turn
from .turns import summarize_turn

_TRANSIENT = (ModelRateLimitError, ModelUnavailableError, ModelServerError, ModelConnectionError, ModelRequestTimeout)
_TRANSIENT_STATUS = frozenset({408, 425, 429})


class TransientModelError(Exception):
    """H6. The provider may answer if asked again later; the job is re-run from its last commit."""

    def __init__(self, cause: BaseException, committed: Checkpoint | None = None) -> None:
        super().__init__(scrub(f"{type(cause).__name__}: {cause}"))  # it reaches events and logs
        self.cause = cause
        self.retry_after: float | None = getattr(cause, "retry_after", None)
        self.committed = committed  # what earlier turns committed, for a result once retries run out


def is_transient(exc: BaseException) -> bool:
    """Rate limits, unavailable or failing servers, and transport errors pass; a rejected request,
    a bad key or an unknown model would fail the same way again."""
    if isinstance(exc, _TRANSIENT):
        return True
    if isinstance(exc, ModelHTTPError):
        return exc.status_code in _TRANSIENT_STATUS or exc.status_code >= 500
    return False


@dataclass(frozen=True)
class Checkpoint:
    """What a commit makes durable: the history and the state, always together (H4)."""

    messages: list[ModelMessage] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    turns: tuple[TurnResult, ...] = ()


Commit = Callable[[Checkpoint], Awaitable[None]]


async def commit_nothing(checkpoint: Checkpoint) -> None:
    """A question job has nothing to resume, so its only commit is the result itself; a caller
    without progress to report passes this too."""


@dataclass
class Runtime:
    """What one worker process lends every run: cached agents and models, its signer, and the
    provider batching its batch-mode jobs share (H17; None where nothing is batched)."""

    agents: AgentCache
    models: ModelCache
    signer: TagSigner
    batching: ProviderBatching | None = None


def _now() -> datetime:
    return datetime.now(UTC)


def conversation_id_for(job: Job) -> str:
    """Redirect tags bind the run's conversation id (T3), which pydantic-ai would otherwise make up
    per run; the job's own id is stable across retries and recorded, so evaluation can re-verify
    the tags from the stored result (V6)."""
    return job.conversation_id or job.id


async def run_turn(
    built: BuiltAgent,
    model: Any,
    *,
    prompt: str,
    checkpoint: Checkpoint,
    conversation_id: str,
    request_limit: int,
    signer: TagSigner,
) -> Checkpoint:
    """One question. The run works on a copy of the state, so a failure leaves the checkpoint as it was."""
    deps = Deps(state=copy.deepcopy(checkpoint.state), conversation_id=conversation_id)
    wire: list[list[ModelMessage]] = []
    result = await built.agent.run(
        prompt,
        message_history=list(checkpoint.messages) or None,
        deps=deps,
        conversation_id=conversation_id,
        model=WireRecorder(model, wire),
        model_settings=sdk_retry_settings(model),
        usage_limits=UsageLimits(request_limit=request_limit),
    )
    usage = result.usage
    turn = summarize_turn(
        question_text=prompt,
        history_length=len(checkpoint.messages),
        output=result.output,
        new_messages=result.new_messages(),
        state=deps.state,
        namespaces=built.namespaces,
        signer=signer,
        conversation_id=conversation_id,
        usage=Usage(input_tokens=usage.input_tokens or 0, output_tokens=usage.output_tokens or 0),
        wire=wire,
    )
    return Checkpoint(messages=result.all_messages(), state=deps.state, turns=(*checkpoint.turns, turn))


def failed_result(
    job: Job,
    batch: Batch,
    error: BaseException,
    *,
    attempts: int,
    started_at: datetime,
    built: BuiltAgent | None = None,
    checkpoint: Checkpoint | None = None,
) -> JobResult:
    cause = error.cause if isinstance(error, TransientModelError) else error
    checkpoint = checkpoint or Checkpoint()
    return JobResult(
        job_id=job.id,
        batch_id=batch.id,
        custom_id=job.custom_id,
        kind=job.kind,
        conversation_id=conversation_id_for(job),
        arm=batch.arm,
        metadata=job.metadata,
        status="failed",
        error=JobError(type=type(cause).__name__, message=scrub(str(cause) or repr(cause), batch.config.endpoint_key_names)),
        model=model_label(batch.config),
        endpoint=batch.config.endpoint.base_url if batch.config.endpoint else None,
        policy_registered=built.policy_registered if built else False,
        compactor_registered=built.compactor_registered if built else False,
        turns=list(checkpoint.turns),
        state_after=checkpoint.state,
        attempts=attempts,
        started_at=started_at,
        finished_at=_now(),
        **batch_report(batch.config.run.batch, checkpoint.turns),
    )


async def run_job(
    job: Job,
    batch: Batch,
    runtime: Runtime,
    *,
    attempts: int = 1,
    started_at: datetime | None = None,
    checkpoint: Checkpoint | None = None,
    commit: Commit = commit_nothing,
    timeout_s: float | None = None,
) -> JobResult:
    """Returns a succeeded or failed result; raises TransientModelError when a re-run may succeed.
    Every other error fails the job at once with its type and message, and commits nothing."""
    config = batch.config
    started_at = started_at or _now()
    checkpoint = checkpoint or Checkpoint()
    built: BuiltAgent | None = None
    conversation_id = conversation_id_for(job)
    timeout_s = timeout_s or config.run.timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            built = runtime.agents.get(config, job.kind, tenant=batch.tenant)
            model = runtime.models.get(config)
            for prompt in job.prompts()[len(checkpoint.turns) :]:
                if config.run.batch:
                    answered = await _batched_turn(job, built, model, runtime, prompt, checkpoint, conversation_id,
                                                   config.run.request_limit)
                else:
                    answered = await run_turn(
                        built,
                        model,
                        prompt=prompt,
                        checkpoint=checkpoint,
                        conversation_id=conversation_id,
                        request_limit=config.run.request_limit,
                        signer=runtime.signer,
                    )
                await commit(answered)
                checkpoint = answered  # a result reports only what was committed
    except (RunSuspended, RoundSuperseded):
        raise  # H17: not outcomes; the job waits on its provider, or another delivery carries it on
    except ModelAPIError as exc:
        if is_transient(exc):
            raise TransientModelError(exc, checkpoint) from exc
        return failed_result(job, batch, exc, attempts=attempts, started_at=started_at, built=built,
                             checkpoint=checkpoint)
    except TimeoutError as exc:
        error = TimeoutError(f"the job did not finish within {timeout_s:g} s (run.timeout_s, capped by the worker)")
        error.__cause__ = exc
        return failed_result(job, batch, error, attempts=attempts, started_at=started_at, built=built,
                             checkpoint=checkpoint)
    except Exception as exc:  # a permanent error: the job fails visibly, with what went wrong
        return failed_result(job, batch, exc, attempts=attempts, started_at=started_at, built=built,
                             checkpoint=checkpoint)
    assert built is not None
    return JobResult(
        job_id=job.id,
        batch_id=batch.id,
        custom_id=job.custom_id,
        kind=job.kind,
        conversation_id=conversation_id,
        arm=batch.arm,
        metadata=job.metadata,
        status="succeeded",
        model=model_label(config),
        endpoint=config.endpoint.base_url if config.endpoint else None,
        policy_registered=built.policy_registered,
        compactor_registered=built.compactor_registered,
        turns=list(checkpoint.turns),
        state_after=checkpoint.state,
        attempts=attempts,
        started_at=started_at,
        finished_at=_now(),
        **batch_report(config.run.batch, checkpoint.turns),
    )


async def _batched_turn(job: Job, built: BuiltAgent, model: Any, runtime: Runtime, prompt: str,
                        checkpoint: Checkpoint, conversation_id: str, request_limit: int) -> Checkpoint:
    if runtime.batching is None:
        raise ModelUnavailable("run.batch: this worker was started without provider batching")
    messages, state, turn = await run_batched_turn(
        built, model, runtime.batching, job=job, turn=len(checkpoint.turns), prompt=prompt,
        messages=list(checkpoint.messages), state=checkpoint.state, conversation_id=conversation_id,
        request_limit=request_limit, signer=runtime.signer)
    return Checkpoint(messages=messages, state=state, turns=(*checkpoint.turns, turn))
