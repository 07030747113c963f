"""The SQLite knowledge base as a `CorpusStore`: FTS5 search ranked by BM25, documents, chunks
and pictures.

Every method runs its SQL in a worker thread (`asyncio.to_thread`) under a per-instance lock.
Searches take a few milliseconds, but a read of a long document or a search over a large corpus
can take tens, and a worker may be driving several agent runs on one event loop: a thread hop
(~0.1 ms) is cheaper than stalling all of them. The lock is there because a sqlite3 connection
must not be used by two threads at once, and each instance has exactly one connection.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..store import (
    PICTURE_REF_PREFIX,
    Chunk,
    Document,
    RetrievedChunk,
    retrieved_from_chunk,
)
from .chunking import PARAGRAPH_SEPARATOR
from .query import match_expression
from .schema import open_reader, open_writer
from .writer import PAGE_IMAGE_META

if TYPE_CHECKING:
    from .embedding import CorpusEmbedder, EmbedderResolver
    from .hybrid import HybridSearch
    from .vectors import VectorIndexCache

T = TypeVar("T")

BM25_WEIGHTS = (1.0, 2.0, 1.0)
"""Column weights for content, headings and picture captions: a word in a section's heading
says more about the chunk than the same word once in its body."""

_CHUNK_COLUMNS = (
    "c.id, c.document_id, c.ordinal, c.content, c.headings, c.page_numbers, c.labels,"
    " c.doc_item_refs, c.picture_captions, c.meta"
)
_DOCUMENT_COLUMNS = "d.id, d.uri, d.title, d.meta, d.page_count"
_RESULT_COLUMNS = (
    "c.id, c.document_id, d.uri, c.content, d.title,"
    " '[' || c.headings || ',' || c.page_numbers || ',' || c.labels || ',' || c.doc_item_refs || ','"
    " || c.picture_captions || ',' || c.meta || ',' || d.meta || ']'"
)
"""A result's chunk joined with its document, in `_result`'s order. The JSON columns (each a JSON
value as the writer stored it) arrive as one array, so a row is one decode instead of seven:
decoding was the largest cost of a search after SQLite's own."""
_RESULT_ID, _RESULT_CONTENT, _RESULT_WIDTH = 0, 3, 6


class SQLiteCorpus:
    """A corpus file opened for reading (`read_only=True`, what workers use) or, with
    `read_only=False`, opened read-write and created empty when missing (for a host that ingests
    into the file it serves). Either way this class never writes; `ingest()` does."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_only: bool = True,
        embedder: CorpusEmbedder | EmbedderResolver | None = None,
        vector_cache: VectorIndexCache | None = None,
    ) -> None:
        """A corpus with vectors is searched hybrid and needs its embedder: the one it records,
        or a resolver the host builds it with from the recorded name (EmbedderRequired otherwise).
        `vector_cache` shares loaded graphs between instances (a worker's runs)."""
        self.path = Path(path)
        self._conn = open_reader(self.path) if read_only else open_writer(self.path)
        self._lock = threading.Lock()
        try:
            self._hybrid = _hybrid_search(self._conn, self.path, embedder, vector_cache)
        except BaseException:
            self._conn.close()
            raise

    @property
    def hybrid(self) -> bool:
        """False for a BM25-only corpus (one ingested without an embedder)."""
        return self._hybrid is not None

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._lock:
                return work(self._conn)

        return await asyncio.to_thread(locked)

    async def search(self, query: str, *, limit: int, filter: str | None) -> list[RetrievedChunk]:
        """Chunks matching any word of `query`, best first; `score` is -bm25(), so higher is
        better. A hybrid corpus also ranks chunks by their vectors' similarity to the query and
        fuses both rankings (hybrid.py; `score` is then the fused score). `filter` restricts the
        search to one document (its id or uri)."""
        expression = match_expression(query)
        if expression is None or limit <= 0:
            return []
        hybrid = self._hybrid
        if hybrid is None:
            return await self._run(lambda conn: _search(conn, expression, limit, filter))
        vector = await hybrid.embed(query)
        return await self._run(lambda conn: hybrid.search(conn, expression, vector, limit, filter))

    async def expand_context(self, results: list[RetrievedChunk]) -> list[RetrievedChunk]:
        """Each hit joined with its neighbours (ordinal ±1 in its document), keeping the hit's
        `chunk_id` and `score`. A chunk already shown in a higher-ranked result is left out of
        later ones, and a hit already shown that way is dropped, so no text is shown twice. A
        neighbour without text (a PDF page that is only its image) adds no context and is left
        out, so a result's pages are pages whose text it shows."""
        return await self._run(lambda conn: _expand(conn, results))

    async def get_chunk(self, chunk_id: str) -> Chunk | None:
        def work(conn: sqlite3.Connection) -> Chunk | None:
            row = conn.execute(f"SELECT {_CHUNK_COLUMNS} FROM chunks c WHERE c.id = ?", (chunk_id,)).fetchone()
            return None if row is None else _chunk(row)

        return await self._run(work)

    async def get_document(self, document_id: str) -> Document | None:
        """By id, or by uri."""
        return await self._run(lambda conn: _find_document(conn, document_id))

    async def list_documents(self, *, filter: str | None, offset: int, limit: int) -> list[Document]:
        """Documents in uri order (stable across re-ingests); just the filter's document, if any."""

        def work(conn: sqlite3.Connection) -> list[Document]:
            scope, args = _document_scope(filter)
            rows = conn.execute(
                f"SELECT {_DOCUMENT_COLUMNS} FROM documents d WHERE {scope} ORDER BY d.uri LIMIT ? OFFSET ?",
                (*args, max(limit, 0), max(offset, 0)),
            ).fetchall()
            return [_document(row) for row in rows]

        return await self._run(work)

    async def read(
        self, document_id: str, *, page: int | None, section: str | None, filter: str | None
    ) -> list[RetrievedChunk] | None:
        """A page's chunks (`page`), a section's (`section` matches any heading of a chunk's
        heading path, ignoring case and extra spaces, so a section includes its subsections), or
        the first page's (neither). None for an unknown document, a page outside
        1..page_count, a section no chunk has, or a document outside `filter`. A page in range
        without text gives []."""
        return await self._run(lambda conn: _read(conn, document_id, page, section, filter))

    async def get_picture_bytes(self, document_id: str, self_ref: str) -> bytes | None:
        return await self._run(lambda conn: _picture(conn, document_id, self_ref))

    def data_version(self) -> int:
        """SQLite's `PRAGMA data_version`: it moves whenever another connection commits to the file,
        so a host that keeps this instance between runs can tell whether it is still current."""
        with self._lock:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    async def close(self) -> None:
        """Idempotent."""
        await self._run(lambda conn: conn.close())


def _hybrid_search(
    conn: sqlite3.Connection,
    path: Path,
    embedder: CorpusEmbedder | EmbedderResolver | None,
    vector_cache: VectorIndexCache | None,
) -> HybridSearch | None:
    from .embedding import CorpusEmbedder, EmbedderRequired, NoVectors
    from .vectors import VectorIndexCache, recorded_embedder

    info = recorded_embedder(conn)
    if info is None:
        if isinstance(embedder, CorpusEmbedder):
            raise NoVectors(embedder.model)
        return None
    if embedder is None:
        raise EmbedderRequired(info)
    from .hybrid import HybridSearch

    chosen = embedder if isinstance(embedder, CorpusEmbedder) else embedder(info.model)
    return HybridSearch(path, info, chosen, vector_cache or VectorIndexCache(max_size=1))


def _find_document(conn: sqlite3.Connection, reference: str) -> Document | None:
    """Documents are named by id or by uri, wherever a caller names one (filters included)."""
    row = conn.execute(
        f"SELECT {_DOCUMENT_COLUMNS} FROM documents d WHERE d.id = ? OR d.uri = ?", (reference, reference)
    ).fetchone()
    return None if row is None else _document(row)


def _document_scope(filter: str | None) -> tuple[str, tuple[str, ...]]:
    """A condition on `documents d`: a document filter names one document by id or by uri."""
    if filter is None:
        return "1", ()
    return "(d.id = ? OR d.uri = ?)", (filter, filter)


def _search(conn: sqlite3.Connection, expression: str, limit: int, filter: str | None) -> list[RetrievedChunk]:
    return results_for(conn, bm25_ranked(conn, expression, limit, document_span(conn, filter)))


def document_span(conn: sqlite3.Connection, filter: str | None) -> tuple[str, int, int] | None:
    """The filter's document id and the range of its chunk seqs, or None without a filter. A
    document's chunks are written in one transaction with consecutive seqs (writer.py), so a
    filtered search scans only that rowid range; an unknown document has the empty range."""
    if filter is None:
        return None
    span = conn.execute(
        "SELECT d.id, min(c.seq), max(c.seq) FROM documents d JOIN chunks c ON c.document_id = d.id"
        " WHERE d.id = ? OR d.uri = ? GROUP BY d.id",
        (filter, filter),
    ).fetchone()
    return ("", 1, 0) if span is None else (span[0], span[1], span[2])


def bm25_ranked(
    conn: sqlite3.Connection, expression: str, limit: int, span: tuple[str, int, int] | None
) -> list[tuple[int, float]]:
    """(seq, -bm25) of the best `limit` matches. Within a span the join re-checks the document,
    so the range only saves work, and the limit applies after the check, so it cannot cut hits.
    Unscoped, the FTS table is asked alone: the range and the join cost about a millisecond a
    search at 100k chunks, and every FTS row is a chunk."""
    rank = f"bm25(chunks_fts, {', '.join(str(w) for w in BM25_WEIGHTS)})"
    if span is None:
        rows = conn.execute(
            f"SELECT rowid, -{rank} AS score FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY score DESC LIMIT ?",
            (expression, limit),
        ).fetchall()
        return [(row[0], row[1]) for row in rows]
    document_id, low, high = span
    rows = conn.execute(
        f"SELECT hits.rowid, hits.score FROM ("
        f"  SELECT rowid, -{rank} AS score FROM chunks_fts"
        f"  WHERE chunks_fts MATCH :expression AND rowid BETWEEN :low AND :high"
        f") hits JOIN chunks c ON c.seq = hits.rowid"
        f" WHERE c.document_id = :document ORDER BY hits.score DESC LIMIT :limit",
        {"expression": expression, "low": low, "high": high, "document": document_id, "limit": limit},
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def results_for(conn: sqlite3.Connection, ranked: Sequence[tuple[int, float]]) -> list[RetrievedChunk]:
    """The result view of chunks given as (seq, score), in the given order."""
    if not ranked:
        return []
    marks = ",".join("?" * len(ranked))
    rows = conn.execute(
        f"SELECT {_RESULT_COLUMNS}, c.seq FROM chunks c JOIN documents d ON d.id = c.document_id"
        f" WHERE c.seq IN ({marks})",
        [seq for seq, _ in ranked],
    ).fetchall()
    by_seq = {row[_RESULT_WIDTH]: row for row in rows}
    results = [_result(by_seq[seq], score=score) for seq, score in ranked if seq in by_seq]
    return _with_pictures(conn, results)


def _result(row: Sequence[Any], *, score: float = 0.0) -> RetrievedChunk:
    """A `_RESULT_COLUMNS` row as a result: what `retrieved_from_chunk` gives for the row's chunk
    and document, without building those two models first."""
    headings, page_numbers, labels, refs, captions, chunk_meta, document_meta = json.loads(row[5])
    return RetrievedChunk(
        chunk_id=row[0],
        document_id=row[1],
        document_uri=row[2],
        content=row[3],
        document_title=row[4],
        headings=headings,
        page_numbers=page_numbers,
        labels=labels,
        doc_item_refs=refs,
        picture_captions=captions,
        chunk_meta=chunk_meta,
        document_meta=document_meta,
        score=score,
    )


def _with_pictures(conn: sqlite3.Connection, results: list[RetrievedChunk]) -> list[RetrievedChunk]:
    """Attaches the bytes of every picture a result refers to (pictures are never persisted
    with results, see RetrievedChunk)."""
    wanted = {(r.document_id, ref) for r in results for ref in r.doc_item_refs if ref.startswith(PICTURE_REF_PREFIX)}
    if not wanted:
        return results
    found = {key: _picture(conn, *key) for key in sorted(wanted)}
    for result in results:
        for ref in result.doc_item_refs:
            data = found.get((result.document_id, ref))
            if data is not None:
                result.pictures[ref] = data
    return results


def _picture(conn: sqlite3.Connection, document_id: str, self_ref: str) -> bytes | None:
    row = conn.execute(
        "SELECT bytes FROM pictures WHERE document_id = ? AND self_ref = ?", (document_id, self_ref)
    ).fetchone()
    return None if row is None else bytes(row[0])


def _expand(conn: sqlite3.Connection, results: list[RetrievedChunk]) -> list[RetrievedChunk]:
    shown: set[str] = set()
    expanded: list[RetrievedChunk] = []
    windows = _windows(conn, [hit.chunk_id for hit in results])
    for hit in results:
        if hit.chunk_id in shown:
            continue
        rows = windows.get(hit.chunk_id, [])
        window = [_result(row) for row in rows
                  if row[_RESULT_ID] == hit.chunk_id or (row[_RESULT_ID] not in shown and row[_RESULT_CONTENT])]
        if not window:
            expanded.append(hit)
            shown.add(hit.chunk_id)
            continue
        shown.update(part.chunk_id for part in window)
        expanded.append(_merge(hit, window))
    return _with_pictures(conn, expanded)


def _windows(conn: sqlite3.Connection, hit_ids: Sequence[str]) -> dict[str, list[Any]]:
    """Each hit's chunk rows with its neighbours' (ordinal ±1 in its document), in document order,
    fetched in one query for all hits: a statement per hit cost more than the rows it returned."""
    if not hit_ids:
        return {}
    marks = ",".join("?" * len(hit_ids))
    rows = conn.execute(
        f"SELECT {_RESULT_COLUMNS}, h.id FROM chunks h"
        " JOIN chunks c ON c.document_id = h.document_id AND c.ordinal BETWEEN h.ordinal - 1 AND h.ordinal + 1"
        f" JOIN documents d ON d.id = c.document_id WHERE h.id IN ({marks}) ORDER BY h.id, c.ordinal",
        list(dict.fromkeys(hit_ids)),
    ).fetchall()
    windows: dict[str, list[Any]] = {}
    for row in rows:
        windows.setdefault(row[_RESULT_WIDTH], []).append(row)
    return windows


def _merge(hit: RetrievedChunk, window: list[RetrievedChunk]) -> RetrievedChunk:
    """One result from consecutive chunks: the hit's identity and metadata, everyone's text,
    pages, labels, refs and captions in document order. D7: a neighbour's page image is left
    out (its text is context; the hit's own page is the one to look at), so a PDF result carries
    one page image, not three."""
    return hit.model_copy(
        update={
            "chunk_ids": [part.chunk_id for part in window],
            "content": PARAGRAPH_SEPARATOR.join(part.content for part in window if part.content),
            "page_numbers": sorted({page for part in window for page in part.page_numbers}),
            "labels": _ordered_union(part.labels for part in window),
            "doc_item_refs": _ordered_union(_own_refs(part, hit) for part in window),
            "picture_captions": {ref: c for part in window for ref, c in part.picture_captions.items()},
            "pictures": {},
        }
    )


def _own_refs(part: RetrievedChunk, hit: RetrievedChunk) -> list[str]:
    page_image = part.chunk_meta.get(PAGE_IMAGE_META)
    if part.chunk_id == hit.chunk_id or page_image is None:
        return part.doc_item_refs
    return [ref for ref in part.doc_item_refs if ref != page_image]


def _ordered_union(lists: Iterable[list[str]]) -> list[str]:
    return list(dict.fromkeys(item for items in lists for item in items))


def _read(
    conn: sqlite3.Connection, document_ref: str, page: int | None, section: str | None, filter: str | None
) -> list[RetrievedChunk] | None:
    document = _find_document(conn, document_ref)
    if document is None:
        return None
    if filter is not None and filter not in (document.id, document.uri):
        return None
    rows = conn.execute(
        f"SELECT {_CHUNK_COLUMNS} FROM chunks c WHERE c.document_id = ? ORDER BY c.ordinal", (document.id,)
    ).fetchall()
    chunks = [_chunk(chunk_row) for chunk_row in rows]
    if page is not None:
        if not 1 <= page <= document.page_count:
            return None
        chosen = [chunk for chunk in chunks if page in chunk.page_numbers]
    elif section is not None:
        wanted = _normalised(section)
        chosen = [chunk for chunk in chunks if any(_normalised(h) == wanted for h in chunk.headings)]
        if not chosen:
            return None
    else:
        first_page = chunks[0].page_numbers[:1] if chunks else []
        chosen = [chunk for chunk in chunks if first_page and first_page[0] in chunk.page_numbers]
    return _with_pictures(conn, [retrieved_from_chunk(chunk, document) for chunk in chosen])


def _normalised(heading: str) -> str:
    return " ".join(heading.split()).casefold()


def _chunk(row: Sequence[Any]) -> Chunk:
    return Chunk(
        id=row[0],
        document_id=row[1],
        ordinal=row[2],
        content=row[3],
        headings=json.loads(row[4]),
        page_numbers=json.loads(row[5]),
        labels=json.loads(row[6]),
        doc_item_refs=json.loads(row[7]),
        picture_captions=json.loads(row[8]),
        meta=json.loads(row[9]),
    )


def _document(row: Sequence[Any]) -> Document:
    return Document(id=row[0], uri=row[1], title=row[2], meta=json.loads(row[3]), page_count=row[4])
