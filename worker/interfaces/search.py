"""A corpus search as a person or an agent reads it: each hit with its document, page, heading
path and score. The MCP `search` tool serves it; `grounded corpus search` is meant to share it.

It opens a served corpus by name (never a path: `jobs.composition.corpus_path`), reads it with the
same BM25 search the evidence capabilities use, and closes it again.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from capabilities import RetrievedChunk
from capabilities.corpus import SQLiteCorpus
from worker.jobs.composition import CompositionError, corpus_path, known_corpora

MAX_HITS = 50


class SearchHit(BaseModel):
    document: str  # the title, or the uri for a document without one
    document_id: str
    document_uri: str
    page: int | None  # the first page the chunk is on
    pages: list[int]
    heading_path: list[str]  # the headings above the chunk, outermost first
    score: float  # -bm25: higher is better
    chunk_id: str
    text: str


def hit_of(result: RetrievedChunk) -> SearchHit:
    return SearchHit(
        document=result.document_title or result.document_uri,
        document_id=result.document_id,
        document_uri=result.document_uri,
        page=result.page_numbers[0] if result.page_numbers else None,
        pages=list(result.page_numbers),
        heading_path=list(result.headings),
        score=round(result.score, 4),
        chunk_id=result.chunk_id,
        text=result.content,
    )


def corpus_named(corpora_dir: Path, name: str | None) -> str:
    """The corpus a search means: the named one, or the only one served here."""
    if name is not None:
        return name
    served = known_corpora(corpora_dir)
    if len(served) != 1:
        listing = ", ".join(served) or "none"
        raise CompositionError(f"name the corpus to search; served here: {listing}")
    return served[0]


async def search_corpus(corpora_dir: Path, corpus: str | None, query: str, *, limit: int = 5) -> list[SearchHit]:
    """Raises CompositionError for a corpus that is not served here (naming those that are), and
    ValueError for a limit outside 1..MAX_HITS."""
    if not 1 <= limit <= MAX_HITS:
        raise ValueError(f"limit must be between 1 and {MAX_HITS}, got {limit}")
    store = SQLiteCorpus(corpus_path(corpora_dir, corpus_named(corpora_dir, corpus)))
    try:
        results = await store.search(query, limit=limit, filter=None)
    finally:
        await store.close()
    return [hit_of(r) for r in results]
