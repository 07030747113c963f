"""L16: a question whose model requests go through a provider batch (pydantic-ai's
`BatchModelRequests` with `PendingModelResponse` among the output types) spans several runs: each
ends once its request is submitted, and the next resumes from the history with no prompt. The
evidence record and the policy treat those runs as one question (docs/design/rules/ledger.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import BatchModelRequests
from pydantic_ai.messages import ModelResponse
from pydantic_ai.output import PendingModelResponse

from capabilities import create_passages, create_policy
from capabilities.passages import PassagesState
from capabilities.questions import awaits_model, paused, suspended
from tests.harness import SIGNER, Deps, FakeCorpus, ScriptedModel, pc, ps, respond

CONV = "conv-1"


def batching() -> BatchModelRequests:
    return BatchModelRequests(max_wait=timedelta(milliseconds=10), poll_interval=timedelta(milliseconds=10),
                              max_poll_interval=timedelta(milliseconds=10))


async def run_until_answered(model: ScriptedModel, corpus: FakeCorpus, deps: Deps) -> tuple[Any, list[int]]:
    """Runs the question as a batch-mode host does: a new run per round, from the last history."""
    ag: Agent[Any, Any] = Agent(model, capabilities=[create_passages(corpus, SIGNER), create_policy(SIGNER)],
                                output_type=[str, PendingModelResponse])
    capability = batching()
    history: list[Any] | None = None
    in_progress: list[int] = []
    prompt: str | None = "q"
    for _ in range(10):
        result = await ag.run(prompt, deps=deps, message_history=history, conversation_id=CONV,
                              capabilities=[capability])
        if not isinstance(result.output, PendingModelResponse):
            return result, in_progress
        history, prompt = result.all_messages(), None
        assert suspended(history) and awaits_model(history) and paused(result.output)
        record = PassagesState.model_validate(deps.state["passages"]).evidence
        in_progress.append(record.question if record.in_progress and record.question is not None else -1)
    raise AssertionError("the question never finished")


async def test_L16_a_suspended_run_leaves_its_question_open_and_the_resumed_runs_ground_it(corpus: FakeCorpus):
    deps = Deps()
    model = ScriptedModel([respond(ps("masks")), respond(pc("c-1")), respond("a")])
    result, in_progress = await run_until_answered(model, corpus, deps)
    assert result.output == "a"
    assert in_progress == [0, 0, 0]  # one question, identity 0, open across every suspension
    record = PassagesState.model_validate(deps.state["passages"]).evidence
    assert not record.in_progress and record.declaration is not None
    assert len(model.wires) == 3
    assert deps.state.get("citation_policy", {}).get("violations", []) == []


async def test_L16_a_suspended_response_is_not_an_ending_the_policy_redirects(corpus: FakeCorpus):
    """Without L16 the policy took the empty suspended response for an undeclared answer and sent a
    redirect, which re-asked the model while the batch still held the request."""
    deps = Deps()
    model = ScriptedModel([respond(ps("masks")), respond(pc("c-1")), respond("a")])
    result, _ = await run_until_answered(model, corpus, deps)
    texts = [p.content for m in result.all_messages() if not isinstance(m, ModelResponse) for p in m.parts
             if type(p).__name__ == "UserPromptPart"]
    assert texts == ["q"]
