"""A corpus search as a person or an agent reads it: each hit with its document, page, heading
path and score. The MCP `search` tool and `grounded corpus search` both serve it.

It opens a served corpus by name (never a path: `jobs.composition.corpus_path`) the way a worker's
run opens it (`runtime.corpora.open_corpus`): a hybrid corpus is searched with the embedder it
records, resolved from this process's own settings (S1, S3), so a search shows what a job's
`passages_search` would get. A caller scoped to some corpora (H13) is told of those only.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from pydantic import BaseModel
from pydantic_ai.exceptions import ModelAPIError

from capabilities import RetrievedChunk
from capabilities.corpus import VectorIndexCache
from worker.jobs.composition import CompositionError, corpus_path, known_corpora, not_served
from worker.runtime.corpora import open_corpus
from worker.runtime.embedders import EMBEDDER_FAILURES, INGEST_SDK_RETRIES, EmbedderCache
from worker.settings import Settings

MAX_HITS = 50
SEARCH_SDK_RETRIES = INGEST_SDK_RETRIES
"""A search has no retry policy of its own (a job's is H6), so the SDK's backoff rides out a brief
429 or 503 from the embedder, as it does for an ingest."""


class SearchHit(BaseModel):
    document: str  # the title, or the uri for a document without one
    document_id: str
    document_uri: str
    page: int | None  # the first page the chunk is on
    pages: list[int]
    heading_path: list[str]  # the headings above the chunk, outermost first
    score: float  # -bm25, or the fused score of a hybrid corpus: higher is better
    chunk_id: str
    text: str


class SearchUnavailable(RuntimeError):
    """A hybrid corpus whose query embedder this process cannot build or reach: the operator's to
    fix here (GROUNDED_EMBEDDING_ENDPOINTS, a key, a model folder), never a silent BM25 fallback (S4)."""


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


def corpus_named(name: str | None, available: Collection[str]) -> str:
    """The corpus a search means: the named one, or the only one the caller may search. A name
    outside `available` reads as one not served at all, with only `available` listed (H13)."""
    if name is None:
        if len(available) != 1:
            listing = ", ".join(sorted(available)) or "none"
            raise CompositionError(f"name the corpus to search; served here: {listing}")
        [only] = available
        return only
    if name not in available:
        raise not_served(name, available)
    return name


class CorpusSearch:
    """Searches the corpora under one folder. Keeps one embedder per recorded model and the loaded
    vector graphs between searches, as a worker process does; search from one event loop only (an
    embedder's HTTP client belongs to the loop it was first used on)."""

    def __init__(self, corpora_dir: Path, embedders: EmbedderCache) -> None:
        self.corpora_dir = corpora_dir
        self.embedders = embedders
        self.graphs = VectorIndexCache()

    @classmethod
    def from_settings(cls, settings: Settings) -> CorpusSearch:
        return cls(settings.corpora_dir, EmbedderCache.from_settings(settings, max_retries=SEARCH_SDK_RETRIES))

    async def search(
        self, corpus: str | None, query: str, *, limit: int = 5, available: Collection[str] | None = None
    ) -> list[SearchHit]:
        """`available`: the corpora the caller may search (its tenant's, H13); None for every one
        served here. Raises CompositionError for a corpus outside them (naming only those),
        SearchUnavailable when a hybrid corpus's embedder cannot serve the query here, and
        NotACorpusError for a file that is no corpus."""
        allowed = known_corpora(self.corpora_dir) if available is None else available
        name = corpus_named(corpus, allowed)
        path = corpus_path(self.corpora_dir, name)
        try:
            store = open_corpus(path, self.embedders, self.graphs)
            try:
                results = await store.search(query, limit=limit, filter=None)
            finally:
                await store.close()
        except EMBEDDER_FAILURES as exc:
            raise SearchUnavailable(f"corpus {name!r} cannot be searched here: {embedder_problem(exc)}") from None
        return [hit_of(r) for r in results]


def embedder_problem(exc: BaseException) -> str:
    """What went wrong with the embedder, in words: a server's failure names its error type (as a
    job's error would); a refusal to build one says itself what to set."""
    if isinstance(exc, ModelAPIError):
        return f"its embedder failed ({type(exc).__name__}: {exc})"
    return str(exc)
