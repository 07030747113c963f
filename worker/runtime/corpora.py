"""Read-only corpus connections, reused by the runs of one worker process.

E3 gives every run a store of its own, opened on first use and closed when the run ends. Opening
one (connect, schema check, hybrid set-up) and closing it (a thread hop) cost more CPU than the
searches of a typical question, so the factory the worker hands its capabilities leases an idle
connection from this pool instead, and the run's `close` gives it back. A lease still belongs to
one run at a time, as E3 asks. A pooled connection is reused only while its file is the one it
opened and no other connection has committed to it since (`PRAGMA data_version`), so a re-ingest
is seen by the next run exactly as when every run opened the file itself.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path

from capabilities import Chunk, Document, RetrievedChunk
from capabilities.corpus import SQLiteCorpus, VectorIndexCache

from .embedders import EmbedderCache

IDLE_PER_CORPUS = 64
"""Idle connections kept per corpus file: a worker's concurrency is the most it ever needs."""


def open_corpus(path: Path, embedders: EmbedderCache, graphs: VectorIndexCache) -> SQLiteCorpus:
    """A read-only connection as a worker's run sees the corpus: a hybrid corpus's query embedder
    comes from the name it records and this process's settings (embedders.py), never from a job,
    and its loaded graph is shared by the process."""
    return SQLiteCorpus(path, read_only=True, embedder=embedders.get, vector_cache=graphs)


@dataclass
class _Pooled:
    corpus: SQLiteCorpus
    identity: tuple[int, int]  # (st_dev, st_ino) of the file when it was opened
    data_version: int


def _identity(path: Path) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


@dataclass
class CorpusPool:
    embedders: EmbedderCache = field(default_factory=EmbedderCache)
    graphs: VectorIndexCache = field(default_factory=VectorIndexCache)
    _idle: dict[Path, list[_Pooled]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def lease(self, path: Path) -> CorpusLease:
        """A store for one run: a pooled connection still current for `path`, or a new one."""
        while True:
            with self._lock:
                idle = self._idle.get(path)
                pooled = idle.pop() if idle else None
            if pooled is None:
                break
            if self._current(path, pooled):
                return CorpusLease(self, path, pooled)
            await pooled.corpus.close()
        corpus = open_corpus(path, self.embedders, self.graphs)
        return CorpusLease(self, path, _Pooled(corpus, _identity(path), corpus.data_version()))

    async def give_back(self, path: Path, pooled: _Pooled) -> None:
        with self._lock:
            idle = self._idle.setdefault(path, [])
            if len(idle) < IDLE_PER_CORPUS:
                idle.append(pooled)
                return
        await pooled.corpus.close()

    @staticmethod
    def _current(path: Path, pooled: _Pooled) -> bool:
        try:
            return _identity(path) == pooled.identity and pooled.corpus.data_version() == pooled.data_version
        except (OSError, sqlite3.Error):
            return False


class CorpusLease:
    """The `CorpusStore` a run uses; `close` returns the connection to the pool (idempotent)."""

    def __init__(self, pool: CorpusPool, path: Path, pooled: _Pooled) -> None:
        self._pool, self._path, self._pooled = pool, path, pooled
        self._corpus: SQLiteCorpus | None = pooled.corpus

    @property
    def corpus(self) -> SQLiteCorpus:
        if self._corpus is None:
            raise RuntimeError("this corpus lease was closed: its run has ended (E3)")
        return self._corpus

    async def search(self, query: str, *, limit: int, filter: str | None) -> list[RetrievedChunk]:
        return await self.corpus.search(query, limit=limit, filter=filter)

    async def expand_context(self, results: list[RetrievedChunk]) -> list[RetrievedChunk]:
        return await self.corpus.expand_context(results)

    async def get_chunk(self, chunk_id: str) -> Chunk | None:
        return await self.corpus.get_chunk(chunk_id)

    async def get_document(self, document_id: str) -> Document | None:
        return await self.corpus.get_document(document_id)

    async def list_documents(self, *, filter: str | None, offset: int, limit: int) -> list[Document]:
        return await self.corpus.list_documents(filter=filter, offset=offset, limit=limit)

    async def read(
        self, document_id: str, *, page: int | None, section: str | None, filter: str | None
    ) -> list[RetrievedChunk] | None:
        return await self.corpus.read(document_id, page=page, section=section, filter=filter)

    async def get_picture_bytes(self, document_id: str, self_ref: str) -> bytes | None:
        return await self.corpus.get_picture_bytes(document_id, self_ref)

    async def close(self) -> None:
        """Back to the pool, with the data version it has seen: the run's own reads moved nothing."""
        if self._corpus is not None:
            self._corpus = None
            await self._pool.give_back(self._path, self._pooled)
