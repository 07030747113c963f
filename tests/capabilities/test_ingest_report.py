"""What ingest says it did and leaves behind: outcomes and their summary (D2), pictures warned
once (D3), the journal mode a read-only mount needs (D5), and pruning (D6)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from capabilities.corpus import SQLiteCorpus, ingest
from capabilities.corpus.problems import NO_SUCH_PATH, NO_TEXT, PICTURE_NOT_FOUND, UNSUPPORTED, Problem
from capabilities.corpus.report import IngestReport, counted
from capabilities.corpus.schema import open_reader
from capabilities.corpus.writer import document_id_for
from tests.harness import FIXTURES

CORPUS = FIXTURES / "corpus"


def copy_corpus(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    shutil.copytree(CORPUS, root / "corpus")
    for name in ("pixel.png", "square.png", "not-an-image.png"):
        shutil.copy(FIXTURES / name, root / name)
    return root / "corpus"


def journal_mode(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


def test_D2_summary_counts_every_outcome_and_each_reason_in_one_line():
    report = IngestReport(
        corpus="docs.sqlite",
        added=["a.md", "b.pdf"],
        unchanged=["c.txt"],
        skipped=[Problem("x.py", UNSUPPORTED), Problem("y.sh", UNSUPPORTED), Problem("e.md", NO_TEXT)],
        failed=[Problem("gone.md", NO_SUCH_PATH)],
        warnings=[Problem("a.md", PICTURE_NOT_FOUND, "chart.png")],
        pruned=["old.md"],
    )
    assert report.summary() == (
        "docs.sqlite: 2 added, 0 replaced, 1 unchanged, 1 pruned, 3 skipped (2 unsupported format, "
        "1 no text to index), 1 failed (1 no such file or folder); 1 picture left out (1 file not found)"
    )
    assert "\n" not in report.summary()
    assert counted([]) == ""
    assert report.outcome == "partial"
    assert IngestReport(unchanged=["c"], skipped=[Problem("x", UNSUPPORTED)]).outcome == "complete"
    assert IngestReport(failed=[Problem("x", NO_SUCH_PATH)]).outcome == "nothing"
    assert report.as_dict()["failed"] == [{"path": "gone.md", "reason": NO_SUCH_PATH, "detail": ""}]


def test_D2_nothing_ingested_leaves_no_corpus_file_behind(tmp_path):
    folder = tmp_path / "only-code"
    folder.mkdir()
    (folder / "tool.py").write_text("print('x')\n")
    db = tmp_path / "new.sqlite"
    report = ingest(db, [folder, tmp_path / "typo"])
    assert report.outcome == "nothing" and report.corpus_removed
    assert list(tmp_path.glob("new.sqlite*")) == []


def test_D2_an_existing_corpus_is_kept_when_a_run_ingests_nothing(tmp_path):
    db = tmp_path / "c.sqlite"
    ingest(db, [CORPUS / "notes.txt"])
    report = ingest(db, [tmp_path / "typo"])
    assert report.outcome == "nothing" and not report.corpus_removed
    conn = open_reader(db)
    assert conn.execute("SELECT count(*) FROM documents").fetchone() == (1,)
    conn.close()


def test_D3_a_missing_picture_is_reported_when_its_version_is_stored_and_not_again(tmp_path):
    folder = copy_corpus(tmp_path)
    db = tmp_path / "c.db"
    first = ingest(db, [folder])
    assert len(first.warnings) == 3
    again = ingest(db, [folder])
    assert again.warnings == [] and len(again.unchanged) == 4
    broken = folder / "broken-pictures.md"
    conn = open_reader(db)
    [(meta,)] = conn.execute("SELECT meta FROM documents WHERE id = ?",
                             (document_id_for(broken.resolve().as_uri()),)).fetchall()
    conn.close()
    assert '"pictures_left_out"' in meta and "missing.png" in meta
    broken.write_text(broken.read_text() + "\nA new paragraph.\n")
    assert len(ingest(db, [folder]).warnings) == 3, "a new version is stored, and lacks them again"


def test_D5_ingest_leaves_the_file_in_rollback_journal_mode_without_wal_files(tmp_path):
    db = tmp_path / "c.db"
    report = ingest(db, [CORPUS])
    assert report.journal_mode == "delete" and journal_mode(db) == "delete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.db"]


async def test_D5_a_reader_sharing_the_wal_keeps_the_file_in_wal_mode_until_it_closes(tmp_path):
    db = tmp_path / "c.db"
    ingest(db, [CORPUS / "notes.txt"])
    host = SQLiteCorpus(db, read_only=False)  # a host serving the file read-write puts it in WAL mode
    reader = SQLiteCorpus(db)
    await reader.search("eyepiece", limit=1, filter=None)
    await host.close()
    report = ingest(db, [CORPUS / "handbook.md"])
    assert report.journal_mode == "wal" and report.added and journal_mode(db) == "wal"
    assert len(await reader.search("observatory", limit=5, filter=None)) > 0
    await reader.close()
    assert ingest(db, [CORPUS / "handbook.md"]).journal_mode == "delete" and journal_mode(db) == "delete"


async def test_D6_prune_removes_documents_whose_file_is_gone_from_a_given_folder(tmp_path):
    folder = copy_corpus(tmp_path)
    db = tmp_path / "c.db"
    ingest(db, [folder])
    (folder / "notes.txt").unlink()
    (folder / "guide.html").write_bytes(b"\x00broken now")
    assert ingest(db, [folder]).pruned == [], "without --prune nothing is removed"
    report = ingest(db, [folder], prune=True)
    assert report.pruned == [str((folder / "notes.txt").resolve())]
    store = SQLiteCorpus(db)
    uris = {d.uri for d in await store.list_documents(filter=None, offset=0, limit=50)}
    assert (folder / "notes.txt").resolve().as_uri() not in uris
    assert (folder / "guide.html").resolve().as_uri() in uris, "a file that is there but failed keeps its version"
    await store.close()


def test_D6_prune_touches_nothing_outside_the_given_folders_or_for_a_missing_one(tmp_path):
    folder = copy_corpus(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.md").write_text("# Keep\n\nThe other folder's document.\n")
    db = tmp_path / "c.db"
    ingest(db, [folder, other])
    (other / "keep.md").unlink()
    shutil.rmtree(folder)
    assert ingest(db, [folder], prune=True).pruned == []
    report = ingest(db, [other], prune=True)
    assert report.pruned == [str((other / "keep.md").resolve())]


def test_an_unchanged_file_with_its_pictures_is_recognised_before_it_is_parsed(tmp_path, monkeypatch):
    from capabilities.corpus.formats import markdown

    folder = copy_corpus(tmp_path)
    db = tmp_path / "c.db"
    ingest(db, [folder])
    parsed: list[int] = []
    real = markdown.parse_markdown
    monkeypatch.setattr(markdown, "parse_markdown", lambda text: parsed.append(1) or real(text))
    assert len(ingest(db, [folder]).unchanged) == 4 and parsed == []
    shutil.copy(FIXTURES / "pixel.png", folder.parent / "square.png")
    report = ingest(db, [folder])
    assert report.replaced == [str(folder / "guide.html"), str(folder / "handbook.md")] and parsed == [1]


def test_D3_D6_on_a_hybrid_corpus_warnings_come_with_the_stored_version_and_pruning_drops_vectors(tmp_path):
    from capabilities.corpus.embedding import corpus_embedder
    from tests.concepts import ConceptEmbeddingModel

    def embedder():
        return corpus_embedder(ConceptEmbeddingModel(16), name="test:concepts")

    folder = copy_corpus(tmp_path)
    db = tmp_path / "c.db"
    first = ingest(db, [folder], embedder=embedder())
    assert len(first.added) == 4 and len(first.warnings) == 3, "reported when the embedded batch is stored"
    (folder / "notes.txt").unlink()
    report = ingest(db, [folder], prune=True, embedder=embedder())
    assert report.pruned == [str((folder / "notes.txt").resolve())] and report.warnings == []
    conn = sqlite3.connect(db)
    chunks = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    assert conn.execute("SELECT count(*) FROM chunk_vectors").fetchone()[0] == chunks > 0
    conn.close()
    assert report.journal_mode == "delete"
