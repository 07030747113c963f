"""Hybrid search: BM25 and vector neighbours, fused, behind the same `CorpusStore.search`.

BM25 finds the passage that uses the reader's words; the vectors find the one that means what the
reader asked in other words ("my script waits forever" for a page about timeouts). Each side
proposes `CANDIDATES` chunks, and their scores are blended (fusion.py: BM25 relative to the query's
best match, cosines as they are), so a chunk either side ranks highly can reach the top `limit`.
The result's `score` is the blend.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass

from ..store import RetrievedChunk
from .embedding import CorpusEmbedder, EmbedderInfo, EmbedderMismatch, Vectors, dimension_mismatch
from .fusion import FUSION_WEIGHTS, relative_blend
from .sqlite import bm25_ranked, document_span, results_for
from .vectors import VectorIndexCache, nearest, start_graph_search

CANDIDATES = 50
"""Chunks each ranking proposes to the fusion: far more than a search shows, so a chunk that one
side ranks 30th and the other 3rd is still seen by both."""


@dataclass
class HybridSearch:
    """What a hybrid corpus needs besides its connection: the corpus's own embedder and where the
    process keeps loaded graphs."""

    path: str | os.PathLike[str]
    info: EmbedderInfo
    embedder: CorpusEmbedder
    graphs: VectorIndexCache

    def __post_init__(self) -> None:
        if self.embedder.model != self.info.model:
            raise EmbedderMismatch(self.info, self.embedder.model)

    async def embed(self, query: str) -> Vectors:
        """Once per search call. A provider failure propagates as the model error it is (a host
        retries it like any model request); it never degrades the search to BM25 alone."""
        vector = await self.embedder.embed_query(query)
        if vector.shape != (self.info.dimensions,):
            raise dimension_mismatch(self.info.model, self.info.dimensions, int(vector.shape[-1]))
        return vector

    def search(
        self, conn: sqlite3.Connection, expression: str, vector: Vectors, limit: int, filter: str | None
    ) -> list[RetrievedChunk]:
        span = document_span(conn, filter)
        if span is not None and span[1] > span[2]:
            return []
        count = max(CANDIDATES, limit)
        graph = self.graphs.get(self.path, conn) if span is None else None
        graph_hits = start_graph_search(graph, vector, count)
        lexical = bm25_ranked(conn, expression, count, span)
        semantic = nearest(conn, graph, vector, count, None if span is None else span[1:], graph_hits)
        fused = relative_blend(lexical, semantic, weights=FUSION_WEIGHTS)[:limit]
        return results_for(conn, fused)
