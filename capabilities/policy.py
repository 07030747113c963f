"""The citation policy (Part P): the single place that requires an answer to declare its grounds.

Evidence capabilities only record and validate citations; whether one is *required* is decided
here, once, over the merged records of every evidence capability the run registered. Registering
the policy is its only switch (P1, P14).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult

from .deps import host_state
from .evidence import discover_evidence, question_in_progress
from .ledger import CapabilityEvidenceRecord, citation_status
from .questions import paused
from .tags import TagSigner, is_our_redirect, redirect_tag

POLICY_ID = "capabilities.citation-policy"
POLICY_NAMESPACE = "citation_policy"
POLICY_DESCRIPTION = "Requires every answer to declare what grounds it."

NextStep = Literal["leave", "redirect", "record_violation"]


class CitationPolicyState(BaseModel):
    """P12. Violations describe what the policy observed, not what the model declared, so they
    live with the policy and not in any evidence record."""

    violations: list[int] = Field(default_factory=list)


def redirect_text(
    cite_tools: Sequence[str], conversation_id: str | None, question: int, *, signer: TagSigner
) -> str:
    """P6. The model is asked to record the grounds of the answer it already gave, and told this is
    no rejection, so that it neither invents grounding nor changes a correct refusal; the run's
    output is the last answer, so it must repeat it. The signed tag lets P8 recognise it."""
    if not cite_tools:
        raise ValueError("a redirect must name at least one available cite tool (P9 records a violation instead)")
    tools = " or ".join(cite_tools)
    return (
        "Your previous reply came without a citation record. "
        "Please record what grounded the answer you already gave. "
        "This is not a request to change that answer, and it does not mean the answer was wrong. "
        f"Call {tools} with the supporting chunk_ids, or with an empty list if nothing in the knowledge "
        "base supports it or your reply said the information could not be found. "
        "Then give the same answer again, unchanged. "
        f"{redirect_tag(signer, conversation_id, question)}"
    )


def has_evidence_to_declare(records: Sequence[CapabilityEvidenceRecord], question: int) -> bool:
    """P5. This question produced an evidence outcome, or the conversation has cited something that
    stays available to later answers. Read from the ledger, never the working set, because a new
    question clears the working set while earlier citations remain on offer."""
    return any(r.latest_evidence_epoch > question for r in records) or any(
        occurrence.cited_in_questions for r in records for occurrence in r.occurrences.values()
    )


def owes_declaration(records: Sequence[CapabilityEvidenceRecord], question: int) -> bool:
    """P4.2-3 and P10. An `ungrounded` declaration is a declaration; only `missing` is owed."""
    return has_evidence_to_declare(records, question) and citation_status(records, question=question) == "missing"


def redirects_delivered(
    messages: Sequence[ModelMessage], signer: TagSigner, conversation_id: str | None, question: int
) -> int:
    """The redirects for `question` that reached these messages. Only a verifying tag counts, so
    quoting our wording or forging a tag is never mistaken for one (T3); an enqueued redirect that
    never reached the history was never seen by the model, and is not counted (V5)."""
    return sum(
        isinstance(part, UserPromptPart)
        and isinstance(part.content, str)
        and is_our_redirect(signer, part.content, conversation_id, question)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
    )


def already_asked(
    messages: Sequence[ModelMessage], signer: TagSigner, conversation_id: str | None, question: int
) -> bool:
    """P8. Read from the history, never remembered: every `for_run` builds a new instance, so only
    the history remembers across a pause."""
    return redirects_delivered(messages[question:], signer, conversation_id, question) > 0


def ends_question(response: ModelResponse, output_tool_names: Collection[str]) -> bool:
    """P3. Nothing more reaches the model after such a response unless the policy adds it now.
    Text beside function calls does not end a run (F16), but an output-tool call does, and a
    structured answer must not escape enforcement. A response its provider is still working on (a
    batch request, L16) has no content yet and ends nothing."""
    if response.state == "suspended":
        return False
    calls = [part for part in response.parts if isinstance(part, ToolCallPart)]
    return not calls or any(call.tool_name in output_tool_names for call in calls)


def next_step(
    records: Sequence[CapabilityEvidenceRecord], question: int, *, already_asked: bool, can_cite: bool
) -> NextStep:
    """P4 for an ending response. Asking once is enough (P8); pointing the model at a withdrawn
    cite tool would cost unknown-tool retries and can abort the run (P9, F10)."""
    if not owes_declaration(records, question) or already_asked:
        return "leave"
    return "redirect" if can_cite else "record_violation"


def record_violation(deps: Any, question: int) -> None:
    """P11/P12. Once per question, because resumptions and the backstop decide again; a host that
    carries no state has nowhere to keep it, and that must not fail its run."""
    state = host_state(deps)
    if state is None:
        return
    policy_state = CitationPolicyState.model_validate(state.get(POLICY_NAMESPACE, {}))
    if question not in policy_state.violations:
        policy_state.violations.append(question)
    state[POLICY_NAMESPACE] = policy_state.model_dump(mode="json")


@dataclass
class CitationPolicyCapability(AbstractCapability[Any]):
    """Requires every answer to declare what grounds it, over all registered evidence capabilities.

    It holds only its signer: there are no flags, thresholds or per-question settings (P14), and
    whether a question was already asked is read from the history (P8), so the registered
    instance serves every run.
    """

    _: KW_ONLY
    signer: TagSigner = field(repr=False)
    defer_loading: bool = field(default=False, init=False, repr=False)
    """Not a constructor option: a deferred capability's hooks never fire until loaded (F8), and a
    policy that never fires enforces nothing while looking registered."""

    async def before_run(self, ctx: RunContext[Any]) -> None:
        """P12 publishes the key, so a host can tell "no violations" from "policy not running";
        L2 is checked here, once the run registry is complete, before any request."""
        state = host_state(ctx.deps)
        if state is not None:
            state.setdefault(POLICY_NAMESPACE, CitationPolicyState().model_dump(mode="json"))
        question_in_progress(discover_evidence(ctx))

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        output_tools = {tool.name for tool in request_context.model_request_parameters.output_tools}
        if not ends_question(response, output_tools):
            return response
        found = discover_evidence(ctx)
        q = question_in_progress(found)
        cite_tools = [f.cite_tool for f in found if f.cite_available]
        step = next_step(
            [f.record for f in found],
            q,
            already_asked=already_asked(ctx.messages, self.signer, ctx.conversation_id, q),
            can_cite=bool(cite_tools),
        )
        match step:
            case "redirect":
                text = redirect_text(cite_tools, ctx.conversation_id, q, signer=self.signer)
                ctx.enqueue(text, priority="when_idle")  # P7: delivered only if the run would end
            case "record_violation":
                record_violation(ctx.deps, q)
        return response

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        """P10. Endings `after_model_request` cannot see (a structured text answer beside calls
        under `end_strategy='early'`) and questions asked once that still ended undeclared are
        recorded here; a run that only pauses has not finished its question."""
        if paused(result.output):
            return result
        found = discover_evidence(ctx)
        q = question_in_progress(found)
        if owes_declaration([f.record for f in found], q):
            record_violation(ctx.deps, q)
        return result


def create_policy(signer: TagSigner) -> CitationPolicyCapability:
    """The explicit id makes a second policy in one agent an error instead of a silent merge (F14, P2)."""
    return CitationPolicyCapability(id=POLICY_ID, description=POLICY_DESCRIPTION, signer=signer)
