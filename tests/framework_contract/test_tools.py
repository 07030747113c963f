"""F10, F11, F12, F15, F16: how tool calls, failures, content and deferrals behave (docs/design/rules/framework.md)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import (
    Agent,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    ModelRetry,
    NativeOutput,
    PromptedOutput,
    ToolFailed,
    UnexpectedModelBehavior,
)
from pydantic_ai.messages import (
    BinaryContent,
    ModelRequest,
    ModelResponse,
    ToolReturn,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.toolsets import FunctionToolset

from tests.framework_contract.probes import HookLog, entries, kinds
from tests.harness import PNG, ScriptedModel, call, respond, tool_returns

NOT_EXECUTED = "Tool not executed - a final result was already processed."

# --------------------------------------------------------------------------------------------- F10


def _known_tools() -> FunctionToolset[Any]:
    toolset: FunctionToolset[Any] = FunctionToolset()

    @toolset.tool_plain
    def known() -> str:
        """A tool that exists."""
        return "ok"

    return toolset


async def test_F10_unknown_tool_yields_a_retried_return_and_the_run_continues() -> None:
    model = ScriptedModel([respond(call("nope", call_id="u1")), respond("done")])

    result = await Agent(model, toolsets=[_known_tools()]).run("hi")

    (returned,) = tool_returns(result.all_messages())
    assert returned.outcome == "retried"
    assert returned.tool_call_id == "u1"
    assert returned.content == "Unknown tool name: 'nope'. Available tools: 'known'"
    assert result.output == "done"


async def test_F10_a_second_unknown_tool_call_aborts_the_run_with_default_retries() -> None:
    model = ScriptedModel([respond(call("nope", call_id="u1")), respond(call("nope", call_id="u2")), respond("x")])

    with pytest.raises(UnexpectedModelBehavior, match="exceeded max retries count of 1"):
        await Agent(model, toolsets=[_known_tools()]).run("hi")

    assert len(model.wires) == 2


# --------------------------------------------------------------------------------------------- F11

failing = FunctionToolset(max_retries=3)


@failing.tool_plain
def broken() -> str:
    """Always fails."""
    raise ToolFailed("store unavailable")


@failing.tool_plain
def retry_me() -> str:
    """Always asks the model to retry."""
    raise ModelRetry("try different arguments")


async def test_F11_tool_failed_gives_a_failed_return_without_consuming_retries() -> None:
    model = ScriptedModel([respond(call("broken", call_id=f"b{i}")) for i in range(5)] + [respond("done")])

    result = await Agent(model, toolsets=[failing]).run("hi")

    returns = tool_returns(result.all_messages())
    assert [(r.outcome, r.content) for r in returns] == [("failed", "store unavailable")] * 5
    assert result.output == "done"


async def test_F11_model_retry_gives_a_retried_return_and_exhausting_max_retries_aborts() -> None:
    model = ScriptedModel([respond(call("retry_me", call_id=f"r{i}")) for i in range(5)] + [respond("done")])

    with pytest.raises(UnexpectedModelBehavior, match="exceeded max retries count of 3"):
        await Agent(model, toolsets=[failing]).run("hi")

    assert len(model.wires) == 4
    assert [(r.outcome, r.content) for r in tool_returns(model.wire(4))] == [
        ("retried", "try different arguments")
    ] * 3


async def test_F11_model_retry_within_budget_lets_the_run_finish() -> None:
    model = ScriptedModel([respond(call("retry_me", call_id=f"r{i}")) for i in range(3)] + [respond("done")])

    result = await Agent(model, toolsets=[failing]).run("hi")

    assert [r.outcome for r in tool_returns(result.all_messages())] == ["retried"] * 3
    assert result.output == "done"


# --------------------------------------------------------------------------------------------- F12

pictures = FunctionToolset()


@pictures.tool_plain
def show(n: int) -> ToolReturn:
    """Return a value with picture content."""
    return ToolReturn(return_value=f"value {n}", content=[f"label {n}", BinaryContent(PNG, media_type="image/png")])


async def test_F12_tool_return_content_follows_all_tool_returns_in_call_order() -> None:
    model = ScriptedModel(
        [respond(call("show", {"n": 1}, "s1"), call("show", {"n": 2}, "s2")), respond("done")]
    )

    result = await Agent(model, toolsets=[pictures]).run("hi")

    request = result.all_messages()[2]
    assert isinstance(request, ModelRequest)
    shape = [
        (type(p).__name__, p.content if isinstance(p, ToolReturnPart) else p.content[0])  # type: ignore[index]
        for p in request.parts
    ]
    assert shape == [
        ("ToolReturnPart", "value 1"),
        ("ToolReturnPart", "value 2"),
        ("UserPromptPart", "label 1"),
        ("UserPromptPart", "label 2"),
    ]
    content = request.parts[2]
    assert isinstance(content, UserPromptPart) and isinstance(content.content, list)
    assert isinstance(content.content[1], BinaryContent) and content.content[1].data == PNG
    wire_request = model.wire(2)[-1]
    assert [type(p).__name__ for p in wire_request.parts] == [type(p).__name__ for p in request.parts]


# --------------------------------------------------------------------------------------------- F15

external = FunctionToolset()


@external.tool_plain
def approve(item: str) -> str:
    """Needs a human outside the run."""
    raise CallDeferred()


async def test_F15_call_deferred_pauses_and_deferred_tool_results_resume() -> None:
    log: list[tuple[Any, ...]] = []
    agent = Agent(
        ScriptedModel([respond(call("approve", {"item": "a"}, "d1"))]),
        toolsets=[external],
        output_type=[str, DeferredToolRequests],
    )
    paused = await agent.run("hi")

    assert isinstance(paused.output, DeferredToolRequests)
    assert [(c.tool_name, c.tool_call_id) for c in paused.output.calls] == [("approve", "d1")]
    history = paused.all_messages()
    assert kinds(history) == ["R", "M"]
    assert isinstance(history[-1], ModelResponse)

    model = ScriptedModel([respond("resumed")])
    resumed = await Agent(
        model, toolsets=[external], capabilities=[HookLog(id="p", log=log)], output_type=[str, DeferredToolRequests]
    ).run(message_history=history, deferred_tool_results=DeferredToolResults(calls={"d1": "approved"}))

    assert entries(log, "for_run") == [("for_run", "p", 2, None)]
    assert resumed.output == "resumed"
    assert kinds(resumed.all_messages()) == ["R", "M", "R", "M"]
    assert [(r.tool_call_id, r.content, r.outcome) for r in tool_returns(model.wire(1))] == [
        ("d1", "approved", "success")
    ]


# --------------------------------------------------------------------------------------------- F16


class Answer(BaseModel):
    answer: str


def _work_tools(ran: list[int]) -> FunctionToolset[Any]:
    toolset: FunctionToolset[Any] = FunctionToolset()

    @toolset.tool_plain
    def work(n: int) -> str:
        """Do some work."""
        ran.append(n)
        return f"worked {n}"

    return toolset


async def test_F16_graceful_text_next_to_tool_calls_does_not_end_the_run() -> None:
    ran: list[int] = []
    model = ScriptedModel([respond("thinking aloud", call("work", {"n": 1}, "w1")), respond("final")])

    result = await Agent(model, toolsets=[_work_tools(ran)]).run("hi")

    assert ran == [1]
    assert result.output == "final"
    assert len(model.wires) == 2


async def test_F16_graceful_output_tool_ends_the_run_and_function_tools_beside_it_still_run() -> None:
    ran: list[int] = []
    model = ScriptedModel([respond(call("final_result", {"answer": "A"}, "o1"), call("work", {"n": 1}, "w1"))])

    result = await Agent(model, toolsets=[_work_tools(ran)], output_type=Answer).run("hi")

    assert result.output == Answer(answer="A")
    assert ran == [1]
    assert [(r.tool_name, r.content) for r in tool_returns(result.all_messages())] == [
        ("final_result", "Final result processed."),
        ("work", "worked 1"),
    ]


async def test_F16_graceful_first_successful_output_call_wins() -> None:
    model = ScriptedModel(
        [respond(call("final_result", {"answer": "first"}, "o1"), call("final_result", {"answer": "second"}, "o2"))]
    )

    result = await Agent(model, output_type=Answer).run("hi")

    assert result.output == Answer(answer="first")


async def test_F16_early_skips_function_tools_next_to_a_successful_output_tool() -> None:
    """Observed: the skipped call still gets a ToolReturnPart, with outcome 'success' and a fixed text."""
    ran: list[int] = []
    model = ScriptedModel([respond(call("final_result", {"answer": "A"}, "o1"), call("work", {"n": 1}, "w1"))])

    result = await Agent(model, toolsets=[_work_tools(ran)], output_type=Answer, end_strategy="early").run("hi")

    assert result.output == Answer(answer="A")
    assert ran == []
    assert [(r.tool_name, r.content, r.outcome) for r in tool_returns(result.all_messages())] == [
        ("final_result", "Final result processed.", "success"),
        ("work", NOT_EXECUTED, "success"),
    ]


@pytest.mark.parametrize("wrap", [NativeOutput, PromptedOutput])
async def test_F16_early_structured_text_next_to_calls_ends_the_run_and_skips_them_including_cite(wrap: Any) -> None:
    ran: list[int] = []
    toolset = _work_tools(ran)

    @toolset.tool_plain
    def passages_cite(chunk_ids: list[str]) -> str:
        """Cite passages."""
        ran.append(-1)
        return "cited"

    model = ScriptedModel(
        [respond('{"answer": "N"}', call("work", {"n": 1}, "w1"), call("passages_cite", {"chunk_ids": ["c-1"]}, "pc1"))]
    )

    result = await Agent(model, toolsets=[toolset], output_type=wrap(Answer), end_strategy="early").run("hi")

    assert result.output == Answer(answer="N")
    assert ran == []
    assert [(r.tool_name, r.content) for r in tool_returns(result.all_messages())] == [
        ("work", NOT_EXECUTED),
        ("passages_cite", NOT_EXECUTED),
    ]


async def test_F16_graceful_structured_text_next_to_calls_runs_them_and_continues() -> None:
    ran: list[int] = []
    model = ScriptedModel([respond('{"answer": "N"}', call("work", {"n": 1}, "w1")), respond('{"answer": "N2"}')])

    result = await Agent(model, toolsets=[_work_tools(ran)], output_type=NativeOutput(Answer)).run("hi")

    assert ran == [1]
    assert result.output == Answer(answer="N2")
