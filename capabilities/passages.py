"""Passage search: `passages_search` and `passages_cite` (E6)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

from pydantic_ai import RunContext, Tool
from pydantic_ai.messages import ToolReturn

from .base import EvidenceCapability, EvidenceState, StoreFactory, run_tool
from .formatting import format_results
from .store import CorpusStore
from .tags import TagSigner

SEARCH_LIMIT_REACHED = "Search limit reached. Answer from the results you already have."


class PassagesState(EvidenceState):
    """Persisted under `passages` (docs/design/rules/README.md, "Persisted state"); working-set
    keys are the search query strings."""


@dataclass
class PassageSearchCapability(EvidenceCapability):
    """Searches the corpus and checks citations against what this question retrieved."""

    state_type: ClassVar[type[EvidenceState]] = PassagesState
    heading: ClassVar[str] = "Knowledge-base search"

    _: KW_ONLY
    namespace: str = "passages"
    request_limit: int | None = 20
    max_searches: int = 5
    search_limit: int = 5

    @property
    def search_tool_name(self) -> str:
        return f"{self.namespace}_search"

    def tool_budgets(self) -> dict[str, int]:
        return {self.search_tool_name: self.max_searches}

    def evidence_tools(self) -> list[Tool[Any]]:
        return [run_tool(self.search, name=self.search_tool_name)]

    def tool_guidance(self) -> str:
        return (
            f"- Use {self.search_tool_name} to find passages in the knowledge base; each result starts with "
            "its chunk id in brackets."
        )

    async def search(self, ctx: RunContext[Any], query: str, limit: int | None = None) -> str | ToolReturn:
        """Search the knowledge base for passages relevant to the query.

        Args:
            query: What to look for, in words likely to appear in the documents.
            limit: How many results to return (optional).
        """
        self.spend(self.search_tool_name, SEARCH_LIMIT_REACHED)
        scope = self.run_state().document_filter
        found = await self.with_store(lambda store: store.search(query, limit=limit or self.search_limit, filter=scope))
        results = await self.with_store(lambda store: store.expand_context(found))
        self.remember(query, results)
        self.note_evidence()
        return self.with_pictures(format_results(results), results)


def create_passages(
    store: CorpusStore | StoreFactory,
    signer: TagSigner,
    *,
    vision: bool = False,
    max_searches: int = 5,
    search_limit: int = 5,
    request_limit: int | None = 20,
    instructions_preamble: str | None = None,
    defer_loading: bool = False,
) -> PassageSearchCapability:
    """A public factory (docs/design/rules/README.md, "Public surface of capabilities"). The id
    is passed explicitly, so two of these in one agent collide loudly (F14, E19)."""
    return PassageSearchCapability(
        id="evidence-passages",
        description="Searches the knowledge base and records which passages ground the answer.",
        defer_loading=defer_loading,
        store=store,
        signer=signer,
        vision=vision,
        max_searches=max_searches,
        search_limit=search_limit,
        request_limit=request_limit,
        instructions_preamble=instructions_preamble,
    )
