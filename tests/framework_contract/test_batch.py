"""F21: provider batch requests that end a run and are resumed by a later one (docs/design/rules/framework.md)."""

from __future__ import annotations

from datetime import timedelta

from pydantic_ai import Agent
from pydantic_ai.capabilities import BatchModelRequests
from pydantic_ai.messages import ModelResponse
from pydantic_ai.output import PendingModelResponse

from tests.harness import ScriptedModel, respond


def batching() -> BatchModelRequests:
    return BatchModelRequests(max_wait=timedelta(milliseconds=10), poll_interval=timedelta(milliseconds=10),
                              max_poll_interval=timedelta(milliseconds=10))


async def test_F21_a_run_ends_once_its_request_is_submitted_and_a_promptless_run_collects_it():
    model = ScriptedModel([respond("answer")])
    agent: Agent[None, str | PendingModelResponse] = Agent(model, output_type=[str, PendingModelResponse])
    first = await agent.run("q", capabilities=[batching()])
    assert isinstance(first.output, PendingModelResponse)
    pending = first.all_messages()[-1]
    assert isinstance(pending, ModelResponse) and pending.state == "suspended" and pending.parts == []
    assert first.output.response.provider_response_id == pending.provider_response_id
    ticket = (pending.provider_details or {})["batch"]
    assert set(ticket) >= {"custom_id", "batch", "polls"} and ticket["polls"] == 0
    assert ticket["batch"]["request_count"] == 1 and isinstance(ticket["batch"]["id"], str)
    assert len(model.wires) == 1  # the in-memory batch ran the request when it was created

    # another capability instance, as in another process: the same batch is checked, nothing resubmitted
    second = await agent.run(None, message_history=first.all_messages(), capabilities=[batching()])
    assert second.output == "answer"
    assert len(model.wires) == 1
    collected = second.all_messages()[-1]
    assert isinstance(collected, ModelResponse) and collected.state == "complete"
    assert (collected.provider_details or {})["batch"]["id"] == ticket["batch"]["id"]
    assert len(second.all_messages()) == 2  # the collected response replaced the suspended one
