"""Tool budgets, the request limit, the cite grace window and the notices about them (E12-E14).

Pure functions over the counters a run instance keeps. `prepare_tools` and the notice are both
computed from the counters as they stand before a request's own increments, so a notice can
never name a tool that is withdrawn on the same request (E14, R28).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.tools import ToolDefinition

GRACE_REQUESTS = 2
"""E12. Requests past the limit on which cite stays offered: enough to record what was found,
bounded so that a model that keeps calling cite cannot spend the run's usage limit (R29)."""


def limit_reached(request_count: int, request_limit: int | None) -> bool:
    """E12. `None` disables the limit."""
    return request_limit is not None and request_count >= request_limit


def called_own_tool(messages: Sequence[ModelMessage], tool_names: Collection[str]) -> bool:
    """E12. Whether the most recent response called one of these tools. Requests spent on other
    capabilities say nothing about a loop on this one, so only our own calls use up grace (R30)."""
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            return any(isinstance(p, ToolCallPart) and p.tool_name in tool_names for p in message.parts)
    return False


def spent_tools(uses: Mapping[str, int], budgets: Mapping[str, int]) -> list[str]:
    """The evidence tools whose budget is used up, in declaration order."""
    return [name for name, budget in budgets.items() if uses.get(name, 0) >= budget]


def tools_to_offer(
    tool_defs: list[ToolDefinition],
    *,
    capability_id: str,
    cite_tool: str,
    cite_available: bool,
    limit_reached: bool,
) -> list[ToolDefinition]:
    """E13. Touches only this capability's tools. Tools with a spent budget stay declared and fail
    when called: withdrawing a tool the model still calls costs unknown-tool retries and can abort
    the run (F10, R27), whereas a declared tool that fails only wastes a request."""
    if cite_available and not limit_reached:
        return tool_defs

    def keep(tool: ToolDefinition) -> bool:
        if tool.capability_id != capability_id:
            return True
        return cite_available and tool.name == cite_tool

    return [t for t in tool_defs if keep(t)]


def withdrawn_notice(namespace: str) -> str:
    """E14.1. Names none of the tools, since none of them is declared any more."""
    return (
        f"The {namespace} tools have been withdrawn for the rest of this question. "
        "Answer from the evidence already gathered."
    )


def request_limit_notice(namespace: str, cite_tool: str) -> str:
    """E14.2."""
    return (
        f"{namespace} is at its request limit; of its tools only {cite_tool} is still offered. "
        "Record the supporting chunk_ids with it, then answer from what you have."
    )


def exhausted_notice(spent: Sequence[str], unspent: Sequence[str], cite_tool: str) -> str:
    """E14.3. Points at what is still useful: the unspent evidence tools, or citing and answering."""
    verb = "is" if len(spent) == 1 else "are"
    head = f"{', '.join(spent)} {verb} exhausted for this question; further calls fail."
    if unspent:
        remain = "remains" if len(unspent) == 1 else "remain"
        return (
            f"{head} {', '.join(unspent)} {remain} available for more evidence; "
            f"otherwise record the supporting chunk_ids with {cite_tool} and answer."
        )
    return f"{head} Answer from what was gathered and record it with {cite_tool}."


def budget_notice(
    namespace: str,
    *,
    cite_tool: str,
    cite_available: bool,
    limit_reached: bool,
    spent: Sequence[str],
    unspent: Sequence[str],
) -> str | None:
    """E14. At most one notice per capability and request, in priority order."""
    if not cite_available:
        return withdrawn_notice(namespace)
    if limit_reached:
        return request_limit_notice(namespace, cite_tool)
    if spent:
        return exhausted_notice(spent, unspent, cite_tool)
    return None
