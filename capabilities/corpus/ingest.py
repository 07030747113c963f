"""Files on disk into the corpus: every format in `formats/`, with their pictures.

`ingest()` finds the files, then hands each to `ingest_file`, the per-document write path: read
and detect, parse, build the record, write it in one transaction (`store_document` →
`writer.write_document`); with an embedder, records wait in `embedded_ingest.VectorWriter` until
their batch is embedded and are then stored with their vectors. A file that cannot be ingested is reported with its reason and the rest go in (D2). A picture
that is missing or does not decode is reported too, once, when the version that lacks it is
stored (D3), and its document is kept: the text, caption included, is still worth searching.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from ..pictures import decode_picture
from ..store import PICTURE_REF_PREFIX, Chunk, Document
from .chunking import chunk_blocks
from .formats.detect import Source, detect
from .formats.options import ReadOptions
from .parsed import ParsedText, PictureSource
from .problems import (
    DATABASE_ERROR,
    NO_SUCH_PATH,
    NO_TEXT,
    PICTURE_NOT_DECODABLE,
    PICTURE_NOT_FOUND,
    PICTURE_NOT_LOCAL,
    PICTURE_UNREADABLE,
    UNREADABLE,
    NotADocument,
    Problem,
    SourceError,
)
from .report import IngestReport
from .schema import close_writer, open_writer
from .writer import (
    PAGE_IMAGE_META,
    DocumentRecord,
    StoredPicture,
    StoredVersion,
    chunk_id_for,
    delete_document,
    document_id_for,
    stored_version,
    write_document,
)

PICTURE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".svg"})
"""Skipped silently while walking a folder: they are the pictures documents refer to."""

INGEST_VERSION = "2"
"""Part of every content hash: raising it makes the next ingest rebuild unchanged files too
(after a change to parsing or chunking). 2: markdown-it-py, HTML chrome, new formats."""

if TYPE_CHECKING:
    from .embedded_ingest import Progress as EmbeddingProgress
    from .embedded_ingest import VectorWriter
    from .embedding import CorpusEmbedder
    from .vectors import ChunkVectors

TEXT_REF_PREFIX = "#/texts/"
_URL_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*:")

Progress = Callable[[int, int, "Path | None"], None]
"""`(done, total, current)`: called before each file with the file, and once at the end with None."""


@dataclass(frozen=True)
class SourceFile:
    path: Path
    named: bool
    """Given by name rather than found in a folder: an unsupported file is then a failure."""


@dataclass(frozen=True)
class LoadedDocument:
    record: DocumentRecord
    warnings: list[Problem]


def ingest(
    db_path: str | os.PathLike[str],
    paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    options: ReadOptions = ReadOptions(),
    prune: bool = False,
    on_progress: Progress | None = None,
    embedder: CorpusEmbedder | None = None,
    embedding_progress: EmbeddingProgress | None = None,
) -> IngestReport:
    """Ingests files and folders (recursively, in name order) into the corpus at `db_path`,
    creating it when missing. With `prune`, documents whose file is gone from a given folder are
    removed (D6). If the file was created here and nothing went in, it is removed again: an empty
    corpus would be served and find nothing (D2). With an `embedder` the corpus becomes (or
    stays) hybrid and every new chunk gets a vector (embedded_ingest.py); a hybrid corpus refuses
    documents without them (EmbedderRequired). A single path is accepted too: iterating a string
    would ingest its characters."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    target = Path(db_path)
    report = IngestReport(corpus=str(target))
    files, folders = find_sources(paths, report)
    existed = target.exists()
    conn = open_writer(target)
    try:
        warnings: dict[str, list[Problem]] = {}
        vectors = _vector_writer(conn, embedder, report, warnings, embedding_progress)
        completed = False
        try:
            for done, source in enumerate(files):
                if on_progress is not None:
                    on_progress(done, len(files), source.path)
                ingest_file(conn, source, options, report, vectors, warnings)
            if prune:
                prune_missing(conn, folders, report)
            completed = True
        finally:
            if vectors is not None:
                vectors.close(completed=completed)
                report.embedding = vectors.summary
        if on_progress is not None:
            on_progress(len(files), len(files), None)
    finally:
        try:
            empty = conn.execute("SELECT count(*) FROM documents").fetchone()[0] == 0
        except sqlite3.Error:
            empty = False
        report.journal_mode = close_writer(conn)
        if empty and not existed:
            remove_corpus_file(target)
            report.corpus_removed = True
    return report


def _vector_writer(
    conn: sqlite3.Connection,
    embedder: CorpusEmbedder | None,
    report: IngestReport,
    warnings: dict[str, list[Problem]],
    progress: EmbeddingProgress | None,
) -> VectorWriter | None:
    from .embedded_ingest import VectorWriter
    from .embedding import EmbedderRequired
    from .vectors import recorded_embedder

    if embedder is None:
        recorded = recorded_embedder(conn)
        if recorded is not None:  # its new chunks would have no vectors
            raise EmbedderRequired(recorded)
        return None

    def store(path: str, record: DocumentRecord, vectors: ChunkVectors | None) -> None:
        store_document(conn, path, record, vectors, report, warnings.pop(path, []))

    return VectorWriter.open(conn, embedder, store, progress)


def ingest_file(
    conn: sqlite3.Connection,
    source: SourceFile,
    options: ReadOptions,
    report: IngestReport,
    vectors: VectorWriter | None = None,
    warnings: dict[str, list[Problem]] | None = None,
) -> None:
    """The per-document write path: load (read, detect, parse, build the record), then store it
    in one transaction, at once or (with `vectors`) once its batch is embedded. What happened is
    added to `report`."""
    path = str(source.path)
    try:
        loaded = load_document(source.path, options, stored=lambda document_id: stored_version(conn, document_id))
    except NotADocument as exc:
        (report.failed if source.named else report.skipped).append(Problem(path, exc.reason, exc.detail))
        return
    except SourceError as exc:
        report.failed.append(Problem(path, exc.reason, exc.detail))
        return
    if loaded is None:
        report.unchanged.append(path)
        return
    if vectors is None:
        store_document(conn, path, loaded.record, None, report, loaded.warnings)
        return
    if warnings is not None:
        warnings[path] = loaded.warnings  # reported when the record is stored (D3)
    vectors.add(path, loaded.record)


def store_document(
    conn: sqlite3.Connection,
    path: str,
    record: DocumentRecord,
    vectors: ChunkVectors | None,
    report: IngestReport,
    warnings: list[Problem],
) -> None:
    """Writes one record (with its vectors in a hybrid corpus) and reports the outcome; D3: what
    was left out of it is reported only when this version is the one stored."""
    try:
        outcome = write_document(conn, record, vectors)
    except sqlite3.Error as exc:
        report.failed.append(Problem(path, DATABASE_ERROR, str(exc)))
        return
    {"added": report.added, "replaced": report.replaced, "unchanged": report.unchanged}[outcome].append(path)
    if outcome != "unchanged":
        report.warnings.extend(warnings)


def find_sources(
    paths: Iterable[str | os.PathLike[str]], report: IngestReport
) -> tuple[list[SourceFile], list[Path]]:
    """The files to ingest, each once, and the folders given (what `prune` looks under)."""
    seen: set[Path] = set()
    files: list[SourceFile] = []
    folders: list[Path] = []
    for given in paths:
        path = Path(given)
        found: Iterable[Path]
        if path.is_dir():
            folders.append(path)
            found = (
                p
                for p in sorted(path.rglob("*"))
                if p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
                and p.suffix.lower() not in PICTURE_SUFFIXES
            )
        elif path.exists():
            found = [path]
        else:
            report.failed.append(Problem(str(path), NO_SUCH_PATH))
            continue
        for file in found:
            if file.resolve() not in seen:
                seen.add(file.resolve())
                files.append(SourceFile(file, named=not path.is_dir()))
    return files, folders


def prune_missing(conn: sqlite3.Connection, folders: list[Path], report: IngestReport) -> None:
    """D6. Only under folders given to this run, and only documents whose file no longer exists:
    a file that is there but failed keeps its older version, and a mistyped folder (reported as
    missing, so never in `folders`) removes nothing."""
    for folder in folders:
        prefix = folder.resolve().as_uri().rstrip("/") + "/"
        rows = conn.execute(
            "SELECT id, uri FROM documents WHERE substr(uri, 1, ?) = ? ORDER BY uri", (len(prefix), prefix)
        ).fetchall()
        for document_id, uri in rows:
            source = Path(unquote(urlparse(uri).path))
            if not source.exists() and delete_document(conn, document_id):
                report.pruned.append(str(source))


def remove_corpus_file(target: Path) -> None:
    for leftover in (target, target.with_name(f"{target.name}-wal"), target.with_name(f"{target.name}-shm")):
        leftover.unlink(missing_ok=True)


def load_document(
    path: Path, options: ReadOptions = ReadOptions(), *, stored: Callable[[str], StoredVersion | None] | None = None
) -> LoadedDocument | None:
    """The record for one file and what was left out of it; raises SourceError (NotADocument)
    when the file cannot be a document. None when `stored` (document id → stored version) shows
    the file unchanged, which is known before it is parsed: the hash covers the file's bytes and
    the picture files it names, and which files those are follows from its bytes."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SourceError(UNREADABLE, exc.strerror or str(exc)) from exc
    inner_name = path.name[: -len(".gz")] if path.name.lower().endswith(".gz") else path.name
    source = detect(path.name, raw)
    uri = path.resolve().as_uri()
    read_with = options.key() if source.format.reads_options else ""
    prefix = f"{INGEST_VERSION}\0{source.format.name}\0{read_with}\0".encode() + raw
    known = stored(document_id_for(uri)) if stored is not None else None
    if known is not None and known.picture_sources is not None:
        again = {src: _read_picture(path.parent, src) for src in known.picture_sources}
        if _content_hash(prefix, again) == known.content_hash:
            return None
    parsed = source.format.read(source.data, options)
    if not parsed.has_text:
        raise NotADocument(NO_TEXT)
    pictures, found = _load_pictures(path.parent, parsed)
    content_hash = _content_hash(prefix, {src: result for src, result in found.items() if src not in parsed.embedded})
    left_out = [(src, result) for src, result in found.items() if isinstance(result, str)]
    warnings = [Problem(str(path), why, src) for src, why in left_out]
    title = parsed.title or PurePath(inner_name).stem
    meta = _document_meta(source, inner_name, parsed, left_out)
    record = _record(uri, title, meta, parsed, pictures, content_hash)
    return LoadedDocument(replace(record, picture_sources=[s for s in found if s not in parsed.embedded]), warnings)


PictureRead = tuple[bytes, str] | str
"""A picture's bytes and media type, or why it was left out."""


def _content_hash(prefix: bytes, pictures: dict[str, PictureRead]) -> str:
    """Covers everything the rows derive from: ingest version, format, options, the file's bytes,
    and each picture file it names (bytes, or that it was unusable) in order."""
    hasher = hashlib.sha256(prefix)
    for src, result in pictures.items():
        hasher.update(f"\0{src}\0".encode() + (result[0] if isinstance(result, tuple) else b"-"))
    return hasher.hexdigest()


def _document_meta(
    source: Source, name: str, parsed: ParsedText, left_out: list[tuple[str, str]]
) -> dict[str, object]:
    meta: dict[str, object] = {"format": source.format.name, "file_name": name, **parsed.meta}
    if source.compressed:
        meta["compression"] = "gzip"
    if left_out:
        meta["pictures_left_out"] = [{"src": src, "reason": why} for src, why in left_out]
    return meta


def _load_pictures(
    base: Path, parsed: ParsedText
) -> tuple[dict[str, StoredPicture | None], dict[str, PictureRead]]:
    """Each distinct picture source, in order of first appearance, numbered `#/pictures/<n>`
    over the valid ones only, so every ref a chunk carries has bytes behind it; and what reading
    each one gave."""
    sources: dict[str, PictureSource] = {}
    for block in parsed.blocks:
        for picture in block.pictures:
            sources.setdefault(picture.src, picture)
    loaded: dict[str, StoredPicture | None] = {}
    found: dict[str, PictureRead] = {}
    valid = 0
    for src, source in sources.items():
        embedded = parsed.embedded.get(src)
        result = found[src] = _checked(embedded.data) if embedded is not None else _read_picture(base, src)
        if isinstance(result, str):
            loaded[src] = None
            continue
        loaded[src] = StoredPicture(f"{PICTURE_REF_PREFIX}{valid}", result[0], result[1], source.caption)
        valid += 1
    return loaded, found


def _read_picture(base: Path, src: str) -> PictureRead:
    """Bytes and media type, or why not. Nothing is fetched: ingest reads local files only."""
    if _URL_SCHEME.match(src) and not src.startswith("file:"):
        return PICTURE_NOT_LOCAL
    local = unquote(src.removeprefix("file://").split("#", 1)[0].split("?", 1)[0])
    try:
        data = (base / local).read_bytes()
    except FileNotFoundError:
        return PICTURE_NOT_FOUND
    except OSError:
        return PICTURE_UNREADABLE
    return _checked(data)


def _checked(data: bytes) -> PictureRead:
    picture = decode_picture(data)
    return PICTURE_NOT_DECODABLE if picture is None else (data, picture.media_type)


def _record(
    uri: str,
    title: str,
    meta: dict[str, object],
    parsed: ParsedText,
    pictures: dict[str, StoredPicture | None],
    content_hash: str,
) -> DocumentRecord:
    document = Document(id=document_id_for(uri), uri=uri, title=title, meta=meta, page_count=parsed.page_count)
    chunks: list[Chunk] = []
    for ordinal, draft in enumerate(chunk_blocks(parsed.blocks)):
        stored = list({p.self_ref: p for s in draft.pictures if (p := pictures.get(s.src)) is not None}.values())
        labels = (["text"] if draft.content else []) + (["picture"] if stored else [])
        pages = [p.self_ref for s in draft.pictures if s.whole_page and (p := pictures.get(s.src)) is not None]
        chunks.append(
            Chunk(
                id=chunk_id_for(uri, ordinal, hashlib.sha256(draft.content.encode()).hexdigest()),
                document_id=document.id,
                ordinal=ordinal,
                content=draft.content,
                headings=list(draft.headings),
                page_numbers=[draft.page],
                labels=labels or ["text"],
                doc_item_refs=[f"{TEXT_REF_PREFIX}{i}" for i in draft.blocks] + [p.self_ref for p in stored],
                picture_captions={p.self_ref: p.caption for p in stored if p.caption},
                meta={PAGE_IMAGE_META: pages[0]} if pages else {},
            )
        )
    valid = [p for p in pictures.values() if p is not None]
    return DocumentRecord(document=document, chunks=chunks, pictures=valid, content_hash=content_hash)
