"""Chunk vectors in the corpus file, and the nearest-neighbour index over them.

Everything lives in the one SQLite file, so a corpus is still copied, mounted read-only and
backed up as one file, and a vector is written in the same transaction as its chunk
(writer.write_document): readers never see a chunk without its vector or the reverse.

- `chunk_vectors`: one float32, L2-normalised row per chunk. `vid` is AUTOINCREMENT, so an id
  is never reused: the index can tell a vector it has not seen from one it has.
- The HNSW graph (usearch) is serialised into `vector_index_parts` after an ingest
  (`sync_index`), with its newest `vid` in the `vector_index` corpus_meta key. Exact search over
  100k 384-dimensional vectors takes 20-40 ms on the development machine; the graph answers in
  about a millisecond (docs/benchmarks.md). Vectors written after the graph (an ingest still
  running, or one that stopped before syncing) are searched exactly and merged in, and graph
  hits whose chunk is gone drop out at the join, so a stale graph is slower, never wrong.
- A search scoped to one document reads that document's vectors and ranks them exactly.

Readers load the graph once per process and index version (`VectorIndexCache`): a worker opens a
corpus per run, and loading the graph of a 100k-chunk corpus takes a few hundred milliseconds.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel

if TYPE_CHECKING:
    from usearch.index import Index

from .embedding import EmbedderInfo, EmbedderMismatch, EmbedderRequired, EmbeddingError, Vectors, dimension_mismatch

EMBEDDER_KEY = "embedder"
"""corpus_meta key: JSON EmbedderInfo ({model, dimensions, metric}); absent for a BM25-only corpus."""
INDEX_KEY = "vector_index"
"""corpus_meta key: JSON IndexMeta of the stored graph."""

INDEX_PART_BYTES = 64 << 20
"""The graph is stored in parts: SQLite refuses values over 1 GB, and smaller rows keep the
write of a large graph from needing one huge buffer in SQLite's page cache."""
CONNECTIVITY = 16
EXPANSION_ADD = 128
EXPANSION_SEARCH = 128
"""HNSW breadth at query time. 64 would save about 1.2 ms of CPU a search at 100k chunks, but the
benchmark's random vectors cannot show what it costs in recall (docs/benchmarks.md), so it stays."""
GRAPH_SEARCH_THREADS = 4
"""Graph searches running at once in a process, beside their BM25 halves (a search takes ~1-3 ms)."""
REBUILD_FRACTION = 0.25
"""Removed vectors stay in the graph as tombstones; past this share of them it is rebuilt."""

_DDL = """
CREATE TABLE IF NOT EXISTS chunk_vectors (
    vid    INTEGER PRIMARY KEY AUTOINCREMENT,
    seq    INTEGER NOT NULL UNIQUE,
    vector BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS vector_index_parts (
    part  INTEGER PRIMARY KEY,
    bytes BLOB NOT NULL
);
"""
STAGING = "chunk_vectors_staging"
"""Where a re-embedding collects the new model's vectors before they replace the old ones."""


class IndexMeta(BaseModel):
    """The stored graph: `id` changes on every save (readers cache by it); it holds every vector
    with vid <= `max_vid` that existed when it was built."""

    id: str
    max_vid: int
    count: int
    parts: int


# --- the recorded embedder -------------------------------------------------------------------


def recorded_embedder(conn: sqlite3.Connection) -> EmbedderInfo | None:
    row = conn.execute("SELECT value FROM corpus_meta WHERE key = ?", (EMBEDDER_KEY,)).fetchone()
    return None if row is None else EmbedderInfo.model_validate_json(row[0])


def _index_meta(conn: sqlite3.Connection) -> IndexMeta | None:
    row = conn.execute("SELECT value FROM corpus_meta WHERE key = ?", (INDEX_KEY,)).fetchone()
    return None if row is None else IndexMeta.model_validate_json(row[0])


def _set_meta(conn: sqlite3.Connection, key: str, value: BaseModel) -> None:
    conn.execute("INSERT OR REPLACE INTO corpus_meta (key, value) VALUES (?, ?)", (key, value.model_dump_json()))


def ensure_tables(conn: sqlite3.Connection) -> None:
    """Created with the first vectors, so a BM25-only corpus keeps exactly the schema it had."""
    for statement in _DDL.split(";"):
        if statement.strip():
            conn.execute(statement)


def _has_vectors_table(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chunk_vectors'").fetchone() is not None


# --- writing (inside writer.write_document's transaction) ------------------------------------


@dataclass(frozen=True)
class ChunkVectors:
    """One document's vectors, a row per chunk in chunk order, from the named model."""

    model: str
    matrix: Vectors


def store_document_vectors(conn: sqlite3.Connection, seqs: Sequence[int], vectors: ChunkVectors | None) -> None:
    """A hybrid corpus takes a document only with a vector for each chunk, from its own model; a
    BM25-only corpus takes none (recording an embedder is ingest's first step, not a side effect)."""
    info = recorded_embedder(conn)
    if info is None:
        if vectors is not None:
            raise EmbeddingError("this corpus has no embedder recorded, so it stores no vectors; ingest with --embedder")
        return
    if vectors is None:
        raise EmbedderRequired(info)
    if vectors.model != info.model:
        raise EmbedderMismatch(info, vectors.model)
    if len(seqs) and vectors.matrix.shape != (len(seqs), info.dimensions):
        raise dimension_mismatch(info.model, info.dimensions, int(vectors.matrix.shape[-1]))
    conn.executemany(
        "INSERT INTO chunk_vectors (seq, vector) VALUES (?, ?)",
        [(seq, row.astype(np.float32).tobytes()) for seq, row in zip(seqs, vectors.matrix, strict=True)],
    )


def delete_document_vectors(conn: sqlite3.Connection, document_id: str) -> None:
    if _has_vectors_table(conn):
        conn.execute(
            "DELETE FROM chunk_vectors WHERE seq IN (SELECT seq FROM chunks WHERE document_id = ?)", (document_id,)
        )


# --- switching embedders, whole or not at all ----------------------------------------------


def begin_staging(conn: sqlite3.Connection) -> None:
    """Drops what an interrupted re-embedding left behind and starts an empty staging table."""
    conn.execute(f"DROP TABLE IF EXISTS {STAGING}")
    conn.execute(f"CREATE TABLE {STAGING} (seq INTEGER PRIMARY KEY, vector BLOB NOT NULL)")


def stage_vectors(conn: sqlite3.Connection, seqs: Sequence[int], matrix: Vectors) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(
            f"INSERT OR REPLACE INTO {STAGING} (seq, vector) VALUES (?, ?)",
            [(seq, row.astype(np.float32).tobytes()) for seq, row in zip(seqs, matrix, strict=True)],
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def switch_embedder(conn: sqlite3.Connection, info: EmbedderInfo) -> None:
    """One transaction: the staged vectors replace every stored vector and `info` becomes the
    corpus's embedder, so readers see the old model's vectors or the new one's, never both. A
    chunk written meanwhile (another ingest) without a staged vector stops the switch."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        missing = conn.execute(f"SELECT count(*) FROM chunks WHERE seq NOT IN (SELECT seq FROM {STAGING})").fetchone()[0]
        if missing:
            raise EmbeddingError(f"{missing} chunks were written while the corpus was being re-embedded; ingest again")
        ensure_tables(conn)
        conn.execute("DELETE FROM chunk_vectors")
        conn.execute(
            f"INSERT INTO chunk_vectors (seq, vector) SELECT seq, vector FROM {STAGING}"
            " WHERE seq IN (SELECT seq FROM chunks) ORDER BY seq"
        )
        _drop_index(conn)
        _set_meta(conn, EMBEDDER_KEY, info)
        conn.execute(f"DROP TABLE {STAGING}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def drop_vectors(conn: sqlite3.Connection) -> bool:
    """Makes the corpus BM25-only again; True when it had vectors."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        had = recorded_embedder(conn) is not None
        conn.execute("DELETE FROM corpus_meta WHERE key IN (?, ?)", (EMBEDDER_KEY, INDEX_KEY))
        for table in ("chunk_vectors", "vector_index_parts", STAGING):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return had


def _drop_index(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM corpus_meta WHERE key = ?", (INDEX_KEY,))
    conn.execute("DELETE FROM vector_index_parts")


# --- the graph -------------------------------------------------------------------------------


def _new_index(dimensions: int) -> Index:
    from usearch.index import Index

    return Index(ndim=dimensions, metric="ip", dtype="f16", connectivity=CONNECTIVITY, expansion_add=EXPANSION_ADD)


def _matrix(blobs: Sequence[bytes], dimensions: int) -> Vectors:
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), dimensions)


def sync_index(conn: sqlite3.Connection) -> IndexMeta | None:
    """Brings the stored graph up to the stored vectors (after an ingest): adds the new ones and
    removes the gone ones, or rebuilds when many are gone. Nothing to do for a BM25-only corpus."""
    info = recorded_embedder(conn)
    if info is None:
        return None
    meta = _index_meta(conn)
    live = np.array([row[0] for row in conn.execute("SELECT vid FROM chunk_vectors")], dtype=np.uint64)
    index = _load(conn, meta) if meta is not None else None
    gone = np.zeros(0, dtype=np.uint64)
    if index is not None:
        keys = np.asarray(index.keys, dtype=np.uint64)
        gone = np.setdiff1d(keys, live, assume_unique=True)
        if len(gone) > REBUILD_FRACTION * len(keys):
            index = None
    if index is None:
        meta, index, gone = None, _new_index(info.dimensions), np.zeros(0, dtype=np.uint64)
    newest = meta.max_vid if meta is not None else 0
    rows = conn.execute("SELECT vid, vector FROM chunk_vectors WHERE vid > ? ORDER BY vid", (newest,)).fetchall()
    if meta is not None and not rows and not len(gone):
        return meta
    if len(gone):
        index.remove(gone)
    if rows:
        index.add(np.array([r[0] for r in rows], dtype=np.uint64), _matrix([r[1] for r in rows], info.dimensions))
    data = index.save()
    assert data is not None
    max_vid = max(newest, rows[-1][0] if rows else 0)
    saved = IndexMeta(id=uuid.uuid4().hex, max_vid=max_vid, count=len(index),
                      parts=max(1, -(-len(data) // INDEX_PART_BYTES)))
    conn.execute("BEGIN IMMEDIATE")
    try:
        _drop_index(conn)
        conn.executemany(
            "INSERT INTO vector_index_parts (part, bytes) VALUES (?, ?)",
            [(i, bytes(data[i * INDEX_PART_BYTES : (i + 1) * INDEX_PART_BYTES])) for i in range(saved.parts)],
        )
        _set_meta(conn, INDEX_KEY, saved)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return saved


def _load(conn: sqlite3.Connection, meta: IndexMeta) -> Index | None:
    from usearch.index import Index

    parts = [row[0] for row in conn.execute("SELECT bytes FROM vector_index_parts ORDER BY part")]
    if len(parts) != meta.parts:
        return None
    return Index.restore(b"".join(parts), expansion_search=EXPANSION_SEARCH)


@dataclass
class LoadedIndex:
    meta: IndexMeta
    index: Index
    lock: threading.Lock
    path: str | os.PathLike[str] = ""
    """As the caller named the corpus: a cache hit compares it without resolving it again."""


class VectorIndexCache:
    """Graphs by (corpus file, stored index meta), shared by every run of a process: a new ingest
    gives the graph a new id, so a cached one is never served for a corpus that changed."""

    def __init__(self, max_size: int = 8) -> None:
        self.max_size = max_size
        self._loaded: OrderedDict[tuple[str, str], LoadedIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str | os.PathLike[str], conn: sqlite3.Connection) -> LoadedIndex | None:
        """Per search: one corpus_meta read; the path is resolved and the meta parsed only when
        the graph is not loaded yet (both cost more than the rest of this call)."""
        row = conn.execute("SELECT value FROM corpus_meta WHERE key = ?", (INDEX_KEY,)).fetchone()
        if row is None:
            return None
        with self._lock:
            for key, loaded in self._loaded.items():
                if key[1] == row[0] and loaded.path == path:
                    self._loaded.move_to_end(key)
                    return loaded
            key = (str(Path(path).resolve()), row[0])
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return self._loaded[key]
            meta = IndexMeta.model_validate_json(row[0])
            index = _load(conn, meta)
            if index is None:
                return None
            for stale in [k for k in self._loaded if k[0] == key[0]]:
                del self._loaded[stale]
            loaded = self._loaded[key] = LoadedIndex(meta, index, threading.Lock(), path)
            while len(self._loaded) > self.max_size:
                self._loaded.popitem(last=False)
            return loaded


# --- ranking ---------------------------------------------------------------------------------


GraphHits = tuple[list[int], list[float]]
"""A graph search's answer: vector ids and their distances, best first."""

_graph_searches: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def search_graph(loaded: LoadedIndex, query: Vectors, count: int) -> GraphHits:
    with loaded.lock:
        matches = loaded.index.search(query, count)
    return [int(k) for k in matches.keys], [float(d) for d in matches.distances]


def start_graph_search(loaded: LoadedIndex | None, query: Vectors, count: int) -> Future[GraphHits] | None:
    """The graph search, started on a small process-wide pool so that it runs while the caller's
    thread ranks BM25 (SQLite and usearch both release the GIL): a hybrid search then costs about
    its BM25 side alone when a core is free (docs/benchmarks.md). It needs no connection."""
    global _graph_searches
    if loaded is None:
        return None
    with _pool_lock:
        if _graph_searches is None:
            _graph_searches = ThreadPoolExecutor(max_workers=GRAPH_SEARCH_THREADS, thread_name_prefix="graph-search")
    return _graph_searches.submit(search_graph, loaded, query, count)


def nearest(
    conn: sqlite3.Connection,
    loaded: LoadedIndex | None,
    query: Vectors,
    count: int,
    span: tuple[int, int] | None,
    graph_hits: Future[GraphHits] | None = None,
) -> list[tuple[int, float]]:
    """The `count` chunks (seq, cosine) nearest the query, best first; within one document's seq
    span when given (exact), else from the graph (`graph_hits` when the caller started its search
    already) plus an exact pass over vectors newer than it."""
    if span is not None:
        rows = conn.execute(
            "SELECT seq, vector FROM chunk_vectors WHERE seq BETWEEN ? AND ?", span
        ).fetchall()
        return _exact(rows, query, count)
    found: dict[int, float] = {}
    newest = 0
    if loaded is not None:
        newest = loaded.meta.max_vid
        vids, distances = graph_hits.result() if graph_hits is not None else search_graph(loaded, query, count)
        if vids:
            marks = ",".join("?" * len(vids))
            seq_of = dict(conn.execute(f"SELECT vid, seq FROM chunk_vectors WHERE vid IN ({marks})", vids).fetchall())
            for vid, distance in zip(vids, distances, strict=True):
                if vid in seq_of:
                    found[seq_of[vid]] = 1.0 - distance
    fresh = conn.execute("SELECT seq, vector FROM chunk_vectors WHERE vid > ?", (newest,)).fetchall()
    found.update(_exact(fresh, query, count))
    return sorted(found.items(), key=lambda item: -item[1])[:count]


def _exact(rows: Sequence[tuple[int, bytes]], query: Vectors, count: int) -> list[tuple[int, float]]:
    if not rows:
        return []
    scores = _matrix([r[1] for r in rows], len(query)) @ query
    order = np.argsort(-scores, kind="stable")[:count]
    return [(int(rows[i][0]), float(scores[i])) for i in order]


def vector_count(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT count(*) FROM chunk_vectors").fetchone()[0] if _has_vectors_table(conn) else 0

