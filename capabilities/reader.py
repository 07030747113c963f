"""Document reader: `reader_list_documents`, `reader_read` and `reader_cite` (E7, E8)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

from pydantic_ai import RunContext, Tool, ToolFailed
from pydantic_ai.messages import ToolReturn

from .base import EvidenceCapability, EvidenceState, StoreFactory, run_tool
from .formatting import EMPTY_PAGE, format_documents, format_results
from .store import CorpusStore
from .tags import TagSigner

LISTING_LIMIT_REACHED = "Listing limit reached. Answer from the documents already listed."
READ_LIMIT_REACHED = "Read limit reached. Answer from the pages you already have."
PAGE_OR_SECTION = "Give either a page or a section, not both."


class ReaderState(EvidenceState):
    """Persisted under `reader` (docs/design/rules/README.md, "Persisted state"). Working-set keys
    are `read:<document_id>:<page|section|start>`; listings are not chunks and are not kept."""


def read_key(document_id: str, page: int | None, section: str | None) -> str:
    """E8. One working-set entry per place read."""
    where = str(page) if page is not None else section if section is not None else "start"
    return f"read:{document_id}:{where}"


def not_found_message(document_id: str, page: int | None, section: str | None) -> str:
    """E8. Names what was not found, so the model can correct the call."""
    if page is not None:
        return f"Page {page} of document {document_id!r} was not found."
    if section is not None:
        return f"Section {section!r} of document {document_id!r} was not found."
    return f"Document {document_id!r} was not found."


@dataclass
class DocumentReaderCapability(EvidenceCapability):
    """Lists and reads whole documents, and checks citations against what this question read."""

    state_type: ClassVar[type[EvidenceState]] = ReaderState
    heading: ClassVar[str] = "Document reader"

    _: KW_ONLY
    namespace: str = "reader"
    request_limit: int | None = 30
    max_listings: int = 3
    max_reads: int = 8

    @property
    def list_tool_name(self) -> str:
        return f"{self.namespace}_list_documents"

    @property
    def read_tool_name(self) -> str:
        return f"{self.namespace}_read"

    def tool_budgets(self) -> dict[str, int]:
        return {self.list_tool_name: self.max_listings, self.read_tool_name: self.max_reads}

    def evidence_tools(self) -> list[Tool[Any]]:
        return [run_tool(self.list_documents, name=self.list_tool_name), run_tool(self.read, name=self.read_tool_name)]

    def tool_guidance(self) -> str:
        return (
            f"- Use {self.list_tool_name} to see which documents exist, and {self.read_tool_name} to read a "
            "document's page or section; each passage read starts with its chunk id in brackets. A listing "
            f"has no chunk ids: an answer resting only on it is declared with {self.cite_tool_name} and an "
            "empty list."
        )

    async def list_documents(self, ctx: RunContext[Any], offset: int = 0, limit: int = 50) -> str:
        """List the documents in the knowledge base.

        Args:
            offset: How many documents to skip.
            limit: How many documents to list.
        """
        self.spend(self.list_tool_name, LISTING_LIMIT_REACHED)
        scope = self.run_state().document_filter
        documents = await self.with_store(lambda store: store.list_documents(filter=scope, offset=offset, limit=limit))
        self.note_evidence()
        return format_documents(documents)

    async def read(
        self, ctx: RunContext[Any], document_id: str, page: int | None = None, section: str | None = None
    ) -> str | ToolReturn:
        """Read a document: one page, one section, or (with neither) its start.

        Args:
            document_id: The id shown in brackets by the document listing.
            page: The page number to read (optional).
            section: The section heading to read (optional).
        """
        if page is not None and section is not None:
            raise ToolFailed(PAGE_OR_SECTION)
        self.spend(self.read_tool_name, READ_LIMIT_REACHED)
        scope = self.run_state().document_filter
        results = await self.with_store(
            lambda store: store.read(document_id, page=page, section=section, filter=scope)
        )
        if results is None:
            raise ToolFailed(not_found_message(document_id, page, section))
        self.remember(read_key(document_id, page, section), results)
        self.note_evidence()
        return self.with_pictures(format_results(results, empty=EMPTY_PAGE), results)


def create_reader(
    store: CorpusStore | StoreFactory,
    signer: TagSigner,
    *,
    vision: bool = False,
    max_listings: int = 3,
    max_reads: int = 8,
    request_limit: int | None = 30,
    instructions_preamble: str | None = None,
    defer_loading: bool = False,
) -> DocumentReaderCapability:
    """A public factory (docs/design/rules/README.md, "Public surface of capabilities"). The id
    is passed explicitly, so two of these in one agent collide loudly (F14, E19)."""
    return DocumentReaderCapability(
        id="evidence-reader",
        description="Lists and reads documents and records which passages ground the answer.",
        defer_loading=defer_loading,
        store=store,
        signer=signer,
        vision=vision,
        max_listings=max_listings,
        max_reads=max_reads,
        request_limit=request_limit,
        instructions_preamble=instructions_preamble,
    )
