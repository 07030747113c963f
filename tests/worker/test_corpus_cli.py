"""`grounded ingest` and `grounded corpus list|show|search` as a user runs them: one summary
line and the exit codes of D2, and what a corpus holds, printed without losing bracketed text."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from capabilities.corpus.embedding import EmbedderInfo
from capabilities.corpus.vectors import EMBEDDER_KEY
from tests.documents import manual_docx, scanned_pdf, text_pdf
from tests.harness import FIXTURES
from worker.cli import cli
from worker.cli import corpus as corpus_cli
from worker.settings import get_settings

runner = CliRunner()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "data"
    monkeypatch.setenv("GROUNDED_DATA_DIR", str(root))
    monkeypatch.setattr(corpus_cli.console, "width", 240)
    monkeypatch.setattr(corpus_cli.err, "width", 240)
    get_settings.cache_clear()
    yield root
    get_settings.cache_clear()


def grounded(*args: str):
    return runner.invoke(cli, list(args))


def test_D2_a_clean_ingest_exits_0_with_one_summary_line(data_dir, tmp_path):
    report = tmp_path / "report.json"
    done = grounded("ingest", str(FIXTURES / "corpus"), "--corpus", "handbook", "--report", str(report))
    assert done.exit_code == 0, done.output
    target = data_dir / "corpora" / "handbook.sqlite"
    assert done.stdout.splitlines() == [
        f"{target}: 4 added, 0 replaced, 0 unchanged; 3 pictures left out (1 file not found, "
        "1 not a picture Pillow can read, 1 remote, never fetched)",
        "search: BM25 only (no embedder; `--embedder MODEL` adds vectors for hybrid search)",
    ]
    assert done.stderr == "", "picture details only with --verbose"
    written = json.loads(report.read_text())
    assert written["outcome"] == "complete" and len(written["added"]) == 4 and len(written["warnings"]) == 3
    again = grounded("ingest", str(FIXTURES / "corpus"), "--corpus", "handbook", "-v")
    assert again.exit_code == 0 and again.stdout.splitlines()[0] == f"{target}: 0 added, 0 replaced, 4 unchanged"
    assert again.stderr == "", "the same missing picture is not warned again (D3)"


def test_verbose_lists_left_out_pictures_and_skipped_files(data_dir, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nSee ![chart](chart.png).\n")
    (folder / "tool.py").write_text("print(1)\n")
    done = grounded("ingest", str(folder), "--corpus", "docs", "--verbose")
    assert done.exit_code == 0
    assert "1 skipped (1 unsupported format)" in done.stdout
    assert f"skipped {folder / 'tool.py'}: unsupported format ('.py'" in done.stderr
    assert f"picture left out {folder / 'a.md'}: file not found (chart.png)" in done.stderr


def test_D2_some_failures_exit_1_and_are_listed_with_bracketed_names_intact(data_dir, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    text_pdf(folder / "manual.pdf")
    scanned_pdf(folder / "[scan] 1998.pdf")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 nothing else")
    done = grounded("ingest", str(folder), "--corpus", "docs")
    assert done.exit_code == 1, done.output
    assert "1 added" in done.stdout and "2 failed (1 PDF has no text layer, 1 not a readable PDF)" in done.stdout
    assert f"failed {folder / '[scan] 1998.pdf'}: PDF has no text layer (2 pages, none with text" in done.stderr
    assert f"failed {folder / 'broken.pdf'}: not a readable PDF" in done.stderr


def test_D2_nothing_ingested_exits_2_and_leaves_no_corpus(data_dir, tmp_path):
    scan = scanned_pdf(tmp_path / "scan.pdf")
    done = grounded("ingest", str(scan), str(tmp_path / "typo.md"), "--corpus", "empty")
    assert done.exit_code == 2
    assert "nothing could be ingested: no corpus file was written" in done.stderr
    assert "search:" not in done.stdout, "no corpus, so nothing to say about how it is searched"
    assert f"failed {tmp_path / 'typo.md'}: no such file or folder" in done.stderr
    assert not (data_dir / "corpora" / "empty.sqlite").exists()
    assert "empty" not in grounded("corpus", "list").stdout


def test_ingest_into_a_file_that_is_not_a_corpus_exits_2_with_one_line(data_dir):
    (data_dir / "corpora").mkdir(parents=True)
    (data_dir / "corpora" / "junk.sqlite").write_text("not a database " * 100)
    done = grounded("ingest", str(FIXTURES / "corpus"), "--corpus", "junk")
    assert done.exit_code == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "it is not a corpus (file is not a database); move it away or choose another --corpus" in done.stderr


@pytest.fixture
def mixed(data_dir, tmp_path) -> Path:
    folder = tmp_path / "mixed"
    folder.mkdir()
    text_pdf(folder / "manual.pdf")
    manual_docx(folder / "wick.docx")
    (folder / "notes.md").write_text("# [draft] Lamp notes\n\nThe keeper wrote [bcf70dce] in the log.\n")
    assert grounded("ingest", str(folder), "--corpus", "harbour").exit_code == 0
    return folder


def test_corpus_list_shows_each_corpus_with_its_counts(mixed):
    done = grounded("corpus", "list")
    assert done.exit_code == 0
    [line] = [line for line in done.stdout.splitlines() if "harbour" in line]
    name, documents, pages, chunks, formats, size = (cell.strip() for cell in line.split("│")[1:-1])
    assert (name, documents, pages, formats) == ("harbour", "3", "6", "docx 1, markdown 1, pdf 1")
    assert int(chunks) >= 6 and size.endswith(" MB")


def test_corpus_show_counts_documents_pages_chunks_formats_and_the_embedder(mixed, data_dir):
    done = grounded("corpus", "show", "harbour")
    assert done.exit_code == 0, done.output
    facts = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in done.stdout.splitlines()
             if line.count("│") == 3}
    assert facts["documents"] == "3" and facts["pages"] == "6" and facts["pictures"] == "5"
    assert facts["formats"] == "docx 1, markdown 1, pdf 1"
    assert facts["embedder"] == "none (full-text search only)"
    assert "Harbour Lamp Manual" in done.stdout and "[draft] Lamp notes" in done.stdout
    conn = sqlite3.connect(data_dir / "corpora" / "harbour.sqlite")
    recorded = EmbedderInfo(model="test:concepts", dimensions=8).model_dump_json()
    conn.execute("INSERT INTO corpus_meta (key, value) VALUES (?, ?)", (EMBEDDER_KEY, recorded))
    conn.commit()
    conn.close()
    assert "test:concepts (8 dimensions)" in grounded("corpus", "show", "harbour").stdout


def test_corpus_search_prints_document_page_heading_path_and_score(mixed):
    done = grounded("corpus", "search", "harbour", "fresnel chamois", "-k", "2")
    assert done.exit_code == 0, done.output
    [row] = [line for line in done.stdout.splitlines() if "Harbour Lamp Manual" in line]
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    assert cells[0] == "1" and float(cells[1]) > 0 and cells[3] == "2" and cells[4] == "Cleaning the Lens"
    notes = grounded("corpus", "search", "harbour", "keeper log", "-k", "1").stdout
    assert "[draft] Lamp notes" in notes and "[bcf70dce]" in notes


def test_corpus_commands_refuse_an_unknown_corpus_naming_the_known_ones(mixed):
    done = grounded("corpus", "show", "nope")
    assert done.exit_code == 2 and "known: harbour" in done.stderr
    assert grounded("corpus", "search", "../etc", "x").exit_code == 2


def test_a_progress_bar_starts_only_for_a_large_ingest(tmp_path):
    small, big = tmp_path / "small.md", tmp_path / "big.pdf"
    small.write_text("x")
    big.write_bytes(b"0" * corpus_cli.PROGRESS_MIN_BYTES)
    quiet = corpus_cli.IngestProgress(Console(force_terminal=True, width=100))
    quiet(0, 3, small)
    assert quiet.bar is None
    many = corpus_cli.IngestProgress(Console(force_terminal=True, width=100))
    many(0, corpus_cli.PROGRESS_MIN_FILES, small)
    large = corpus_cli.IngestProgress(Console(force_terminal=True, width=100))
    large(0, 1, big)
    assert many.bar is not None and large.bar is not None
    many(corpus_cli.PROGRESS_MIN_FILES, corpus_cli.PROGRESS_MIN_FILES, None)
    assert many.bar.tasks[0].completed == corpus_cli.PROGRESS_MIN_FILES
    many.close()
    large.close()
