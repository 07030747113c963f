"""Ingest with an embedder: documents are embedded in batches, then written whole with their vectors.

Before anything is written the embedder is asked for one vector, so an unknown model, a missing
key or a server that is down fails the ingest with nothing changed, and its dimensions are
checked against the corpus's. A corpus that has no embedder yet, or another one, is re-embedded
first (vectors.switch_embedder): its existing chunks get the new model's vectors in one
switch, so it never holds two models' vectors. Unchanged documents are not embedded again.

Documents are collected until `FLUSH_CHUNKS` chunks are pending, embedded together (a hosted API
is paid per request round trip as much as per token), and then each is written in its own
transaction (writer.write_document). A failure mid-way leaves the documents written before it
complete and the rest untouched: running the same ingest again continues.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from .embedding import CorpusEmbedder, EmbedderInfo, Vectors, dimension_mismatch, embedding_text
from .vectors import ChunkVectors, begin_staging, recorded_embedder, stage_vectors, switch_embedder, sync_index
from .writer import DocumentRecord

T = TypeVar("T")

FLUSH_CHUNKS = 256
PROBE_TEXT = "dimension probe"


@dataclass(frozen=True)
class EmbeddingProgress:
    """Reported after every embedded batch: `total` is known when re-embedding stored chunks."""

    phase: Literal["re-embedding", "documents"]
    embedded: int
    total: int | None
    elapsed_s: float


@dataclass
class EmbeddingSummary:
    """What an ingest with an embedder did, for its report."""

    model: str
    dimensions: int
    switched_from: str | None = None
    re_embedded: int = 0
    embedded: int = 0
    seconds: float = 0.0

    @property
    def chunks_per_s(self) -> float:
        done = self.re_embedded + self.embedded
        return done / self.seconds if self.seconds > 0 else 0.0


Write = Callable[[str, DocumentRecord, ChunkVectors | None], None]
Progress = Callable[[EmbeddingProgress], None]


@dataclass
class VectorWriter:
    """Batches documents for embedding and hands each, with its vectors, to `write`."""

    conn: sqlite3.Connection
    embedder: CorpusEmbedder
    write: Write
    progress: Progress | None
    summary: EmbeddingSummary
    runner: asyncio.Runner = field(default_factory=asyncio.Runner)
    pending: list[tuple[str, DocumentRecord]] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def open(cls, conn: sqlite3.Connection, embedder: CorpusEmbedder, write: Write,
             progress: Progress | None = None) -> VectorWriter:
        """Probes the embedder and makes it the corpus's (re-embedding when needed)."""
        writer = cls(conn, embedder, write, progress, EmbeddingSummary(embedder.model, 0))
        try:
            writer._prepare()
        except BaseException:
            writer.runner.close()
            raise
        return writer

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(work)

    def _prepare(self) -> None:
        probe = self._run(self.embedder.embed_documents([PROBE_TEXT]))
        info = EmbedderInfo(model=self.embedder.model, dimensions=int(probe.shape[1]))
        self.summary.dimensions = info.dimensions
        recorded = recorded_embedder(self.conn)
        if recorded is not None and recorded.model == info.model:
            if recorded.dimensions != info.dimensions:
                raise dimension_mismatch(info.model, recorded.dimensions, info.dimensions)
            return
        self.summary.switched_from = recorded.model if recorded else None
        self._re_embed(info)

    def _re_embed(self, info: EmbedderInfo) -> None:
        seqs = [row[0] for row in self.conn.execute("SELECT seq FROM chunks ORDER BY seq")]
        begin_staging(self.conn)
        step = FLUSH_CHUNKS
        for start in range(0, len(seqs), step):
            batch = seqs[start : start + step]
            rows = self.conn.execute(
                "SELECT c.seq, d.title, c.headings, c.content FROM chunks c JOIN documents d ON d.id = c.document_id"
                " WHERE c.seq BETWEEN ? AND ? ORDER BY c.seq",
                (batch[0], batch[-1]),
            ).fetchall()
            texts = [embedding_text(title, json.loads(headings), content) for _, title, headings, content in rows]
            stage_vectors(self.conn, [row[0] for row in rows], self._embed(texts, info))
            self.summary.re_embedded += len(rows)
            self._report("re-embedding", self.summary.re_embedded, len(seqs))
        switch_embedder(self.conn, info)

    def _embed(self, texts: list[str], info: EmbedderInfo | None = None) -> Vectors:
        matrix = self._run(self.embedder.embed_documents(texts))
        expected = info.dimensions if info is not None else self.summary.dimensions
        if len(texts) and matrix.shape[1] != expected:
            raise dimension_mismatch(self.embedder.model, expected, int(matrix.shape[1]))
        return matrix

    def _report(self, phase: Literal["re-embedding", "documents"], done: int, total: int | None) -> None:
        if self.progress is not None:
            self.progress(EmbeddingProgress(phase, done, total, time.perf_counter() - self.started))

    def add(self, path: str, record: DocumentRecord) -> None:
        """An unchanged document is passed on at once, without vectors (the writer leaves it
        alone); the others wait for their batch."""
        row = self.conn.execute("SELECT content_hash FROM documents WHERE id = ?", (record.document.id,)).fetchone()
        if row is not None and row[0] == record.content_hash:
            self.write(path, record, None)
            return
        self.pending.append((path, record))
        if sum(len(r.chunks) for _, r in self.pending) >= FLUSH_CHUNKS:
            self.flush()

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        texts = [
            embedding_text(record.document.title, chunk.headings, chunk.content)
            for _, record in pending
            for chunk in record.chunks
        ]
        if not texts:
            return
        matrix = self._embed(texts)
        self.summary.embedded += len(texts)
        self._report("documents", self.summary.embedded, None)
        start = 0
        for path, record in pending:
            end = start + len(record.chunks)
            self.write(path, record, ChunkVectors(self.embedder.model, matrix[start:end]))
            start = end

    def close(self, *, completed: bool) -> None:
        """Writes what is pending (when the ingest completed), then brings the graph up to the
        stored vectors either way, so what was written is searched fast."""
        try:
            if completed:
                self.flush()
        finally:
            try:
                sync_index(self.conn)
            finally:
                self.summary.seconds = time.perf_counter() - self.started
                self.runner.close()
