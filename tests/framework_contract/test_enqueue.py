"""F6: RunContext.enqueue delivery, redirects and deferred-tool pauses (docs/design/rules/framework.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, CallDeferred, DeferredToolRequests, RunContext, UserError
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    INTERRUPTED_TOOL_RETURN_CONTENT,
    ModelMessage,
    ModelRequest,
    ModelResponse,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import RunUsage

from tests.harness import ScriptedModel, call, respond

FINAL_RESULT_PROCESSED = "Final result processed."


def shape(messages: list[ModelMessage]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """Each message as (kind, [(part type, content)]) for exact placement assertions."""
    return [
        (
            "R" if isinstance(m, ModelRequest) else "M",
            [(type(p).__name__, getattr(p, "content", getattr(p, "tool_name", None))) for p in m.parts],
        )
        for m in messages
    ]


notes = FunctionToolset()


@notes.tool
def note(ctx: RunContext[Any], text: str, priority: str) -> str:
    """Queue a note for the model."""
    ctx.enqueue(text, priority=priority)  # type: ignore[arg-type]
    return "noted"


@notes.tool_plain
def external() -> str:
    """Handled outside the run."""
    raise CallDeferred()


def _note(text: str, priority: str, call_id: str = "n1") -> Any:
    return call("note", {"text": text, "priority": priority}, call_id)


class Answer(BaseModel):
    answer: str


async def test_F6_asap_from_a_tool_lands_in_the_same_request_right_after_its_return() -> None:
    model = ScriptedModel([respond(_note("ASAP", "asap")), respond("a1")])

    result = await Agent(model, toolsets=[notes]).run("hi")

    assert result.output == "a1"
    assert shape(result.all_messages())[2] == ("R", [("ToolReturnPart", "noted"), ("UserPromptPart", "ASAP")])
    assert shape(model.wire(2))[-1] == shape(result.all_messages())[2]


async def test_F6_when_idle_redirects_a_text_ending_and_the_output_is_the_last_answer() -> None:
    model = ScriptedModel([respond(_note("IDLE", "when_idle")), respond("a1"), respond("a2")])

    result = await Agent(model, toolsets=[notes]).run("hi")

    assert result.output == "a2"
    assert len(model.wires) == 3
    assert shape(result.all_messages()) == [
        ("R", [("UserPromptPart", "hi")]),
        ("M", [("ToolCallPart", "note")]),
        ("R", [("ToolReturnPart", "noted")]),
        ("M", [("TextPart", "a1")]),
        ("R", [("UserPromptPart", "IDLE")]),
        ("M", [("TextPart", "a2")]),
    ]
    assert shape(model.wire(2))[-1] == ("R", [("ToolReturnPart", "noted")])


async def test_F6_when_idle_redirects_an_output_tool_ending_after_the_processed_return() -> None:
    model = ScriptedModel(
        [
            respond(_note("IDLE", "when_idle")),
            respond(call("final_result", {"answer": "a1"}, "o1")),
            respond(call("final_result", {"answer": "a2"}, "o2")),
        ]
    )

    result = await Agent(model, toolsets=[notes], output_type=Answer).run("hi")

    assert result.output == Answer(answer="a2")
    assert shape(result.all_messages())[3:] == [
        ("M", [("ToolCallPart", "final_result")]),
        ("R", [("ToolReturnPart", FINAL_RESULT_PROCESSED)]),
        ("R", [("UserPromptPart", "IDLE")]),
        ("M", [("ToolCallPart", "final_result")]),
        ("R", [("ToolReturnPart", FINAL_RESULT_PROCESSED)]),
    ]
    assert shape(model.wire(3))[-1] == ("R", [("ToolReturnPart", FINAL_RESULT_PROCESSED), ("UserPromptPart", "IDLE")])


@dataclass
class QueuesAtFirstResponse(AbstractCapability[Any]):
    """Queues when_idle content first and asap content second, after the first response."""

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        if ctx.run_step == 1:
            ctx.enqueue("IDLE", priority="when_idle")
            ctx.enqueue("ASAP")
        return response


async def test_F6_at_the_end_asap_content_is_delivered_before_when_idle_content() -> None:
    model = ScriptedModel([respond("a1"), respond("a2")])

    result = await Agent(model, capabilities=[QueuesAtFirstResponse(id="q")]).run("hi")

    assert result.output == "a2"
    assert shape(result.all_messages())[2:] == [
        ("R", [("UserPromptPart", "ASAP")]),
        ("R", [("UserPromptPart", "IDLE")]),
        ("M", [("TextPart", "a2")]),
    ]
    assert shape(model.wire(2))[-1] == ("R", [("UserPromptPart", "ASAP"), ("UserPromptPart", "IDLE")])


@dataclass
class Steers(AbstractCapability[Any]):
    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if ctx.run_step == 1:
            ctx.enqueue("STEER")
        return request_context


async def test_F6_asap_from_before_model_request_joins_the_request_being_prepared() -> None:
    model = ScriptedModel([respond("a1")])

    result = await Agent(model, capabilities=[Steers(id="s")]).run("hi")

    assert shape(result.all_messages()) == [
        ("R", [("UserPromptPart", "hi")]),
        ("R", [("UserPromptPart", "STEER")]),
        ("M", [("TextPart", "a1")]),
    ]
    assert shape(model.wire(1)) == [("R", [("UserPromptPart", "hi"), ("UserPromptPart", "STEER")])]


@pytest.mark.parametrize("priority", ["asap", "when_idle"])
async def test_F6_at_a_deferred_pause_queued_content_is_recorded_not_redirected(priority: str) -> None:
    model = ScriptedModel([respond(_note("NOTE", priority), call("external", call_id="x1"))])

    result = await Agent(model, toolsets=[notes], output_type=[str, DeferredToolRequests]).run("hi")

    assert isinstance(result.output, DeferredToolRequests)
    assert len(model.wires) == 1
    assert shape(result.all_messages())[2:] == [
        ("R", [("ToolReturnPart", "noted")]),
        ("R", [("UserPromptPart", "NOTE")]),
    ]


@dataclass
class QueuesAfterFirstResponse(AbstractCapability[Any]):
    priority: str = "when_idle"

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        if ctx.run_step == 1:
            ctx.enqueue("NOTE", priority=self.priority)  # type: ignore[arg-type]
        return response


@pytest.mark.parametrize("priority", ["asap", "when_idle"])
async def test_F6_queued_content_cancels_a_pause_whose_calls_all_deferred(priority: str) -> None:
    """Spec difference: F6 says a deferred-tool pause records queued content instead of redirecting. That holds only
    when the paused step produced a request (some call returned). When EVERY call of the step was deferred, the
    queued content redirects the run: the model gets another turn, the deferred call is answered on the wire by a
    synthesized 'interrupted' return (history keeps the call without any return), and the run ends with the new
    answer instead of DeferredToolRequests."""
    model = ScriptedModel([respond(call("external", call_id="x1")), respond("after")])

    result = await Agent(
        model, toolsets=[notes], capabilities=[QueuesAfterFirstResponse(id="q", priority=priority)],
        output_type=[str, DeferredToolRequests],
    ).run("hi")

    assert result.output == "after"
    assert shape(result.all_messages()) == [
        ("R", [("UserPromptPart", "hi")]),
        ("M", [("ToolCallPart", "external")]),
        ("R", [("UserPromptPart", "NOTE")]),
        ("M", [("TextPart", "after")]),
    ]
    assert shape(model.wire(2))[-1] == (
        "R",
        [("ToolReturnPart", INTERRUPTED_TOOL_RETURN_CONTENT), ("UserPromptPart", "NOTE")],
    )
    assert model.wire(2)[-1].parts[0].outcome == "interrupted"  # type: ignore[union-attr]


@dataclass
class ReturnsIds(AbstractCapability[Any]):
    ids: list[str | None] | None = None

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if self.ids is not None and ctx.run_step == 1:
            self.ids += [ctx.enqueue("one"), ctx.enqueue()]
        return request_context


async def test_F6_enqueue_returns_an_id_or_none_and_needs_a_queue() -> None:
    probe = ReturnsIds(id="r", ids=[])
    await Agent(ScriptedModel([respond("a")]), capabilities=[probe]).run("hi")
    assert probe.ids is not None
    assert isinstance(probe.ids[0], str) and probe.ids[0]
    assert probe.ids[1] is None

    bare = RunContext(deps=None, model=ScriptedModel([]), usage=RunUsage())
    with pytest.raises(UserError, match="pending-message queue"):
        bare.enqueue("x")
