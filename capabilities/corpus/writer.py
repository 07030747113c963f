"""Writing one document, whole or not at all.

Ingest and the search benchmark both write through `write_document`, so what is benchmarked
is what is served.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..store import Chunk, Document
from .vectors import ChunkVectors, delete_document_vectors, store_document_vectors

WriteOutcome = Literal["added", "replaced", "unchanged"]
PAGE_IMAGE_META = "page_image"
"""Chunk meta naming the picture that is the chunk's whole page (a rendered PDF page, D7)."""


@dataclass(frozen=True)
class StoredPicture:
    """A validated picture of one document, addressed by `self_ref` (`#/pictures/<n>`)."""

    self_ref: str
    data: bytes
    media_type: str
    caption: str = ""


@dataclass(frozen=True)
class DocumentRecord:
    """Everything stored for one document. `content_hash` decides whether a re-ingest is a
    no-op, so it must cover everything the rows are derived from (text, pictures, chunker)."""

    document: Document
    chunks: Sequence[Chunk]
    pictures: Sequence[StoredPicture]
    content_hash: str
    picture_sources: Sequence[str] = ()
    """The picture files the source names (outside it), in the order the hash covers them: with
    them an unchanged file is recognised before it is parsed (`stored_version`)."""


@dataclass(frozen=True)
class StoredVersion:
    content_hash: str
    picture_sources: list[str] | None
    """None for a document stored before `document_sources` existed."""


def document_id_for(uri: str) -> str:
    """Derived from the uri, so re-ingesting a file replaces its document instead of adding one."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, uri))


def chunk_id_for(uri: str, ordinal: int, content_hash: str) -> str:
    """Stable while the chunk is: a citation stored before an unchanged re-ingest still resolves,
    and one whose text changed no longer points at different text."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{uri}#chunk-{ordinal}-{content_hash}"))


def write_document(conn: sqlite3.Connection, record: DocumentRecord, vectors: ChunkVectors | None = None) -> WriteOutcome:
    """Adds the document, replaces its earlier version, or leaves an identical one alone, in one
    transaction: readers see the old version or the new one, never a mix, and a failure midway
    leaves no trace. A hybrid corpus needs `vectors` (a row per chunk, from its embedder), stored in
    the same transaction. `conn` must be in autocommit mode (`schema.open_writer`)."""
    document = record.document
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT content_hash FROM documents WHERE id = ?", (document.id,)).fetchone()
        if row is not None and row[0] == record.content_hash:
            conn.execute("ROLLBACK")
            return "unchanged"
        if row is not None:
            _delete_rows(conn, document.id)
        seqs = _insert_rows(conn, record)
        store_document_vectors(conn, seqs, vectors)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return "added" if row is None else "replaced"


def stored_version(conn: sqlite3.Connection, document_id: str) -> StoredVersion | None:
    """The stored version's content hash (what `write_document` compares) and picture files."""
    row = conn.execute(
        "SELECT d.content_hash, s.picture_sources FROM documents d"
        " LEFT JOIN document_sources s ON s.document_id = d.id WHERE d.id = ?",
        (document_id,),
    ).fetchone()
    if row is None:
        return None
    return StoredVersion(str(row[0]), None if row[1] is None else list(json.loads(row[1])))


def delete_document(conn: sqlite3.Connection, document_id: str) -> bool:
    """Removes a document and everything derived from it in one transaction; False if absent."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = conn.execute("SELECT 1 FROM documents WHERE id = ?", (document_id,)).fetchone() is not None
        if found:
            _delete_rows(conn, document_id)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return found


def _delete_rows(conn: sqlite3.Connection, document_id: str) -> None:
    delete_document_vectors(conn, document_id)
    conn.execute("DELETE FROM chunks_fts WHERE rowid IN (SELECT seq FROM chunks WHERE document_id = ?)", (document_id,))
    conn.execute("DELETE FROM chunks WHERE document_id = ?", (document_id,))
    conn.execute("DELETE FROM pictures WHERE document_id = ?", (document_id,))
    conn.execute("DELETE FROM document_sources WHERE document_id = ?", (document_id,))
    conn.execute("DELETE FROM documents WHERE id = ?", (document_id,))


def _insert_rows(conn: sqlite3.Connection, record: DocumentRecord) -> range:
    document = record.document
    conn.execute(
        "INSERT INTO documents (id, uri, title, meta, page_count, content_hash) VALUES (?, ?, ?, ?, ?, ?)",
        (
            document.id,
            document.uri,
            document.title,
            json.dumps(document.meta),
            document.page_count,
            record.content_hash,
        ),
    )
    first_seq = conn.execute("SELECT coalesce(max(seq), 0) + 1 FROM chunks").fetchone()[0]
    seqs = range(first_seq, first_seq + len(record.chunks))
    conn.executemany(
        "INSERT INTO chunks (seq, id, document_id, ordinal, content, headings, page_numbers, labels,"
        " doc_item_refs, picture_captions, meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                seq,
                chunk.id,
                document.id,
                chunk.ordinal,
                chunk.content,
                json.dumps(chunk.headings),
                json.dumps(chunk.page_numbers),
                json.dumps(chunk.labels),
                json.dumps(chunk.doc_item_refs),
                json.dumps(chunk.picture_captions),
                json.dumps(chunk.meta),
            )
            for seq, chunk in zip(seqs, record.chunks, strict=True)
        ],
    )
    conn.executemany(
        "INSERT INTO chunks_fts (rowid, content, headings, captions) VALUES (?, ?, ?, ?)",
        [
            (seq, chunk.content, " ".join(chunk.headings), " ".join(chunk.picture_captions.values()))
            for seq, chunk in zip(seqs, record.chunks, strict=True)
        ],
    )
    conn.executemany(
        "INSERT INTO pictures (document_id, self_ref, bytes, caption, media_type) VALUES (?, ?, ?, ?, ?)",
        [(document.id, p.self_ref, p.data, p.caption, p.media_type) for p in record.pictures],
    )
    conn.execute(
        "INSERT INTO document_sources (document_id, picture_sources) VALUES (?, ?)",
        (document.id, json.dumps(list(record.picture_sources))),
    )
    return seqs
