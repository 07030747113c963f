"""F8, F13, F14: deferred capabilities, ctx.capabilities and capability ids (docs/design/rules/framework.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext, UserError
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.models import ModelRequestContext

from tests.framework_contract.probes import HookLog, hooks
from tests.harness import ScriptedModel, call, respond

# ---------------------------------------------------------------------------------------------- F8


async def test_F8_an_unloaded_deferred_capability_gets_for_run_only() -> None:
    log: list[tuple[Any, ...]] = []
    model = ScriptedModel([respond(call("tool_a", call_id="t1")), respond("done")])
    agent = Agent(
        model,
        capabilities=[
            HookLog(id="a", log=log, tool_name="tool_a"),
            HookLog(id="d", description="later", defer_loading=True, log=log, tool_name="tool_d"),
        ],
    )

    await agent.run("hi")

    assert hooks(log, "d") == ["for_run"]
    assert model.offered(1) == {"load_capability", "tool_a"}
    assert model.offered(2) == {"load_capability", "tool_a"}


async def test_F8_loading_a_deferred_capability_mid_run_enables_its_step_hooks_and_tools_only() -> None:
    """Observed: after load_capability, before_run and wrap_run never run for it (the run already started),
    but its prepare_tools, model-request hooks, after_run and tools do."""
    log: list[tuple[Any, ...]] = []
    model = ScriptedModel([respond(call("load_capability", {"id": "d"}, "l1")), respond("done")])
    agent = Agent(
        model,
        capabilities=[HookLog(id="d", description="later", defer_loading=True, log=log, tool_name="tool_d")],
    )

    await agent.run("hi")

    assert hooks(log, "d") == [
        "for_run",
        "prepare_tools",
        "wrap_model_request:enter",
        "before_model_request",
        "after_model_request",
        "wrap_model_request:exit",
        "after_run",
    ]
    assert model.offered(1) == {"load_capability"}
    assert model.offered(2) == {"load_capability", "tool_d"}


def test_F8_deferred_loading_requires_an_explicit_id() -> None:
    with pytest.raises(UserError, match="Deferred capabilities must use stable explicit `id`"):
        Agent(ScriptedModel([]), capabilities=[HookLog(description="later", defer_loading=True)])


# --------------------------------------------------------------------------------------------- F13


@dataclass
class Registry(AbstractCapability[Any]):
    marker: str = "registered"
    views: list[dict[str, tuple[str, str, bool]]] = field(default_factory=list)

    async def for_run(self, ctx: RunContext[Any]) -> Registry:
        return replace(self, marker="run copy")

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        self.views.append(
            {
                key: (type(cap).__name__, getattr(cap, "marker", ""), cap is self)
                for key, cap in ctx.capabilities.items()
            }
        )
        return request_context


async def test_F13_ctx_capabilities_holds_run_instances_and_framework_entries() -> None:
    """Spec difference (minor): an id-less capability's synthetic key is '<registry:xxxxxx>' (snake-cased class
    name plus a per-run suffix), not '<anon:...>'."""
    named = Registry(id="reg")
    anonymous = Registry()
    agent = Agent(ScriptedModel([respond("a"), respond("b")]), capabilities=[named, anonymous])

    await agent.run("one")
    await agent.run("two")

    view = named.views[0]
    assert view["reg"] == ("Registry", "run copy", True)
    assert view["tool_search"][0] == "ToolSearch"
    synthetic = sorted(k for k in view if k not in {"reg", "tool_search"})
    assert [k.split(":")[0] for k in synthetic] == ["<pending_message_drain_capability", "<registry"]
    assert view[synthetic[0]][0] == "PendingMessageDrainCapability"
    assert view[synthetic[1]] == ("Registry", "run copy", False)
    assert anonymous.views[0][synthetic[1]][2] is True
    assert set(named.views[0]) != set(named.views[1])
    assert len([c for c in view.values() if c[0] == "Registry"]) == 2


# --------------------------------------------------------------------------------------------- F14


@dataclass
class Plain(AbstractCapability[Any]):
    items: list[str] = field(default_factory=list)
    seen: list[list[tuple[str, list[str]]]] = field(default_factory=list)

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        self.seen.append([(k, c.items) for k, c in ctx.capabilities.items() if isinstance(c, Plain)])
        return request_context


@dataclass
class Other(Plain):
    pass


@dataclass
class Singleton(Plain):
    id: str | None = "singleton"


def test_F14_the_same_explicit_id_twice_is_rejected() -> None:
    with pytest.raises(UserError, match="Capability id 'x' is used by multiple capabilities"):
        Agent(ScriptedModel([]), capabilities=[Plain(id="x"), Plain(id="x")])
    with pytest.raises(UserError, match=r"different types \(Other, Plain\)"):
        Agent(ScriptedModel([]), capabilities=[Plain(id="x"), Other(id="x")])


async def test_F14_the_same_explicit_id_twice_in_a_run_is_rejected() -> None:
    agent = Agent(ScriptedModel([respond("a")]))

    with pytest.raises(UserError, match="Capability id 'x' is used by multiple capabilities"):
        await agent.run("hi", capabilities=[Plain(id="x"), Plain(id="x")])


async def test_F14_a_class_level_default_id_merges_duplicates_silently() -> None:
    first, second = Singleton(items=["a"]), Singleton(items=["b"])

    await Agent(ScriptedModel([respond("a")]), capabilities=[first, second]).run("hi")

    (view,) = first.seen + second.seen
    assert view == [("singleton", ["a", "b"])]


async def test_F14_a_run_level_capability_with_the_same_id_replaces_the_agent_level_one() -> None:
    agent_level, run_level = Plain(id="x", items=["agent"]), Plain(id="x", items=["run"])
    agent = Agent(ScriptedModel([respond("a")]), capabilities=[agent_level])

    await agent.run("hi", capabilities=[run_level])

    assert agent_level.seen == []
    assert run_level.seen == [[("x", ["run"])]]
