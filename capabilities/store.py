"""What evidence capabilities need from a corpus, and the citation a cited chunk becomes (E11);
see docs/design/rules/README.md, "Public surface of capabilities".

The protocol is the only way capabilities reach documents, so a host can lend any store that
speaks it: the SQLite knowledge base in `capabilities.corpus`, or an in-memory fake in tests.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

PICTURE_REF_PREFIX = "#/pictures/"


class Document(BaseModel):
    """One source document; `page_count` is 1 for formats without pages."""

    id: str
    uri: str
    title: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    page_count: int = 1


class Chunk(BaseModel):
    """One stored passage. `ordinal` orders chunks within their document (context expansion)."""

    id: str
    document_id: str
    ordinal: int = 0
    content: str
    headings: list[str] = Field(default_factory=list)
    page_numbers: list[int] = Field(default_factory=list)
    labels: list[str] = Field(default_factory=list)
    doc_item_refs: list[str] = Field(default_factory=list)
    picture_captions: dict[str, str] = Field(default_factory=dict)
    meta: dict[str, Any] = Field(default_factory=dict)


class RetrievedChunk(BaseModel):
    """A search or read result as the model is shown it.

    `pictures` holds image bytes for the caller to attach; it is excluded from every dump so
    that picture bytes never reach persisted state (docs/design/rules/README.md, "Persisted state").
    """

    chunk_id: str
    chunk_ids: list[str] = Field(default_factory=list)
    document_id: str
    document_uri: str
    document_title: str | None = None
    document_meta: dict[str, Any] = Field(default_factory=dict)
    chunk_meta: dict[str, Any] = Field(default_factory=dict)
    headings: list[str] = Field(default_factory=list)
    page_numbers: list[int] = Field(default_factory=list)
    labels: list[str] = Field(default_factory=list)
    content: str = ""
    doc_item_refs: list[str] = Field(default_factory=list)
    picture_captions: dict[str, str] = Field(default_factory=dict)
    pictures: dict[str, bytes] = Field(default_factory=dict, exclude=True)
    score: float = 0.0

    def model_post_init(self, __context: Any) -> None:
        if self.chunk_id not in self.chunk_ids:
            self.chunk_ids = [self.chunk_id, *self.chunk_ids]


class Citation(BaseModel):
    """A cited chunk with everything needed to show it again without the store (E11)."""

    index: int | None = None
    document_id: str
    chunk_id: str
    chunk_ids: list[str] = Field(default_factory=list)
    chunk_meta: dict[str, Any] = Field(default_factory=dict)
    document_uri: str
    document_title: str | None = None
    document_meta: dict[str, Any] = Field(default_factory=dict)
    page_numbers: list[int] = Field(default_factory=list)
    headings: list[str] | None = None
    content: str = ""
    doc_item_refs: list[str] = Field(default_factory=list)
    picture_refs: list[str] = Field(default_factory=list)

    @classmethod
    def from_result(cls, result: RetrievedChunk, *, index: int | None = None) -> Citation:
        """E11: a citation copies what the model saw, including the expanded text."""
        return cls(
            index=index,
            document_id=result.document_id,
            chunk_id=result.chunk_id,
            chunk_ids=list(result.chunk_ids),
            chunk_meta=dict(result.chunk_meta),
            document_uri=result.document_uri,
            document_title=result.document_title,
            document_meta=dict(result.document_meta),
            page_numbers=list(result.page_numbers),
            headings=list(result.headings) or None,
            content=result.content,
            doc_item_refs=list(result.doc_item_refs),
            picture_refs=[ref for ref in result.doc_item_refs if ref.startswith(PICTURE_REF_PREFIX)],
        )

    @classmethod
    def from_chunk(cls, chunk: Chunk, document: Document, *, index: int | None = None) -> Citation:
        """E10.4: an id the model copied from the capsule resolves through the store."""
        return cls.from_result(retrieved_from_chunk(chunk, document), index=index)


def retrieved_from_chunk(chunk: Chunk, document: Document, *, score: float = 0.0) -> RetrievedChunk:
    """The result view of one stored chunk (no picture bytes: callers add those)."""
    return RetrievedChunk(
        chunk_id=chunk.id,
        chunk_ids=[chunk.id],
        document_id=document.id,
        document_uri=document.uri,
        document_title=document.title,
        document_meta=dict(document.meta),
        chunk_meta=dict(chunk.meta),
        headings=list(chunk.headings),
        page_numbers=list(chunk.page_numbers),
        labels=list(chunk.labels),
        content=chunk.content,
        doc_item_refs=list(chunk.doc_item_refs),
        picture_captions=dict(chunk.picture_captions),
        score=score,
    )


@runtime_checkable
class CorpusStore(Protocol):
    """The corpus as evidence capabilities call it. `read` returns None for no such doc/page."""

    async def search(self, query: str, *, limit: int, filter: str | None) -> list[RetrievedChunk]: ...

    async def expand_context(self, results: list[RetrievedChunk]) -> list[RetrievedChunk]: ...

    async def get_chunk(self, chunk_id: str) -> Chunk | None: ...

    async def get_document(self, document_id: str) -> Document | None: ...

    async def list_documents(self, *, filter: str | None, offset: int, limit: int) -> list[Document]: ...

    async def read(
        self, document_id: str, *, page: int | None, section: str | None, filter: str | None
    ) -> list[RetrievedChunk] | None: ...

    async def get_picture_bytes(self, document_id: str, self_ref: str) -> bytes | None: ...

    async def close(self) -> None: ...
