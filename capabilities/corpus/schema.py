"""The corpus file's tables and the two ways to open it.

Workers open the file read-only (`mode=ro`) and ingest is the only writer. While ingest writes,
the file is in WAL mode, so any number of reader processes search while it commits, each seeing
whole documents only. D5: when ingest finishes it puts the file back in rollback-journal mode
(DELETE) if no reader has it open, because a WAL file can only be read where its `-shm` file
can be created, which a read-only mount (Kubernetes, compose `:ro`) forbids; a file left in WAL
mode is opened `immutable` there instead.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

SCHEMA_VERSION = "1"

FTS_TOKENIZER = "porter unicode61 remove_diacritics 2"
"""Porter stemming so that "fares" finds "fare"; diacritics folded so "cafe" finds "café"."""

BUSY_TIMEOUT_MS = 10_000
"""How long a connection waits for another writer (or a checkpoint) before giving up."""

_DDL = f"""
CREATE TABLE IF NOT EXISTS corpus_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS documents (
    id           TEXT PRIMARY KEY,
    uri          TEXT NOT NULL UNIQUE,
    title        TEXT,
    meta         TEXT NOT NULL DEFAULT '{{}}',
    page_count   INTEGER NOT NULL DEFAULT 1,
    content_hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    seq              INTEGER PRIMARY KEY,
    id               TEXT NOT NULL UNIQUE,
    document_id      TEXT NOT NULL REFERENCES documents(id),
    ordinal          INTEGER NOT NULL,
    content          TEXT NOT NULL,
    headings         TEXT NOT NULL DEFAULT '[]',
    page_numbers     TEXT NOT NULL DEFAULT '[]',
    labels           TEXT NOT NULL DEFAULT '[]',
    doc_item_refs    TEXT NOT NULL DEFAULT '[]',
    picture_captions TEXT NOT NULL DEFAULT '{{}}',
    meta             TEXT NOT NULL DEFAULT '{{}}',
    UNIQUE (document_id, ordinal)
);
CREATE TABLE IF NOT EXISTS pictures (
    document_id TEXT NOT NULL REFERENCES documents(id),
    self_ref    TEXT NOT NULL,
    bytes       BLOB NOT NULL,
    caption     TEXT,
    media_type  TEXT NOT NULL,
    PRIMARY KEY (document_id, self_ref)
);
CREATE TABLE IF NOT EXISTS document_sources (
    document_id     TEXT PRIMARY KEY REFERENCES documents(id),
    picture_sources TEXT NOT NULL DEFAULT '[]'
);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    content, headings, captions, tokenize = '{FTS_TOKENIZER}'
);
"""


class NotACorpusError(ValueError):
    """The file exists but holds no corpus, so searching it would only ever find nothing."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{str(path)!r} is not a corpus ({problem}); fill it with ingest() first")
        self.path, self.problem = path, problem


def open_writer(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-write connection in autocommit mode (callers BEGIN/COMMIT explicitly), creating
    the file and its schema when missing, and switching the file to WAL for good. Refuses a
    file that is not a corpus of this schema version rather than writing into it."""
    resolved = Path(path).resolve()
    conn = sqlite3.connect(resolved, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _DDL.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO corpus_meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    except sqlite3.DatabaseError as exc:
        conn.close()
        if isinstance(exc, sqlite3.OperationalError):
            raise
        raise NotACorpusError(resolved, str(exc)) from exc
    except BaseException:
        conn.close()
        raise
    check_schema(conn, resolved)
    return conn


def close_writer(conn: sqlite3.Connection) -> str:
    """D5. Checkpoints and leaves the file in DELETE mode, so it can be read from a read-only
    mount; when a reader still has it open the switch cannot be made and the file stays in WAL
    mode (the next ingest tries again). Returns the mode the file was left in."""
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        mode = str(conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0]).lower()
    except sqlite3.OperationalError:
        mode = "wal"
    finally:
        conn.close()
    return mode


WAL_MODE_HEADER = (18, 2)
"""Byte 18 of a SQLite file (its read version) is 2 while the file is in WAL mode."""


def readable_only_immutable(path: Path) -> bool:
    """D5. A WAL file whose `-shm` does not exist and cannot be created (a read-only directory)
    can only be opened `immutable=1`: no locks, no shared memory, the file read as it is."""
    with path.open("rb") as handle:
        header = handle.read(WAL_MODE_HEADER[0] + 1)
    if len(header) <= WAL_MODE_HEADER[0] or header[WAL_MODE_HEADER[0]] != WAL_MODE_HEADER[1]:
        return False
    return not path.with_name(f"{path.name}-shm").exists() and not os.access(path.parent, os.W_OK)


def open_reader(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection (`mode=ro`), so a worker can never modify the corpus it serves.

    `check_same_thread=False` because SQLiteCorpus hands the connection to worker threads one
    call at a time, under its own lock.
    """
    resolved = Path(path).resolve()
    if not resolved.is_file():
        raise FileNotFoundError(f"no corpus file at {str(resolved)!r}")
    query = "mode=ro&immutable=1" if readable_only_immutable(resolved) else "mode=ro"
    conn = sqlite3.connect(f"{resolved.as_uri()}?{query}", uri=True, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    check_schema(conn, resolved)
    return conn


def check_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Refuses a file that is not a corpus of this schema version, naming the problem."""
    try:
        row = conn.execute("SELECT value FROM corpus_meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise NotACorpusError(path, str(exc)) from exc
    if row is None or row[0] != SCHEMA_VERSION:
        conn.close()
        found = "no schema version" if row is None else f"schema version {row[0]!r}"
        raise NotACorpusError(path, f"{found}, expected {SCHEMA_VERSION!r}")
