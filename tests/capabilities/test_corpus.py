"""The SQLite knowledge base: ingest, FTS5/BM25 search, context expansion, reading, pictures,
re-ingest, atomic writes and concurrent readers."""

from __future__ import annotations

import multiprocessing
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capabilities.corpus import NotACorpusError, SQLiteCorpus, ingest
from capabilities.corpus.chunking import PARAGRAPH_SEPARATOR, TARGET_CHARS, chunk_blocks
from capabilities.corpus.formats.html import parse_html
from capabilities.corpus.formats.markdown import parse_markdown
from capabilities.corpus.formats.text import parse_text
from capabilities.corpus.ingest import PICTURE_SUFFIXES
from capabilities.corpus.problems import (
    BAD_PDF,
    BINARY,
    DATABASE_ERROR,
    NO_SUCH_PATH,
    NO_TEXT,
    PICTURE_NOT_DECODABLE,
    PICTURE_NOT_FOUND,
    PICTURE_NOT_LOCAL,
    UNSUPPORTED,
    Problem,
)
from capabilities.corpus.query import STOPWORDS, content_words, match_expression
from capabilities.corpus.schema import open_reader, open_writer
from capabilities.corpus.sqlite import BM25_WEIGHTS
from capabilities.corpus.writer import document_id_for
from capabilities.store import PICTURE_REF_PREFIX, CorpusStore, RetrievedChunk
from tests.harness import FIXTURES, OTHER_PNG, PNG

CORPUS = FIXTURES / "corpus"
HANDBOOK = CORPUS / "handbook.md"
GUIDE = CORPUS / "guide.html"
NOTES = CORPUS / "notes.txt"
BROKEN = CORPUS / "broken-pictures.md"


def doc_id(path: Path) -> str:
    return document_id_for(path.resolve().as_uri())


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.db"
    ingest(path, [CORPUS])
    return path


@pytest.fixture
async def kb(db: Path):
    store = SQLiteCorpus(db)
    yield store
    await store.close()


async def section(kb: SQLiteCorpus, path: Path, heading: str) -> list[RetrievedChunk]:
    chunks = await kb.read(doc_id(path), page=None, section=heading, filter=None)
    assert chunks
    return chunks


async def ordinals(kb: SQLiteCorpus, chunk_ids: list[str]) -> list[int]:
    return [(await kb.get_chunk(cid)).ordinal for cid in chunk_ids]


FAILING_PICTURE_INSERT = (
    "CREATE TRIGGER fail_pictures BEFORE INSERT ON pictures BEGIN SELECT RAISE(ABORT, 'disk on fire'); END"
)
"""A fault injected in the database itself: the third table a document writes to refuses rows."""


def copy_corpus(tmp_path: Path) -> Path:
    """The fixture corpus and the pictures it refers to (`../pixel.png`), in a folder tests may edit."""
    root = tmp_path / "src"
    shutil.copytree(CORPUS, root / "corpus")
    for name in ("pixel.png", "square.png", "not-an-image.png"):
        shutil.copy(FIXTURES / name, root / name)
    return root / "corpus"


# --- ingest --------------------------------------------------------------------------------------


def test_ingest_adds_every_supported_file_and_reports_dropped_pictures_with_text_kept(tmp_path):
    report = ingest(tmp_path / "c.db", [CORPUS])
    assert sorted(report.added) == sorted(str(CORPUS / name) for name in (
        "broken-pictures.md", "guide.html", "handbook.md", "notes.txt"))
    assert report.replaced == [] and report.unchanged == []
    assert report.failed == [] and report.skipped == []
    assert report.warnings == [
        Problem(str(BROKEN), PICTURE_NOT_DECODABLE, "../not-an-image.png"),
        Problem(str(BROKEN), PICTURE_NOT_FOUND, "missing.png"),
        Problem(str(BROKEN), PICTURE_NOT_LOCAL, "https://example.com/logo.png"),
    ]


async def test_document_with_dropped_pictures_keeps_its_text_and_no_picture_refs(kb):
    results = await kb.search("missing chart", limit=5, filter=None)
    assert results[0].document_id == doc_id(BROKEN)
    assert "A missing chart" in results[0].content
    assert not any(ref.startswith(PICTURE_REF_PREFIX) for ref in results[0].doc_item_refs)
    assert results[0].pictures == {} and results[0].picture_captions == {}


async def test_document_ids_derive_from_the_resolved_uri_and_titles_from_the_source(kb):
    handbook = await kb.get_document(doc_id(HANDBOOK))
    assert handbook.uri == HANDBOOK.resolve().as_uri()
    assert handbook.title == "Oakridge Observatory Handbook"
    assert handbook.page_count == 2
    assert handbook.meta == {"format": "markdown", "file_name": "handbook.md", "encoding": "utf-8"}
    assert (await kb.get_document(doc_id(GUIDE))).title == "Volunteer Guide"
    assert (await kb.get_document(doc_id(NOTES))).title == "notes"
    assert await kb.get_document(handbook.uri) == handbook


def test_reingesting_an_unchanged_file_skips_it(tmp_path, db):
    before = sqlite3.connect(db).execute("SELECT id FROM chunks ORDER BY id").fetchall()
    report = ingest(db, [CORPUS])
    assert report.added == [] and report.replaced == []
    assert len(report.unchanged) == 4
    assert sqlite3.connect(db).execute("SELECT id FROM chunks ORDER BY id").fetchall() == before


async def test_reingesting_a_changed_file_replaces_its_document_under_the_same_id(tmp_path):
    folder = copy_corpus(tmp_path)
    db = tmp_path / "c.db"
    ingest(db, [folder])
    handbook = folder / "handbook.md"
    store = SQLiteCorpus(db)
    old_opening = (await section(store, handbook, "Opening Hours"))[0]
    old_reflector = (await section(store, handbook, "Reflector"))[0]
    handbook.write_text(handbook.read_text().replace("opens at 19:00", "opens at 20:15"))

    report = ingest(db, [folder])

    assert report.replaced == [str(handbook)]
    assert report.added == [] and len(report.unchanged) == 3
    new_opening = (await section(store, handbook, "Opening Hours"))[0]
    assert "20:15" in new_opening.content and new_opening.document_id == doc_id(handbook)
    assert new_opening.chunk_id != old_opening.chunk_id
    assert await store.get_chunk(old_opening.chunk_id) is None
    assert (await section(store, handbook, "Reflector"))[0].chunk_id == old_reflector.chunk_id
    assert await store.search("19", limit=5, filter=doc_id(handbook)) == []
    assert len(await store.list_documents(filter=None, offset=0, limit=50)) == 4
    await store.close()


def test_a_changed_picture_alone_replaces_its_document(tmp_path):
    folder = copy_corpus(tmp_path)
    db = tmp_path / "c.db"
    ingest(db, [folder])
    shutil.copy(FIXTURES / "pixel.png", folder.parent / "square.png")
    report = ingest(db, [folder])
    assert report.replaced == [str(folder / "guide.html"), str(folder / "handbook.md")]


def test_D2_bad_files_are_reported_with_their_reason_and_the_rest_ingested(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "good.md").write_text("# Good\n\nThe lighthouse keeper logs the weather.\n")
    (folder / "binary.txt").write_bytes(b"abc\x00def")
    (folder / "manual.pdf").write_bytes(b"%PDF-1.4")
    (folder / "empty.md").write_text("# Only a heading\n")
    (folder / "script.py").write_text("print('not a document')\n")
    (folder / "picture.png").write_bytes(PNG)
    (folder / ".hidden.md").write_text("hidden text")
    missing = tmp_path / "nowhere.md"
    db = tmp_path / "c.db"

    report = ingest(db, [folder, folder / "picture.png", missing])

    assert report.added == [str(folder / "good.md")]
    failed = {problem.path: problem.reason for problem in report.failed}
    assert failed == {
        str(folder / "binary.txt"): BINARY,
        str(folder / "manual.pdf"): BAD_PDF,
        str(folder / "picture.png"): UNSUPPORTED,
        str(missing): NO_SUCH_PATH,
    }
    assert {problem.path: problem.reason for problem in report.skipped} == {
        str(folder / "empty.md"): NO_TEXT,
        str(folder / "script.py"): UNSUPPORTED,
    }
    assert report.outcome == "partial"
    titles = [row[0] for row in sqlite3.connect(db).execute("SELECT title FROM documents")]
    assert titles == ["Good"]


def test_pictures_in_a_folder_are_assets_not_errors(tmp_path):
    folder = copy_corpus(tmp_path).parent
    report = ingest(tmp_path / "c.db", [folder])
    assert ".png" in PICTURE_SUFFIXES
    problems = report.failed + report.skipped + report.warnings
    assert not any(problem.path.endswith(".png") for problem in problems)


def test_failure_midway_through_a_document_leaves_no_partial_rows(tmp_path):
    folder = copy_corpus(tmp_path)
    db = tmp_path / "c.db"
    conn = open_writer(db)
    conn.execute(FAILING_PICTURE_INSERT)
    conn.close()

    report = ingest(db, [folder])

    failed = {problem.path: problem.detail for problem in report.failed if problem.reason == DATABASE_ERROR}
    assert set(failed) == {str(folder / "handbook.md"), str(folder / "guide.html")}
    assert all("disk on fire" in detail for detail in failed.values())
    assert sorted(report.added) == [str(folder / "broken-pictures.md"), str(folder / "notes.txt")]
    check = sqlite3.connect(db)
    for path in (folder / "handbook.md", folder / "guide.html"):
        document = doc_id(path)
        assert check.execute("SELECT count(*) FROM documents WHERE id = ?", (document,)).fetchone() == (0,)
        assert check.execute("SELECT count(*) FROM chunks WHERE document_id = ?", (document,)).fetchone() == (0,)
        assert check.execute("SELECT count(*) FROM pictures WHERE document_id = ?", (document,)).fetchone() == (0,)
    chunk_rows = check.execute("SELECT count(*) FROM chunks").fetchone()
    assert check.execute("SELECT count(*) FROM chunks_fts").fetchone() == chunk_rows


def test_failure_while_replacing_a_document_keeps_the_old_version_whole(tmp_path):
    folder = copy_corpus(tmp_path)
    db = tmp_path / "c.db"
    ingest(db, [folder])
    check = sqlite3.connect(db)
    before = check.execute("SELECT id, content FROM chunks ORDER BY seq").fetchall()
    check.execute(FAILING_PICTURE_INSERT)
    check.commit()
    handbook = folder / "handbook.md"
    handbook.write_text(handbook.read_text().replace("400 mm", "500 mm"))

    report = ingest(db, [folder])

    assert report.replaced == []
    assert any(p.path == str(handbook) and "disk on fire" in p.detail for p in report.failed)
    assert check.execute("SELECT id, content FROM chunks ORDER BY seq").fetchall() == before
    assert check.execute("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH '400'").fetchone() == (1,)


# --- search --------------------------------------------------------------------------------------


async def test_search_ranks_by_bm25_best_first_with_the_score_in_each_result(kb, db):
    results = await kb.search("reflector mirror", limit=10, filter=None)
    reflector = (await section(kb, HANDBOOK, "Reflector"))[0]
    assert results[0].chunk_id == reflector.chunk_id
    scores = [r.score for r in results]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1] > 0
    weights = ", ".join(map(str, BM25_WEIGHTS))
    expected = sqlite3.connect(db).execute(
        f"SELECT -bm25(chunks_fts, {weights}) FROM chunks_fts JOIN chunks ON chunks.seq = chunks_fts.rowid"
        " WHERE chunks_fts MATCH ? AND chunks.id = ?",
        (match_expression("reflector mirror"), reflector.chunk_id),
    ).fetchone()[0]
    assert results[0].score == pytest.approx(expected)


async def test_search_respects_limit_and_stems_words(kb):
    results = await kb.search("opening telescope domes", limit=2, filter=None)
    assert len(results) == 2
    assert all({"dome", "open", "telescope"} & set(r.content.lower().replace(".", " ").split()) for r in results)
    assert await kb.search("dome", limit=0, filter=None) == []


@pytest.mark.parametrize(
    "query",
    ['mirror AND (', '"mirror', 'mirror"', '-mirror', 'mirror*', '*mirror', 'NEAR(mirror', 'content:mirror',
     '^mirror', 'mirror OR', '(mirror))', "mirror's", 'NOT mirror', 'mirror + -- ;DROP TABLE chunks'],
)
async def test_fts_hostile_queries_are_searched_as_plain_words(kb, query):
    results = await kb.search(query, limit=3, filter=None)
    reflector = (await section(kb, HANDBOOK, "Reflector"))[0]
    assert results[0].chunk_id == reflector.chunk_id


@pytest.mark.parametrize("query", ['"', "-", "*", "(", ") OR (", "", "   ", "^", ":", "NEAR()"])
async def test_queries_without_words_find_nothing(kb, query):
    assert await kb.search(query, limit=5, filter=None) == []


async def test_a_query_of_stopwords_only_is_matched_as_a_phrase(kb):
    [result] = await kb.search("For about?", limit=5, filter=None)
    assert "for about twenty minutes" in result.content
    assert await kb.search("about for", limit=5, filter=None) == []
    assert await kb.search("a AND (", limit=5, filter=None) == []


def test_content_words_drop_stopwords_and_keep_joined_forms():
    assert content_words("What time does the Observatory open?") == ["time", "observatory", "open"]
    assert content_words("is it the") == []
    assert content_words("Figure 6.43 and e-mail, figure") == ["figure", "6.43", "e-mail"]
    assert content_words("content:mirror and/or mirror's") == ["content", "mirror"]
    assert {"the", "and", "what"} <= STOPWORDS
    assert match_expression("is it the") == '"is it the"'


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_no_text_makes_the_match_expression_an_fts_syntax_error(text):
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(content, tokenize = 'porter unicode61 remove_diacritics 2')")
    conn.execute("INSERT INTO t VALUES ('some text')")
    expression = match_expression(text)
    if expression is not None:
        conn.execute("SELECT rowid FROM t WHERE t MATCH ?", (expression,)).fetchall()


async def test_filter_scopes_search_to_one_document_by_id_or_uri(kb):
    unscoped = await kb.search("dome", limit=10, filter=None)
    assert {r.document_id for r in unscoped} == {doc_id(HANDBOOK), doc_id(GUIDE)}
    by_id = await kb.search("dome", limit=10, filter=doc_id(GUIDE))
    by_uri = await kb.search("dome", limit=10, filter=GUIDE.resolve().as_uri())
    assert by_id and {r.document_id for r in by_id} == {doc_id(GUIDE)}
    assert [r.chunk_id for r in by_uri] == [r.chunk_id for r in by_id]
    assert await kb.search("dome", limit=10, filter="no-such-document") == []


async def test_filtered_search_is_not_cut_short_by_other_documents_hits(tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    for n in range(12):
        (folder / f"loud-{n:02}.md").write_text("# Loud\n\nbeacon beacon beacon beacon\n")
    (folder / "quiet.md").write_text("# Quiet\n\nOne beacon among many other words in a long quiet paragraph.\n")
    db = tmp_path / "c.db"
    ingest(db, [folder])
    store = SQLiteCorpus(db)
    results = await store.search("beacon", limit=3, filter=doc_id(folder / "quiet.md"))
    assert [r.document_title for r in results] == ["Quiet"]
    await store.close()


# --- context expansion ---------------------------------------------------------------------------


async def test_expand_context_joins_each_hit_with_its_neighbours_in_order(kb):
    hit = (await kb.search("reflector mirror collimate", limit=1, filter=None))[0]
    refractor = (await section(kb, HANDBOOK, "Refractor"))[0]
    safety = (await section(kb, HANDBOOK, "Safety Rules"))[0]

    [expanded] = await kb.expand_context([hit])

    assert expanded.chunk_id == hit.chunk_id and expanded.score == hit.score
    assert expanded.chunk_ids == [refractor.chunk_id, hit.chunk_id, safety.chunk_id]
    assert expanded.content == PARAGRAPH_SEPARATOR.join([refractor.content, hit.content, safety.content])
    assert expanded.headings == hit.headings
    assert expanded.page_numbers == [1, 2]
    assert expanded.pictures == {"#/pictures/0": PNG}
    assert expanded.picture_captions == {"#/pictures/0": "Diagram of the brass refractor"}
    assert "#/pictures/0" in expanded.doc_item_refs


async def test_expand_context_at_a_document_edge_has_one_neighbour(kb):
    first = (await kb.read(doc_id(HANDBOOK), page=None, section=None, filter=None))[0]
    [expanded] = await kb.expand_context([first])
    assert await ordinals(kb, expanded.chunk_ids) == [0, 1]


async def test_expand_context_shows_no_chunk_twice(kb):
    reflector = (await section(kb, HANDBOOK, "Reflector"))[0]
    refractor = (await section(kb, HANDBOOK, "Refractor"))[0]
    opening = (await section(kb, HANDBOOK, "Opening Hours"))[0]

    expanded = await kb.expand_context([reflector, refractor, opening])

    assert [r.chunk_id for r in expanded] == [reflector.chunk_id, opening.chunk_id]
    assert await ordinals(kb, expanded[0].chunk_ids) == [2, 3, 4]
    assert await ordinals(kb, expanded[1].chunk_ids) == [0, 1]


async def test_expand_context_keeps_each_hit_among_its_own_documents_neighbours(kb):
    """The windows of hits in several documents are fetched together, never mixed."""
    shifts = (await section(kb, GUIDE, "Shifts"))[0]
    reflector = (await section(kb, HANDBOOK, "Reflector"))[0]

    expanded = await kb.expand_context([shifts, reflector])

    assert [r.chunk_id for r in expanded] == [shifts.chunk_id, reflector.chunk_id]
    assert {r.document_id for r in expanded} == {shifts.document_id, reflector.document_id}
    for result, hit in zip(expanded, (shifts, reflector), strict=True):
        window = [await kb.get_chunk(cid) for cid in result.chunk_ids]
        assert {c.document_id for c in window} == {hit.document_id}
        assert hit.chunk_id in result.chunk_ids and len(result.chunk_ids) == 3
    assert await ordinals(kb, expanded[1].chunk_ids) == [2, 3, 4]


# --- reading -------------------------------------------------------------------------------------


async def test_read_by_page_returns_that_pages_chunks(kb):
    page2 = await kb.read(doc_id(HANDBOOK), page=2, section=None, filter=None)
    assert [c.headings[-1] for c in page2] == ["Safety Rules", "Safety Rules", "Night Sky Map"]
    assert all(c.page_numbers == [2] for c in page2)
    assert page2[-1].pictures == {"#/pictures/1": OTHER_PNG}
    notes_page2 = await kb.read(doc_id(NOTES), page=2, section=None, filter=None)
    assert [c.content.split(":")[0] for c in notes_page2] == ["Second page"]


async def test_read_by_section_matches_any_heading_ignoring_case_and_spacing(kb):
    telescopes = await kb.read(doc_id(HANDBOOK), page=None, section="Telescopes", filter=None)
    assert [c.headings[-1] for c in telescopes] == ["Refractor", "Reflector"]
    reflector = await kb.read(doc_id(HANDBOOK), page=None, section="  reflector ", filter=None)
    assert [c.headings[-1] for c in reflector] == ["Reflector"]


async def test_read_without_page_or_section_returns_the_document_start(kb):
    start = await kb.read(doc_id(HANDBOOK), page=None, section=None, filter=None)
    assert await ordinals(kb, [c.chunk_id for c in start]) == [0, 1, 2, 3]
    assert start == await kb.read(doc_id(HANDBOOK), page=1, section=None, filter=None)


@pytest.mark.parametrize(
    ("document", "page", "section", "scope"),
    [
        ("no-such-document", None, None, None),
        ("HANDBOOK", 0, None, None),
        ("HANDBOOK", 3, None, None),
        ("HANDBOOK", None, "No Such Section", None),
        ("HANDBOOK", None, None, "GUIDE"),
        ("HANDBOOK", 1, None, "no-such-document"),
    ],
)
async def test_read_returns_none_for_unknown_document_page_section_or_outside_the_filter(
    kb, document, page, section, scope
):
    ids = {"HANDBOOK": doc_id(HANDBOOK), "GUIDE": doc_id(GUIDE)}
    result = await kb.read(ids.get(document, document), page=page, section=section, filter=ids.get(scope, scope))
    assert result is None


async def test_read_inside_the_filter_by_id_or_uri(kb):
    by_uri = await kb.read(doc_id(GUIDE), page=1, section=None, filter=GUIDE.resolve().as_uri())
    assert by_uri and {c.document_id for c in by_uri} == {doc_id(GUIDE)}


async def test_read_of_a_page_in_range_without_text_is_empty(tmp_path):
    source = tmp_path / "late.md"
    source.write_text("<!-- page 3 -->\n# Late\n\nText begins on page three.\n")
    db = tmp_path / "c.db"
    ingest(db, [source])
    store = SQLiteCorpus(db)
    assert (await store.get_document(doc_id(source))).page_count == 3
    assert await store.read(doc_id(source), page=2, section=None, filter=None) == []
    start = await store.read(doc_id(source), page=None, section=None, filter=None)
    assert [c.page_numbers for c in start] == [[3]]
    await store.close()


# --- pictures ------------------------------------------------------------------------------------


async def test_search_results_carry_the_bytes_and_captions_of_their_pictures(kb):
    [result] = await kb.search("brass refractor diagram", limit=1, filter=None)
    assert result.pictures == {"#/pictures/0": PNG}
    assert result.picture_captions == {"#/pictures/0": "Diagram of the brass refractor"}
    assert result.labels == ["text", "picture"]
    assert "pictures" not in result.model_dump()


async def test_picture_captions_are_searchable(kb):
    results = await kb.search("photo control panel", limit=1, filter=None)
    assert results[0].picture_captions == {"#/pictures/0": "Photo of the dome control panel"}
    assert results[0].pictures == {"#/pictures/0": OTHER_PNG}


async def test_get_picture_bytes_returns_stored_bytes_or_none(kb):
    assert await kb.get_picture_bytes(doc_id(HANDBOOK), "#/pictures/0") == PNG
    assert await kb.get_picture_bytes(doc_id(HANDBOOK), "#/pictures/1") == OTHER_PNG
    assert await kb.get_picture_bytes(doc_id(HANDBOOK), "#/pictures/9") is None
    assert await kb.get_picture_bytes("no-such-document", "#/pictures/0") is None


# --- documents, chunks, protocol -----------------------------------------------------------------


async def test_list_documents_pages_in_uri_order_within_the_filter(kb):
    everything = await kb.list_documents(filter=None, offset=0, limit=50)
    assert [d.uri for d in everything] == sorted(d.uri for d in everything) and len(everything) == 4
    pages = [await kb.list_documents(filter=None, offset=k, limit=3) for k in (0, 3, 6)]
    assert [len(p) for p in pages] == [3, 1, 0]
    assert pages[0] + pages[1] == everything
    assert [d.id for d in await kb.list_documents(filter=doc_id(GUIDE), offset=0, limit=50)] == [doc_id(GUIDE)]
    assert await kb.list_documents(filter="no-such-document", offset=0, limit=50) == []


async def test_get_chunk_returns_the_stored_chunk_or_none(kb):
    reflector = (await section(kb, HANDBOOK, "Reflector"))[0]
    chunk = await kb.get_chunk(reflector.chunk_id)
    assert chunk.content == reflector.content and chunk.document_id == doc_id(HANDBOOK) and chunk.ordinal == 3
    assert chunk.headings == ["Oakridge Observatory Handbook", "Telescopes", "Reflector"]
    assert await kb.get_chunk("no-such-chunk") is None


async def test_sqlite_corpus_is_a_corpus_store(kb):
    assert isinstance(kb, CorpusStore)


def test_opening_refuses_a_missing_file_or_one_that_is_not_a_corpus(tmp_path):
    with pytest.raises(FileNotFoundError):
        SQLiteCorpus(tmp_path / "absent.db")
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(NotACorpusError, match="not a corpus"):
        SQLiteCorpus(other)
    text = tmp_path / "text.db"
    text.write_text("hello, I am not a database at all" * 100)
    with pytest.raises(NotACorpusError):
        SQLiteCorpus(text)
    with pytest.raises(NotACorpusError):
        ingest(text, [NOTES])
    with pytest.raises(NotACorpusError):
        SQLiteCorpus(text, read_only=False)


def test_read_only_connections_cannot_write(db):
    conn = open_reader(db)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM documents")
    conn.close()


async def test_a_writable_corpus_is_created_empty_when_missing(tmp_path):
    store = SQLiteCorpus(tmp_path / "new.db", read_only=False)
    assert await store.list_documents(filter=None, offset=0, limit=10) == []
    await store.close()
    reader = SQLiteCorpus(tmp_path / "new.db")
    assert await reader.search("anything", limit=5, filter=None) == []
    await reader.close()
    await reader.close()


# --- concurrency ---------------------------------------------------------------------------------


VERSION_WORDS = ("alphaversion", "bravoversion")


def _version_text(word: str) -> str:
    paragraphs = [f"Paragraph {n} of the {word} edition, about a shared harbour beacon. " * 8 for n in range(12)]
    return "# Versions\n\n" + "\n\n".join(paragraphs) + "\n"


def _reader_process(db: str, seconds: float, queue) -> None:
    import asyncio

    async def main() -> tuple[int, set[str], list[str]]:
        store = SQLiteCorpus(db)
        searches, seen, problems = 0, set(), []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                results = await store.search("harbour beacon", limit=50, filter=None)
            except Exception as exc:  # noqa: BLE001 - reported back to the test
                problems.append(repr(exc))
                continue
            versions = {word for r in results for word in VERSION_WORDS if word in r.content}
            if len(versions) != 1 or len(results) < 12:
                problems.append(f"mixed or partial snapshot: {versions}, {len(results)} results")
            seen |= versions
            searches += 1
        await store.close()
        return searches, seen, problems

    queue.put(asyncio.run(main()))


def test_readers_in_two_processes_search_while_ingest_replaces_documents(tmp_path):
    source = tmp_path / "versions.md"
    source.write_text(_version_text(VERSION_WORDS[0]))
    db = tmp_path / "c.db"
    ingest(db, [source])
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    readers = [context.Process(target=_reader_process, args=(str(db), 3.0, queue)) for _ in range(2)]
    for reader in readers:
        reader.start()
    replaced = 0
    while any(reader.is_alive() for reader in readers) and queue.qsize() < len(readers):
        source.write_text(_version_text(VERSION_WORDS[(replaced + 1) % 2]))
        replaced += len(ingest(db, [source]).replaced)
    outcomes = [queue.get(timeout=60) for _ in readers]
    for reader in readers:
        reader.join(timeout=60)
    assert replaced > 5
    for searches, seen, problems in outcomes:
        assert problems == []
        assert searches > 0 and seen == set(VERSION_WORDS)


# --- parsing and chunking (pure) -----------------------------------------------------------------


def test_markdown_headings_become_heading_paths_and_fenced_code_is_not_a_heading():
    parsed = parse_markdown(
        "# Title\n\nIntro.\n\n## Part\n\n```\n# not a heading\n\nstill code\n```\n\n"
        "### Sub\n\nDeep.\n\n## Next\n\nBack up.\n"
    )
    assert parsed.title == "Title"
    assert [(b.headings, b.text.splitlines()[0]) for b in parsed.blocks] == [
        (("Title",), "Intro."),
        (("Title", "Part"), "```"),
        (("Title", "Part", "Sub"), "Deep."),
        (("Title", "Next"), "Back up."),
    ]
    assert "# not a heading\n\nstill code" in parsed.blocks[1].text


def test_markdown_images_become_pictures_with_their_caption_left_in_the_text():
    parsed = parse_markdown('Look: ![Zone map](img/zones.png "Zones") and ![](blank.png "Titled").\n')
    [block] = parsed.blocks
    assert block.text == "Look: Zone map and Titled."
    assert [(p.src, p.caption) for p in block.pictures] == [("img/zones.png", "Zone map"), ("blank.png", "Titled")]


def test_form_feeds_and_page_markers_start_new_pages():
    text = parse_text("one\n\ntwo\fthree\n<!-- page 7 -->\nseven\n")
    assert [(b.page, b.text) for b in text.blocks] == [(1, "one"), (1, "two"), (2, "three"), (7, "seven")]
    assert text.page_count == 7
    assert parse_markdown("no breaks at all\n").page_count == 1


def test_html_headings_paragraphs_and_image_alt_text():
    parsed = parse_html(GUIDE.read_text())
    assert parsed.title == "Volunteer Guide"
    assert [(b.headings[-1], b.text) for b in parsed.blocks] == [
        ("Volunteer Guide", "Volunteers sign the logbook in the entrance hall before every shift."),
        ("Shifts", "An evening shift lasts four hours and starts at 18:30."),
        ("Shifts", "Bring a red torch."),
        ("Shifts", "Wear warm clothes."),
        ("Equipment", "The dome control panel opens the shutter."),
        ("Equipment", "Photo of the dome control panel"),
    ]
    [picture] = parsed.blocks[-1].pictures
    assert (picture.src, picture.caption) == ("../square.png", "Photo of the dome control panel")


def test_long_sections_split_at_paragraph_boundaries_near_the_target_size():
    paragraphs = [f"Paragraph {n} " + "word " * (40 + 13 * n) for n in range(8)]
    parsed = parse_markdown("# Long\n\n" + "\n\n".join(p.strip() for p in paragraphs) + "\n\n# Other\n\nShort.\n")
    drafts = chunk_blocks(parsed.blocks)
    long_drafts = [d for d in drafts if d.headings == ("Long",)]
    assert len(long_drafts) > 1
    assert all(len(d.content) <= TARGET_CHARS for d in long_drafts)
    rebuilt = [p for d in long_drafts for p in d.content.split(PARAGRAPH_SEPARATOR)]
    assert rebuilt == [p.strip() for p in paragraphs]
    assert drafts[-1].headings == ("Other",) and drafts[-1].content == "Short."


def test_a_paragraph_longer_than_the_target_is_cut_at_sentence_ends():
    sentences = [f"Sentence number {n} says something useful about beacons." for n in range(40)]
    [block] = parse_text(" ".join(sentences)).blocks
    drafts = chunk_blocks([block])
    assert len(drafts) > 1 and all(len(d.content) <= TARGET_CHARS for d in drafts)
    assert " ".join(d.content for d in drafts) == " ".join(sentences)
    assert all(d.content.endswith(".") for d in drafts)

