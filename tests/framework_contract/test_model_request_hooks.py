"""F3, F4, F5, F9, F19: the per-request hooks (docs/design/rules/framework.md)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext, UserError
from pydantic_ai.capabilities import AbstractCapability, WrapModelRequestHandler
from pydantic_ai.messages import (
    InstructionPart,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import FunctionToolset

from tests.framework_contract.probes import HookLog, hooks
from tests.harness import ScriptedModel, call, respond, tool_returns, user_texts

NOTICE = "NOTICE: answer briefly."

lookup_tools = FunctionToolset()


@lookup_tools.tool_plain
def lookup() -> str:
    """Look something up."""
    return "ORIGINAL"


def _one_lookup_then_done() -> ScriptedModel:
    return ScriptedModel([respond(call("lookup", call_id="t1")), respond("done")])


# ---------------------------------------------------------------------------------------------- F3


async def test_F3_before_model_request_runs_once_per_step_inside_wrap_model_request() -> None:
    log: list[tuple[Any, ...]] = []
    agent = Agent(_one_lookup_then_done(), toolsets=[lookup_tools], capabilities=[HookLog(id="p", log=log)])

    await agent.run("hi")

    step = ["prepare_tools", "wrap_model_request:enter", "before_model_request", "after_model_request",
            "wrap_model_request:exit"]
    assert hooks(log) == ["for_run", "wrap_run:enter", "before_run", *step, *step, "after_run", "wrap_run:exit"]


@dataclass
class RequestView(AbstractCapability[Any]):
    seen: list[tuple[int, int, bool, str]] = field(default_factory=list)

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        self.seen.append(
            (
                len(ctx.messages),
                len(request_context.messages),
                ctx.messages[-1] is request_context.messages[-1],
                type(request_context.messages).__name__,
            )
        )
        return replace(request_context, messages=[*request_context.messages])


async def test_F3_ctx_messages_includes_the_request_and_request_context_messages_is_a_separate_list() -> None:
    view = RequestView(id="v")
    result = await Agent(_one_lookup_then_done(), toolsets=[lookup_tools], capabilities=[view]).run("hi")

    assert view.seen == [(1, 1, True, "HistoryMirroringMessages"), (3, 3, True, "HistoryMirroringMessages")]
    assert len(result.all_messages()) == 4


@dataclass
class ReplacesMessages(AbstractCapability[Any]):
    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        extra = ModelRequest(parts=[UserPromptPart("REQUEST ONLY")])
        return replace(request_context, messages=[*request_context.messages, extra])


@dataclass
class AppendsMessages(AbstractCapability[Any]):
    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if ctx.run_step == 1:
            request_context.messages.append(ModelRequest(parts=[UserPromptPart("WRITTEN BACK")]))
        return request_context


async def test_F3_assigning_a_new_list_is_request_only_but_appending_writes_into_history_with_a_warning() -> None:
    model = ScriptedModel([respond("a")])
    result = await Agent(model, capabilities=[ReplacesMessages(id="r")]).run("hi")
    assert user_texts(model.wire(1)) == ["hi", "REQUEST ONLY"]
    assert user_texts(result.all_messages()) == ["hi"]

    model = ScriptedModel([respond("a")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = await Agent(model, capabilities=[AppendsMessages(id="a")]).run("hi")
    assert user_texts(model.wire(1)) == ["hi", "WRITTEN BACK"]
    assert user_texts(result.all_messages()) == ["hi", "WRITTEN BACK"]
    assert [type(w.message).__name__ for w in caught] == ["PydanticAIDeprecationWarning"]


@dataclass
class AddsNotice(AbstractCapability[Any]):
    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        params = request_context.model_request_parameters
        parts = [*(params.instruction_parts or []), InstructionPart(NOTICE, dynamic=True)]
        return replace(request_context, model_request_parameters=replace(params, instruction_parts=parts))


async def test_F3_an_extra_dynamic_instruction_part_reaches_the_model_and_the_recorded_request() -> None:
    """Observed beyond the spec: the history's ModelRequest.instructions is re-rendered with the notice."""
    model = ScriptedModel([respond("a")])

    result = await Agent(model, instructions="Base.", capabilities=[AddsNotice(id="n")]).run("hi")

    info = model.infos[0]
    assert info.instructions == f"Base.\n\n{NOTICE}"
    assert [(p.content, p.dynamic) for p in info.model_request_parameters.instruction_parts or []] == [
        ("Base.", False),
        (NOTICE, True),
    ]
    first = result.all_messages()[0]
    assert isinstance(first, ModelRequest)
    assert first.instructions == f"Base.\n\n{NOTICE}"


# ---------------------------------------------------------------------------------------------- F4


@dataclass
class CallsHandlerTwice(AbstractCapability[Any]):
    async def wrap_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, handler: WrapModelRequestHandler
    ) -> ModelResponse:
        await handler(request_context)
        return await handler(request_context)


async def test_F4_wrap_model_request_handler_may_be_called_only_once() -> None:
    agent = Agent(ScriptedModel([respond("a"), respond("b")]), capabilities=[CallsHandlerTwice(id="t")])

    with pytest.raises(UserError, match="only once"):
        await agent.run("hi")


def _rewrite_tool_returns(messages: list[ModelMessage], content: str) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            parts = [replace(p, content=content) if isinstance(p, ToolReturnPart) else p for p in message.parts]
            message = replace(message, parts=parts)
        out.append(message)
    return out


@dataclass
class RewritesReturns(AbstractCapability[Any]):
    shared: list[bool] = field(default_factory=list)

    async def wrap_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, handler: WrapModelRequestHandler
    ) -> ModelResponse:
        self.shared.append(all(a is b for a, b in zip(request_context.messages, ctx.messages, strict=True)))
        request_context.messages = _rewrite_tool_returns(request_context.messages, "REWRITTEN")
        return await handler(request_context)


async def test_F4_assigning_messages_in_wrap_model_request_changes_only_the_wire() -> None:
    model = _one_lookup_then_done()
    probe = RewritesReturns(id="r")

    result = await Agent(model, toolsets=[lookup_tools], capabilities=[probe]).run("hi")

    assert [p.content for p in tool_returns(model.wire(2))] == ["REWRITTEN"]
    assert [p.content for p in tool_returns(result.all_messages())] == ["ORIGINAL"]
    assert probe.shared == [True, True]


@dataclass
class MutatesInPlace(AbstractCapability[Any]):
    async def wrap_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, handler: WrapModelRequestHandler
    ) -> ModelResponse:
        for message in request_context.messages:
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    part.content = "MUTATED"
        return await handler(request_context)


async def test_F4_mutating_a_part_in_place_leaks_into_history() -> None:
    result = await Agent(
        _one_lookup_then_done(), toolsets=[lookup_tools], capabilities=[MutatesInPlace(id="m")]
    ).run("hi")

    assert [p.content for p in tool_returns(result.all_messages())] == ["MUTATED"]


@dataclass
class CountsAttempts(AbstractCapability[Any]):
    attempts: list[int] = field(default_factory=list)

    async def prepare_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        self.attempts.append(ctx.run_step)
        return replace(request_context, messages=_rewrite_tool_returns(request_context.messages, "PREPARED"))


async def test_F4_prepare_model_request_runs_once_per_attempt_and_is_request_only() -> None:
    model = _one_lookup_then_done()
    probe = CountsAttempts(id="c")

    result = await Agent(model, toolsets=[lookup_tools], capabilities=[probe]).run("hi")

    assert probe.attempts == [1, 2]
    assert [p.content for p in tool_returns(model.wire(2))] == ["PREPARED"]
    assert [p.content for p in tool_returns(result.all_messages())] == ["ORIGINAL"]


# ---------------------------------------------------------------------------------------------- F5


class Answer(BaseModel):
    answer: str


@dataclass
class ReadsOutputTools(AbstractCapability[Any]):
    log: list[tuple[Any, ...]] = field(default_factory=list)

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        params = request_context.model_request_parameters
        self.log.append(
            (
                "after_model_request",
                len(ctx.messages),
                isinstance(ctx.messages[-1], ModelRequest),
                [t.name for t in params.output_tools],
                [t.name for t in params.function_tools],
            )
        )
        return response

    def get_toolset(self) -> FunctionToolset[Any]:
        toolset: FunctionToolset[Any] = FunctionToolset()
        log = self.log

        @toolset.tool_plain
        def probe_tool() -> str:
            """A probe tool."""
            log.append(("tool",))
            return "ran"

        return toolset


async def test_F5_after_model_request_runs_before_tools_and_reads_output_tools() -> None:
    probe = ReadsOutputTools(id="o")
    model = ScriptedModel(
        [respond(call("probe_tool", call_id="t1")), respond(call("final_result", {"answer": "x"}, "o1"))]
    )

    result = await Agent(model, output_type=Answer, capabilities=[probe]).run("hi")

    assert probe.log == [
        ("after_model_request", 1, True, ["final_result"], ["probe_tool"]),
        ("tool",),
        ("after_model_request", 3, True, ["final_result"], ["probe_tool"]),
    ]
    assert result.output == Answer(answer="x")


async def test_F5_plain_text_output_has_no_output_tools() -> None:
    probe = ReadsOutputTools(id="o")

    await Agent(ScriptedModel([respond("a")]), capabilities=[probe]).run("hi")

    assert probe.log == [("after_model_request", 1, True, [], ["probe_tool"])]


# ---------------------------------------------------------------------------------------------- F9


@dataclass
class Gate(AbstractCapability[Any]):
    withhold: str
    seen: list[tuple[int, list[tuple[str, str | None]]]] = field(default_factory=list)
    log: list[tuple[Any, ...]] = field(default_factory=list)

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        self.seen.append((ctx.run_step, sorted((t.name, t.capability_id) for t in tool_defs)))
        self.log.append(("prepare_tools", ctx.run_step))
        return [t for t in tool_defs if t.name != self.withhold]

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        self.log.append(("before_model_request", ctx.run_step))
        return request_context


async def test_F9_prepare_tools_sees_every_function_tool_with_its_capability_id_before_before_model_request() -> (
    None
):
    gate = Gate(id="gate", withhold="nothing")
    model = ScriptedModel([respond(call("lookup", call_id="t1")), respond("done")])
    agent = Agent(
        model,
        toolsets=[lookup_tools],
        capabilities=[gate, HookLog(id="other", tool_name="other_tool")],
    )

    await agent.run("hi")

    expected = [("lookup", None), ("other_tool", "other")]
    assert gate.seen == [(1, expected), (2, expected)]
    assert gate.log == [
        ("prepare_tools", 1),
        ("before_model_request", 1),
        ("prepare_tools", 2),
        ("before_model_request", 2),
    ]


async def test_F9_a_tool_withheld_by_prepare_tools_is_not_offered_and_cannot_execute() -> None:
    model = ScriptedModel([respond(call("lookup", call_id="t1")), respond("done")])
    agent = Agent(model, toolsets=[lookup_tools], capabilities=[Gate(id="gate", withhold="lookup")])

    result = await agent.run("hi")

    assert model.offered(1) == set()
    (returned,) = tool_returns(result.all_messages())
    assert returned.outcome == "retried"
    assert str(returned.content).startswith("Unknown tool name: 'lookup'")


# --------------------------------------------------------------------------------------------- F19


@dataclass
class DynamicInstructions(AbstractCapability[Any]):
    log: list[str] = field(default_factory=list)

    def get_instructions(self) -> list[Any]:
        log = self.log

        def render(ctx: RunContext[Any]) -> str:
            before = sum(1 for e in log if e == "before_model_request")
            prepared = sum(1 for e in log if e == "prepare_tools")
            log.append("instructions")
            return f"step={ctx.run_step} prepared={prepared} before={before}"

        return ["Static.", render]

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        self.log.append("prepare_tools")
        return tool_defs

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        self.log.append("before_model_request")
        return request_context


async def test_F19_callable_instructions_are_evaluated_once_per_step_after_prepare_tools() -> None:
    probe = DynamicInstructions(id="dyn")
    model = ScriptedModel(
        [respond(call("lookup", call_id="t1")), respond(call("lookup", call_id="t2")), respond("done")]
    )

    await Agent(model, toolsets=[lookup_tools], capabilities=[probe]).run("hi")

    assert probe.log == ["prepare_tools", "instructions", "before_model_request"] * 3
    assert [info.instructions for info in model.infos] == [
        f"Static.\n\nstep={k} prepared={k} before={k - 1}" for k in (1, 2, 3)
    ]
