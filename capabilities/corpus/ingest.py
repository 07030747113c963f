"""Files on disk into the corpus: Markdown, plain text and HTML, with their pictures.

A file that cannot be ingested (unsupported extension, not UTF-8, no text) is reported with its
reason and skipped, and the rest go in. A picture that is missing or does not decode is reported
too, but its document is kept: the text, including the picture's caption, is still worth
searching. Each document is written in its own transaction (`writer.write_document`).
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from ..pictures import decode_picture
from ..store import PICTURE_REF_PREFIX, Chunk, Document
from .chunking import chunk_blocks
from .htmlparse import parse_html
from .parsing import ParsedText, PictureSource, parse_markdown, parse_text
from .schema import open_writer
from .writer import (
    DocumentRecord,
    StoredPicture,
    chunk_id_for,
    document_id_for,
    write_document,
)

if TYPE_CHECKING:
    from .embedded_ingest import EmbeddingSummary, Progress, VectorWriter
    from .embedding import CorpusEmbedder
    from .vectors import ChunkVectors

PARSERS: dict[str, tuple[str, Callable[[str], ParsedText]]] = {
    ".md": ("markdown", parse_markdown),
    ".markdown": ("markdown", parse_markdown),
    ".txt": ("text", parse_text),
    ".html": ("html", parse_html),
    ".htm": ("html", parse_html),
}
PICTURE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".svg"})
"""Skipped silently while walking a folder: they are the pictures documents refer to."""

INGEST_VERSION = "1"
"""Part of every content hash: raising it makes the next ingest rebuild unchanged files too
(after a change to parsing or chunking)."""

TEXT_REF_PREFIX = "#/texts/"
NO_SUCH_PATH = "no such file or folder"
NO_TEXT = "no text to index"
PICTURE_NOT_FOUND = "file not found"
PICTURE_NOT_DECODABLE = "not a picture Pillow can read"
PICTURE_NOT_LOCAL = "only local picture files are read"
_URL_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*:")


@dataclass
class IngestReport:
    """Paths as found (given, or found under a given folder); `errors` pairs a path with why it
    was skipped, or what was dropped from it when its text went in."""

    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    skipped_unchanged: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    embedding: EmbeddingSummary | None = None  # set when the corpus has vectors (embedded_ingest.py)


class SourceError(ValueError):
    """A file that cannot become a document; the message is the reason reported for it."""


def ingest(
    db_path: str | os.PathLike[str],
    paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    embedder: CorpusEmbedder | None = None,
    progress: Progress | None = None,
) -> IngestReport:
    """Ingests files and folders (recursively, in name order) into the corpus at `db_path`,
    creating it when missing. Documents of files no longer on disk are left in place. A single
    path is accepted too: iterating a string would ingest its characters. With an `embedder` the
    corpus becomes (or stays) hybrid and every new chunk gets a vector (embedded_ingest.py); a
    hybrid corpus refuses documents without them (EmbedderRequired)."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    report = IngestReport()
    conn = open_writer(db_path)
    try:
        vectors = _vector_writer(conn, embedder, report, progress)
        completed = False
        try:
            for path in _source_files(paths, report):
                _ingest_one(conn, path, report, vectors)
            completed = True
        finally:
            if vectors is not None:
                vectors.close(completed=completed)
                report.embedding = vectors.summary
    finally:
        conn.close()
    return report


def _vector_writer(
    conn: sqlite3.Connection, embedder: CorpusEmbedder | None, report: IngestReport, progress: Progress | None
) -> VectorWriter | None:
    from .embedded_ingest import VectorWriter
    from .embedding import EmbedderRequired
    from .vectors import recorded_embedder

    if embedder is None:
        recorded = recorded_embedder(conn)
        if recorded is not None:  # its new chunks would have no vectors
            raise EmbedderRequired(recorded)
        return None

    return VectorWriter.open(conn, embedder, lambda path, record, vectors: _write(conn, path, record, vectors, report),
                             progress)


def _ingest_one(conn: sqlite3.Connection, path: Path, report: IngestReport, vectors: VectorWriter | None) -> None:
    try:
        record, problems = load_document(path)
    except SourceError as exc:
        report.errors.append((str(path), str(exc)))
        return
    report.errors.extend((str(path), problem) for problem in problems)
    if vectors is not None:
        vectors.add(str(path), record)  # written, and reported, once its batch is embedded
    else:
        _write(conn, str(path), record, None, report)


def _write(
    conn: sqlite3.Connection, path: str, record: DocumentRecord, vectors: ChunkVectors | None, report: IngestReport
) -> None:
    try:
        outcome = write_document(conn, record, vectors)
    except sqlite3.Error as exc:
        report.errors.append((path, f"not stored, database error: {exc}"))
        return
    lists = {"added": report.added, "replaced": report.replaced, "unchanged": report.skipped_unchanged}
    lists[outcome].append(path)


def _source_files(paths: Iterable[str | os.PathLike[str]], report: IngestReport) -> Iterator[Path]:
    seen: set[Path] = set()
    for given in paths:
        path = Path(given)
        found: Iterator[Path]
        if path.is_dir():
            found = (
                p
                for p in sorted(path.rglob("*"))
                if p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
                and p.suffix.lower() not in PICTURE_SUFFIXES
            )
        elif path.exists():
            found = iter([path])
        else:
            report.errors.append((str(path), NO_SUCH_PATH))
            continue
        for file in found:
            if file.resolve() not in seen:
                seen.add(file.resolve())
                yield file


def load_document(path: Path) -> tuple[DocumentRecord, list[str]]:
    """The record for one file and the problems that did not stop it; raises SourceError when
    the file cannot be a document."""
    fmt, parse = _parser_for(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(f"not UTF-8 text (invalid byte at offset {exc.start})") from exc
    if "\x00" in text:
        raise SourceError("binary content (NUL bytes), not text")
    parsed = parse(text)
    if not any(block.text for block in parsed.blocks):
        raise SourceError(NO_TEXT)
    pictures, problems = _load_pictures(path.parent, parsed)
    uri = path.resolve().as_uri()
    hasher = hashlib.sha256(f"{INGEST_VERSION}\0".encode() + raw)
    for src, picture in pictures.items():
        hasher.update(f"\0{src}\0".encode() + (picture.data if picture else b"-"))
    return _record(uri, path, fmt, parsed, pictures, hasher.hexdigest()), problems


def _parser_for(path: Path) -> tuple[str, Callable[[str], ParsedText]]:
    try:
        return PARSERS[path.suffix.lower()]
    except KeyError:
        supported = ", ".join(sorted(PARSERS))
        raise SourceError(f"unsupported extension {path.suffix or '(none)'!r}; supported: {supported}") from None


def _load_pictures(base: Path, parsed: ParsedText) -> tuple[dict[str, StoredPicture | None], list[str]]:
    """Each distinct picture source, in order of first appearance, numbered `#/pictures/<n>`
    over the valid ones only, so every ref a chunk carries has bytes behind it."""
    sources: dict[str, PictureSource] = {}
    for block in parsed.blocks:
        for picture in block.pictures:
            sources.setdefault(picture.src, picture)
    loaded: dict[str, StoredPicture | None] = {}
    problems: list[str] = []
    for src, source in sources.items():
        result = _read_picture(base, src)
        if isinstance(result, str):
            loaded[src] = None
            problems.append(picture_skipped(src, result))
            continue
        data, media_type = result
        ref = f"{PICTURE_REF_PREFIX}{sum(p is not None for p in loaded.values())}"
        loaded[src] = StoredPicture(self_ref=ref, data=data, media_type=media_type, caption=source.caption)
    return loaded, problems


def picture_skipped(src: str, why: str) -> str:
    """The report line for a picture left out of a document whose text went in."""
    return f"picture {src!r} skipped ({why}); text kept"


def _read_picture(base: Path, src: str) -> tuple[bytes, str] | str:
    """Bytes and media type, or why not. Nothing is fetched: ingest reads local files only."""
    if _URL_SCHEME.match(src) and not src.startswith("file:"):
        return PICTURE_NOT_LOCAL
    local = unquote(src.removeprefix("file://").split("#", 1)[0].split("?", 1)[0])
    try:
        data = (base / local).read_bytes()
    except FileNotFoundError:
        return PICTURE_NOT_FOUND
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    picture = decode_picture(data)
    if picture is None:
        return PICTURE_NOT_DECODABLE
    return data, picture.media_type


def _record(
    uri: str,
    path: Path,
    fmt: str,
    parsed: ParsedText,
    pictures: dict[str, StoredPicture | None],
    content_hash: str,
) -> DocumentRecord:
    document = Document(
        id=document_id_for(uri),
        uri=uri,
        title=parsed.title or path.stem,
        meta={"format": fmt, "file_name": path.name},
        page_count=parsed.page_count,
    )
    chunks: list[Chunk] = []
    for ordinal, draft in enumerate(chunk_blocks(parsed.blocks)):
        stored = list({p.self_ref: p for s in draft.pictures if (p := pictures.get(s.src)) is not None}.values())
        chunks.append(
            Chunk(
                id=chunk_id_for(uri, ordinal, hashlib.sha256(draft.content.encode()).hexdigest()),
                document_id=document.id,
                ordinal=ordinal,
                content=draft.content,
                headings=list(draft.headings),
                page_numbers=[draft.page],
                labels=["text", "picture"] if stored else ["text"],
                doc_item_refs=[f"{TEXT_REF_PREFIX}{i}" for i in draft.blocks] + [p.self_ref for p in stored],
                picture_captions={p.self_ref: p.caption for p in stored if p.caption},
            )
        )
    valid = [p for p in pictures.values() if p is not None]
    return DocumentRecord(document=document, chunks=chunks, pictures=valid, content_hash=content_hash)
