"""F1, F2, F7, F17, F20: the run lifecycle the capabilities rely on (docs/design/rules/framework.md)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from pydantic_ai import (
    Agent,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    UsageLimitExceeded,
)
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import UsageLimits

from tests.framework_contract.probes import HookLog, entries, hooks
from tests.harness import ScriptedModel, call, respond

# ---------------------------------------------------------------------------------------------- F1


async def test_F1_for_run_runs_once_first_for_every_capability_including_unloaded_deferred() -> None:
    log: list[tuple[Any, ...]] = []
    model = ScriptedModel([respond(call("tool_a", call_id="t1")), respond("done")])
    agent = Agent(
        model,
        capabilities=[
            HookLog(id="a", log=log, tool_name="tool_a"),
            HookLog(id="b", log=log),
            HookLog(id="d", description="never loaded", defer_loading=True, log=log, tool_name="tool_d"),
        ],
    )

    await agent.run("hi")

    for_runs = entries(log, "for_run")
    assert sorted(e[1] for e in for_runs) == ["a", "b", "d"]
    assert hooks(log)[: len(for_runs)] == ["for_run"] * 3
    assert hooks(log, "d") == ["for_run"]


async def test_F1_for_run_sees_history_without_the_new_prompt_and_the_prompt() -> None:
    log: list[tuple[Any, ...]] = []
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("earlier")]), respond("earlier answer")]
    agent = Agent(ScriptedModel([respond("a1"), respond("a2")]), capabilities=[HookLog(id="p", log=log)])

    await agent.run("now", message_history=history)
    await agent.run(message_history=[*history, ModelRequest(parts=[UserPromptPart("typed")])])

    first, second = entries(log, "for_run")
    assert first == ("for_run", "p", 2, "now")
    assert second == ("for_run", "p", 3, None)


@dataclass
class PromptView(AbstractCapability[Any]):
    seen: list[tuple[str, Any]] = field(default_factory=list)

    async def for_run(self, ctx: RunContext[Any]) -> PromptView:
        self.seen.append(("for_run", ctx.prompt))
        return self

    async def before_run(self, ctx: RunContext[Any]) -> None:
        self.seen.append(("before_run", ctx.prompt))

    async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
        self.seen.append(("before_model_request", ctx.prompt))
        return request_context

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        self.seen.append(("after_run", ctx.prompt))
        return result


async def test_F1_promptless_run_sees_the_trailing_user_text_as_prompt_only_from_the_first_request() -> None:
    """Observed beyond the spec: with no prompt and a history ending in U "typed", ctx.prompt is None in for_run,
    before_run and after_run, but "typed" in before_model_request."""
    probe = PromptView(id="v")
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("typed")])]

    await Agent(ScriptedModel([respond("a")]), capabilities=[probe]).run(message_history=history)

    assert probe.seen == [
        ("for_run", None),
        ("before_run", None),
        ("before_model_request", "typed"),
        ("after_run", None),
    ]


@dataclass
class CopyOnRun(AbstractCapability[Any]):
    copied: bool = False
    seen_by_hooks: list[tuple[bool, int]] = field(default_factory=list)

    async def for_run(self, ctx: RunContext[Any]) -> CopyOnRun:
        return replace(self, copied=True)

    async def before_run(self, ctx: RunContext[Any]) -> None:
        self.seen_by_hooks.append((self.copied, id(self)))


async def test_F1_hooks_receive_the_for_run_copy_and_the_registered_instance_is_untouched() -> None:
    registered = CopyOnRun(id="c")
    agent = Agent(ScriptedModel([respond("a1"), respond("a2")]), capabilities=[registered])

    await agent.run("one")
    await agent.run("two")

    assert registered.copied is False
    assert [copied for copied, _ in registered.seen_by_hooks] == [True, True]
    assert id(registered) not in {ident for _, ident in registered.seen_by_hooks}


# ---------------------------------------------------------------------------------------------- F2


def _first_request_counts(log: list[tuple[Any, ...]]) -> tuple[int, int]:
    for_run = entries(log, "for_run")[0]
    before = entries(log, "before_model_request")[0]
    return for_run[2], before[2]


async def test_F2_prompt_run_with_empty_history_appends_the_prompt_request() -> None:
    log: list[tuple[Any, ...]] = []
    await Agent(ScriptedModel([respond("a")]), capabilities=[HookLog(id="p", log=log)]).run("hi")

    assert _first_request_counts(log) == (0, 1)


async def test_F2_promptless_history_ending_in_request_is_sent_without_appending() -> None:
    log: list[tuple[Any, ...]] = []
    model = ScriptedModel([respond("a")])
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("hello")])]

    await Agent(model, capabilities=[HookLog(id="p", log=log)]).run(message_history=history)

    assert _first_request_counts(log) == (1, 1)
    assert len(model.wire(1)) == 1


async def test_F2_promptless_history_ending_in_response_appends_an_empty_request_when_instructions_exist() -> None:
    """Spec difference: the empty request is appended only when the run has instructions (agent or capability).

    Without instructions (next test) the framework sends nothing and ends the run at once.
    """
    log: list[tuple[Any, ...]] = []
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("hello")]), respond("hi there")]
    model = ScriptedModel([respond("a")])

    result = await Agent(model, instructions="Be terse.", capabilities=[HookLog(id="p", log=log)]).run(
        message_history=history
    )

    assert _first_request_counts(log) == (2, 3)
    assert len(model.wires) == 1
    assert result.output == "a"


async def test_F2_promptless_history_ending_in_text_response_without_instructions_never_calls_the_model() -> None:
    """Spec difference: with no instructions anywhere, the last response is taken as the run's answer.

    No request is appended, no model-request hook runs, and the output is the history's last text.
    """
    log: list[tuple[Any, ...]] = []
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("hello")]), respond("hi there")]
    model = ScriptedModel([])

    result = await Agent(model, capabilities=[HookLog(id="p", log=log)]).run(message_history=history)

    assert model.wires == []
    assert "before_model_request" not in hooks(log)
    assert result.output == "hi there"
    assert len(result.all_messages()) == 2


async def test_F2_promptless_history_ending_in_tool_calls_runs_the_calls_before_any_request() -> None:
    log: list[tuple[Any, ...]] = []
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("hello")]), respond(call("tool_p", call_id="t1"))]
    model = ScriptedModel([respond("a")])

    await Agent(model, capabilities=[HookLog(id="p", log=log, tool_name="tool_p")]).run(message_history=history)

    assert entries(log, "tool") == [("tool", "tool_p", 2)]
    assert [e[2] for e in entries(log, "before_model_request")] == [3]
    assert hooks(log).index("tool") < hooks(log).index("before_model_request")


async def test_F2_deferred_tool_results_append_a_request_even_when_history_ends_in_a_tool_return() -> None:
    log: list[tuple[Any, ...]] = []
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("hello")]),
        respond(call("lookup", call_id="l1")),
        ModelRequest(parts=[ToolReturnPart(tool_name="lookup", content="value", tool_call_id="l1")]),
    ]
    agent = Agent(
        ScriptedModel([respond("a")]),
        capabilities=[HookLog(id="p", log=log)],
        output_type=[str, DeferredToolRequests],
    )

    await agent.run(message_history=history, deferred_tool_results=DeferredToolResults())

    assert _first_request_counts(log) == (3, 4)


async def test_F2_each_later_request_adds_two_messages_and_tools_see_the_issuing_response() -> None:
    log: list[tuple[Any, ...]] = []
    model = ScriptedModel(
        [respond(call("tool_p", call_id="t1")), respond(call("tool_p", call_id="t2")), respond("done")]
    )

    await Agent(model, capabilities=[HookLog(id="p", log=log, tool_name="tool_p")]).run("hi")

    assert [e[2] for e in entries(log, "before_model_request")] == [1, 3, 5]
    assert [e[2] for e in entries(log, "tool")] == [2, 4]


# ---------------------------------------------------------------------------------------------- F7

deferring = FunctionToolset()


@deferring.tool_plain
def external() -> str:
    """Handled outside the run."""
    raise CallDeferred()


async def test_F7_after_run_sees_deferred_tool_requests_when_the_run_pauses() -> None:
    log: list[tuple[Any, ...]] = []
    agent = Agent(
        ScriptedModel([respond(call("external", call_id="x1"))]),
        toolsets=[deferring],
        capabilities=[HookLog(id="p", log=log)],
        output_type=[str, DeferredToolRequests],
    )

    result = await agent.run("hi")

    (after,) = entries(log, "after_run")
    assert isinstance(after[3], DeferredToolRequests)
    assert [c.tool_call_id for c in after[3].calls] == ["x1"]
    assert result.output is after[3]


async def test_F7_after_run_skipped_on_usage_limit_but_wrap_run_finally_runs() -> None:
    log: list[tuple[Any, ...]] = []
    model = ScriptedModel([respond(call("tool_p", call_id=f"t{i}")) for i in range(3)])
    agent = Agent(model, capabilities=[HookLog(id="p", log=log, tool_name="tool_p")])

    with pytest.raises(UsageLimitExceeded):
        await agent.run("hi", usage_limits=UsageLimits(request_limit=2))

    assert "after_run" not in hooks(log)
    assert hooks(log)[-1] == "wrap_run:exit"


def _broken_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise RuntimeError("model exploded")


@dataclass
class Recovering(AbstractCapability[Any]):
    errors: list[BaseException] = field(default_factory=list)

    async def on_run_error(self, ctx: RunContext[Any], *, error: BaseException) -> AgentRunResult[Any]:
        self.errors.append(error)
        return AgentRunResult(output="recovered")


async def test_F7_after_run_skipped_on_model_error_unless_on_run_error_recovers() -> None:
    log: list[tuple[Any, ...]] = []
    with pytest.raises(RuntimeError, match="model exploded"):
        await Agent(FunctionModel(_broken_model), capabilities=[HookLog(id="p", log=log)]).run("hi")
    assert "after_run" not in hooks(log)
    assert "wrap_run:exit" in hooks(log)

    log.clear()
    recovering = Recovering(id="r")
    result = await Agent(
        FunctionModel(_broken_model), capabilities=[HookLog(id="p", log=log), recovering]
    ).run("hi")
    assert result.output == "recovered"
    assert [str(e) for e in recovering.errors] == ["model exploded"]
    assert [e[3] for e in entries(log, "after_run")] == ["recovered"]


async def test_F7_cancellation_skips_after_run_and_runs_wrap_run_finally() -> None:
    log: list[tuple[Any, ...]] = []
    entered = asyncio.Event()

    async def hanging(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    task = asyncio.create_task(Agent(FunctionModel(hanging), capabilities=[HookLog(id="p", log=log)]).run("hi"))
    await asyncio.wait_for(entered.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert "after_run" not in hooks(log)
    assert hooks(log)[-1] == "wrap_run:exit"


async def test_F7_after_run_ctx_messages_is_not_the_final_history() -> None:
    """Observed: inside after_run, ctx.messages still has the length of the history passed in."""
    log: list[tuple[Any, ...]] = []
    model = ScriptedModel([respond(call("tool_p", call_id="t1")), respond("done")])

    result = await Agent(model, capabilities=[HookLog(id="p", log=log, tool_name="tool_p")]).run("hi")

    (after,) = entries(log, "after_run")
    assert after[2] == 0
    assert len(result.all_messages()) == 4
    assert len(result.new_messages()) == 4


# --------------------------------------------------------------------------------------------- F17


@dataclass
class RunMeta(AbstractCapability[Any]):
    seen: list[tuple[str, str | None, int, str | None]] = field(default_factory=list)

    def _note(self, hook: str, ctx: RunContext[Any]) -> None:
        self.seen.append((hook, ctx.run_id, ctx.run_step, ctx.conversation_id))

    async def for_run(self, ctx: RunContext[Any]) -> RunMeta:
        self._note("for_run", ctx)
        return self

    async def before_run(self, ctx: RunContext[Any]) -> None:
        self._note("before_run", ctx)

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[Any]) -> list[Any]:
        self._note("prepare_tools", ctx)
        return tool_defs

    async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
        self._note("before_model_request", ctx)
        return request_context

    async def after_model_request(self, ctx: RunContext[Any], *, request_context: Any, response: Any) -> Any:
        self._note("after_model_request", ctx)
        return response

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        self._note("after_run", ctx)
        return result

    def get_toolset(self) -> FunctionToolset[Any]:
        toolset: FunctionToolset[Any] = FunctionToolset()
        seen = self.seen

        @toolset.tool
        def meta(ctx: RunContext[Any]) -> str:
            """Report run metadata."""
            seen.append(("tool", ctx.run_id, ctx.run_step, ctx.conversation_id))
            return "ok"

        return toolset


async def test_F17_run_id_run_step_and_conversation_id_are_available_in_every_hook() -> None:
    """Spec difference: in after_run, ctx.run_step is 0 (the run-start context, like its stale ctx.messages)."""
    probe = RunMeta(id="m")
    model = ScriptedModel([respond(call("meta", call_id="t1")), respond("done"), respond("again")])
    agent = Agent(model, capabilities=[probe])

    first = await agent.run("hi", conversation_id="conv-x")

    assert [(hook, step) for hook, _, step, _ in probe.seen] == [
        ("for_run", 0),
        ("before_run", 0),
        ("prepare_tools", 1),
        ("before_model_request", 1),
        ("after_model_request", 1),
        ("tool", 1),
        ("prepare_tools", 2),
        ("before_model_request", 2),
        ("after_model_request", 2),
        ("after_run", 0),
    ]
    run_ids = {run_id for _, run_id, _, _ in probe.seen}
    assert len(run_ids) == 1 and None not in run_ids
    assert {conv for *_, conv in probe.seen} == {"conv-x"}

    probe.seen.clear()
    await agent.run("more", message_history=first.all_messages())
    assert {conv for *_, conv in probe.seen} == {"conv-x"}
    assert {run_id for _, run_id, _, _ in probe.seen}.isdisjoint(run_ids)


# --------------------------------------------------------------------------------------------- F20


async def test_F20_default_request_limit_is_50_and_hitting_it_raises_without_after_run() -> None:
    assert UsageLimits().request_limit == 50
    log: list[tuple[Any, ...]] = []
    model = ScriptedModel([respond(call("tool_p", call_id=f"t{i}")) for i in range(60)])

    with pytest.raises(UsageLimitExceeded):
        await Agent(model, capabilities=[HookLog(id="p", log=log, tool_name="tool_p")]).run("hi")

    assert len(model.wires) == 50
    assert "after_run" not in hooks(log)
