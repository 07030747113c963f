"""Probe capabilities shared by the framework contract tests.

A probe records which hook ran, in what order and with how many messages, so each F-test can pin
one behaviour of the installed pydantic-ai exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import (
    AbstractCapability,
    WrapModelRequestHandler,
    WrapRunHandler,
)
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import FunctionToolset

Entry = tuple[Any, ...]


@dataclass
class HookLog(AbstractCapability[Any]):
    """Appends `(hook, capability id, len(ctx.messages))` to the shared `log` for every hook it sees.

    `tool_name` gives the probe its own function tool, so deferred-loading and tool-ownership tests
    can see whether the probe's tools were offered.
    """

    log: list[Entry] = field(default_factory=list)
    tool_name: str | None = None

    def _note(self, hook: str, ctx: RunContext[Any], *extra: Any) -> None:
        self.log.append((hook, self.id, len(ctx.messages), *extra))

    async def for_run(self, ctx: RunContext[Any]) -> HookLog:
        self._note("for_run", ctx, ctx.prompt)
        return replace(self)

    async def before_run(self, ctx: RunContext[Any]) -> None:
        self._note("before_run", ctx)

    async def wrap_run(self, ctx: RunContext[Any], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        self._note("wrap_run:enter", ctx)
        try:
            return await handler()
        finally:
            self._note("wrap_run:exit", ctx)

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        self._note("after_run", ctx, result.output)
        return result

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        self._note("prepare_tools", ctx)
        return tool_defs

    async def wrap_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, handler: WrapModelRequestHandler
    ) -> ModelResponse:
        self._note("wrap_model_request:enter", ctx)
        response = await handler(request_context)
        self._note("wrap_model_request:exit", ctx)
        return response

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        self._note("before_model_request", ctx, len(request_context.messages))
        return request_context

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        self._note("after_model_request", ctx)
        return response

    def get_toolset(self) -> FunctionToolset[Any] | None:
        if self.tool_name is None:
            return None
        toolset: FunctionToolset[Any] = FunctionToolset()
        log, name = self.log, self.tool_name

        @toolset.tool(name=name)
        def probe_tool(ctx: RunContext[Any]) -> str:
            """A probe tool."""
            log.append(("tool", name, len(ctx.messages)))
            return f"{name} ran"

        return toolset


def hooks(log: Sequence[Entry], cap_id: str | None = None) -> list[str]:
    """The hook names in `log`, optionally only those of one capability."""
    return [e[0] for e in log if cap_id is None or e[1] == cap_id]


def entries(log: Sequence[Entry], hook: str, cap_id: str | None = None) -> list[Entry]:
    return [e for e in log if e[0] == hook and (cap_id is None or e[1] == cap_id)]


def kinds(messages: Sequence[ModelMessage]) -> list[str]:
    """'R' for a ModelRequest, 'M' for a ModelResponse, in order: a compact history shape."""
    return ["R" if isinstance(m, ModelRequest) else "M" for m in messages]
