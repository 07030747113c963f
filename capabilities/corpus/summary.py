"""What a corpus file holds, for a person looking inside it (`grounded corpus list|show`).

Read through `open_reader`, so looking never writes, and works on a read-only mount too.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .schema import open_reader
from .vectors import recorded_embedder


@dataclass(frozen=True)
class DocumentSummary:
    id: str
    uri: str
    title: str | None
    format: str
    pages: int
    chunks: int
    pictures: int
    encoding: str | None = None


@dataclass(frozen=True)
class CorpusSummary:
    path: str
    size_bytes: int
    documents: int
    pages: int
    chunks: int
    pictures: int
    formats: dict[str, int] = field(default_factory=dict)
    """Documents per format, most common first (then by name)."""
    embedder: str | None = None
    listed: list[DocumentSummary] = field(default_factory=list)
    """The first documents in uri order, as many as were asked for."""


def summarize(path: str | os.PathLike[str], *, list_documents: int = 0) -> CorpusSummary:
    """Raises FileNotFoundError or NotACorpusError, as `open_reader` does."""
    resolved = Path(path)
    conn = open_reader(resolved)
    try:
        documents, pages = conn.execute("SELECT count(*), coalesce(sum(page_count), 0) FROM documents").fetchone()
        chunks = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        pictures = conn.execute("SELECT count(*) FROM pictures").fetchone()[0]
        formats = Counter(
            str(json.loads(meta).get("format", "unknown")) for (meta,) in conn.execute("SELECT meta FROM documents")
        )
        embedder = recorded_embedder(conn)
        listed = [
            _document(row)
            for row in conn.execute(
                "SELECT d.id, d.uri, d.title, d.meta, d.page_count,"
                " (SELECT count(*) FROM chunks c WHERE c.document_id = d.id),"
                " (SELECT count(*) FROM pictures p WHERE p.document_id = d.id)"
                " FROM documents d ORDER BY d.uri LIMIT ?",
                (max(list_documents, 0),),
            )
        ]
    finally:
        conn.close()
    return CorpusSummary(
        path=str(resolved),
        size_bytes=resolved.stat().st_size,
        documents=documents,
        pages=pages,
        chunks=chunks,
        pictures=pictures,
        formats=dict(sorted(formats.items(), key=lambda item: (-item[1], item[0]))),
        embedder=None if embedder is None else f"{embedder.model} ({embedder.dimensions} dimensions)",
        listed=listed,
    )


def _document(row: tuple[str, str, str | None, str, int, int, int]) -> DocumentSummary:
    meta = json.loads(row[3])
    return DocumentSummary(
        id=row[0],
        uri=row[1],
        title=row[2],
        format=str(meta.get("format", "unknown")),
        pages=row[4],
        chunks=row[5],
        pictures=row[6],
        encoding=meta.get("encoding"),
    )
