"""Every format ingest reads, from files the tests write with real writers (tests/documents.py):
the text, page numbers, headings and pictures that come out, and the reasons when nothing can."""

from __future__ import annotations

import codecs
import gzip
import importlib
import io
import threading
import zipfile
from pathlib import Path

import pytest
from PIL import Image

from capabilities.corpus import ReadOptions, SQLiteCorpus, ingest
from capabilities.corpus.formats import pdf as pdf_module
from capabilities.corpus.formats.detect import detect
from capabilities.corpus.formats.encoding import decode_text
from capabilities.corpus.formats.html import parse_html
from capabilities.corpus.formats.markdown import parse_markdown
from capabilities.corpus.formats.pdf import PAGE_IMAGE_MAX_SIDE, paragraphs, parse_pdf
from capabilities.corpus.formats.rst import parse_rst
from capabilities.corpus.problems import (
    BAD_DOCX,
    BAD_GZIP,
    BINARY,
    NO_TEXT_LAYER,
    PASSWORD_PROTECTED,
    UNSUPPORTED,
    NotADocument,
)
from capabilities.corpus.writer import document_id_for
from capabilities.store import PICTURE_REF_PREFIX, RetrievedChunk
from tests.documents import (
    LAMP_RED,
    LATIN1_TEXT,
    MANUAL_PAGES,
    README_TEXT,
    PdfPage,
    gzipped_readme,
    latin1_file,
    manual_docx,
    red_square_png,
    rst_guide,
    scanned_pdf,
    text_pdf,
)


def doc_id(path: Path) -> str:
    return document_id_for(path.resolve().as_uri())


async def everything(store: SQLiteCorpus, path: Path) -> list[RetrievedChunk]:
    document = await store.get_document(doc_id(path))
    assert document is not None
    pages = [await store.read(document.id, page=n, section=None, filter=None) for n in range(1, document.page_count + 1)]
    return [chunk for page in pages for chunk in page or []]


def red_share(image: Image.Image) -> float:
    """The share of pixels close to the red the test pictures are drawn in."""
    rgb = image.convert("RGB").resize((64, 64))
    data = rgb.tobytes()
    pixels = [data[i : i + 3] for i in range(0, len(data), 3)]
    return sum(1 for r, g, b in pixels if abs(r - LAMP_RED[0]) < 40 and g < 80 and b < 80) / len(pixels)


@pytest.fixture
def manual(tmp_path: Path) -> Path:
    return text_pdf(tmp_path / "manual.pdf")


# --- PDF -----------------------------------------------------------------------------------------


async def test_D1_pdf_text_is_read_per_physical_page_numbered_from_one(tmp_path, manual):
    db = tmp_path / "c.db"
    report = ingest(db, [manual])
    assert report.added == [str(manual)] and report.outcome == "complete"
    store = SQLiteCorpus(db)
    document = await store.get_document(doc_id(manual))
    assert document.title == "Harbour Lamp Manual" and document.page_count == 4
    assert document.meta == {"format": "pdf", "file_name": "manual.pdf"}
    for number, page in enumerate(MANUAL_PAGES, start=1):
        text = " ".join(c.content for c in await store.read(document.id, page=number, section=None, filter=None))
        assert all(paragraph in text for paragraph in page.paragraphs)
    [hit] = await store.search("fresnel chamois cloth", limit=1, filter=None)
    assert hit.page_numbers == [2] and hit.headings == ["Cleaning the Lens"]
    assert "Wipe the fresnel lens with a soft chamois cloth every morning." in hit.content
    await store.close()


async def test_pdf_page_images_are_each_pages_picture_on_every_chunk_of_the_page(tmp_path, manual):
    db = tmp_path / "c.db"
    ingest(db, [manual])
    store = SQLiteCorpus(db)
    chunks = await everything(store, manual)
    for chunk in chunks:
        [ref] = [r for r in chunk.doc_item_refs if r.startswith(PICTURE_REF_PREFIX)]
        assert ref == f"{PICTURE_REF_PREFIX}{chunk.page_numbers[0] - 1}"
        assert set(chunk.pictures) == {ref}
    images = {n: Image.open(io.BytesIO(await store.get_picture_bytes(doc_id(manual), f"#/pictures/{n - 1}")))
              for n in range(1, 5)}
    assert {image.format for image in images.values()} == {"JPEG"}
    assert all(max(image.size) == PAGE_IMAGE_MAX_SIDE for image in images.values())
    assert red_share(images[2]) > 0.1, "the picture drawn on page 2 is in page 2's image"
    assert red_share(images[1]) == 0 and red_share(images[4]) == 0
    [blank] = await store.read(doc_id(manual), page=3, section=None, filter=None)
    assert blank.content == "" and blank.labels == ["picture"] and list(blank.pictures) == ["#/pictures/2"]
    await store.close()


async def test_pdf_without_page_images_has_no_pictures_and_its_blank_page_is_empty(tmp_path, manual):
    db = tmp_path / "c.db"
    ingest(db, [manual], options=ReadOptions(page_images=False))
    store = SQLiteCorpus(db)
    assert all(c.pictures == {} and c.labels == ["text"] for c in await everything(store, manual))
    assert await store.read(doc_id(manual), page=3, section=None, filter=None) == []
    assert await store.get_picture_bytes(doc_id(manual), "#/pictures/0") is None
    await store.close()


def test_D4_a_pdf_without_a_text_layer_fails_with_its_own_reason_and_stores_nothing(tmp_path):
    scan = scanned_pdf(tmp_path / "scan.pdf", pages=2)
    db = tmp_path / "c.db"
    report = ingest(db, [scan])
    [problem] = report.failed
    assert (problem.path, problem.reason) == (str(scan), NO_TEXT_LAYER)
    assert "2 pages" in problem.detail
    assert report.outcome == "nothing" and report.corpus_removed and not db.exists()


def test_a_password_protected_pdf_is_reported_as_such(tmp_path):
    from reportlab.pdfgen import canvas

    locked = tmp_path / "locked.pdf"
    pdf = canvas.Canvas(str(locked), encrypt="secret")
    pdf.drawString(72, 720, "Confidential keeper roster")
    pdf.save()
    report = ingest(tmp_path / "c.db", [locked])
    assert [(p.path, p.reason) for p in report.failed] == [(str(locked), PASSWORD_PROTECTED)]


def test_an_unchanged_pdf_is_recognised_before_it_is_parsed(tmp_path, manual, monkeypatch):
    db = tmp_path / "c.db"
    ingest(db, [manual])
    calls: list[int] = []
    real = pdf_module.parse_pdf
    monkeypatch.setattr(pdf_module, "parse_pdf", lambda data, **options: calls.append(1) or real(data, **options))
    assert ingest(db, [manual]).unchanged == [str(manual)] and calls == []
    assert ingest(db, [manual], options=ReadOptions(page_images=False)).replaced == [str(manual)]
    assert calls == [1]


def test_pdfium_is_entered_by_one_thread_at_a_time(manual):
    data = manual.read_bytes()
    expected = parse_pdf(data)
    results: list[object] = []

    def parse() -> None:
        results.append(parse_pdf(data))

    threads = [threading.Thread(target=parse) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [expected] * 4


def test_pdf_lines_become_paragraphs_at_short_lines_and_hyphenated_words_rejoin():
    page = ("Storm Signals\r\n"
            "During a gale the keeper hoists two black cones on the sig-\r\n"
            "nal mast, and keeps them up until the wind drops below force\r\n"
            "six.\r\n"
            "The foghorn sounds twice every minute while visibility is poor\r\n"
            "and the bell is struck in between, day and night, by the keeper.\r\n")
    assert paragraphs(page) == [
        "Storm Signals",
        "During a gale the keeper hoists two black cones on the signal mast, and keeps them up until the wind"
        " drops below force six.",
        "The foghorn sounds twice every minute while visibility is poor and the bell is struck in between, day"
        " and night, by the keeper.",
    ]
    assert paragraphs("") == []


# --- DOCX, reST ----------------------------------------------------------------------------------


async def test_docx_headings_text_table_and_embedded_picture(tmp_path):
    source = manual_docx(tmp_path / "wick.docx")
    db = tmp_path / "c.db"
    assert ingest(db, [source]).added == [str(source)]
    store = SQLiteCorpus(db)
    document = await store.get_document(doc_id(source))
    assert document.title == "Wick Trimming Guide" and document.meta["format"] == "docx"
    [hit] = await store.search("curved wick scissors", limit=1, filter=None)
    assert hit.headings == ["Wick Trimming Guide", "Tools"]
    assert hit.pictures == {"#/pictures/0": red_square_png()}
    assert hit.picture_captions == {"#/pictures/0": "The curved wick scissors"}
    text = " ".join(c.content for c in await everything(store, source))
    assert all(word in text for word in ("steady flame", "Interval", "Weekly", "Trim the corners square"))
    await store.close()


def test_a_file_named_docx_that_is_no_word_document_fails(tmp_path):
    fake = tmp_path / "fake.docx"
    with zipfile.ZipFile(fake, "w") as archive:
        archive.writestr("hello.txt", "not word")
    [problem] = ingest(tmp_path / "c.db", [fake]).failed
    assert problem.reason == BAD_DOCX


async def test_rst_sections_notes_and_images_through_docutils(tmp_path):
    source = rst_guide(tmp_path / "fog.rst")
    db = tmp_path / "c.db"
    report = ingest(db, [source])
    assert report.added == [str(source)] and report.warnings == []
    store = SQLiteCorpus(db)
    assert (await store.get_document(doc_id(source))).title == "Fog Signal Handbook"
    [bell] = await store.search("fog bell struck", limit=1, filter=None)
    assert bell.headings == ["Fog Signal Handbook", "Bells"]
    assert "Oil the bell hinge monthly." in bell.content, "an admonition is content, not chrome"
    assert bell.picture_captions == {"#/pictures/0": "The fog bell on its frame"}
    assert bell.pictures == {"#/pictures/0": red_square_png((40, 40))}
    text = " ".join(c.content for c in await everything(store, source))
    assert "Contents" not in text, "the generated table of contents is left out"
    [horn] = await store.search("diaphone", limit=1, filter=None)
    assert horn.headings == ["Fog Signal Handbook", "Horns"]
    await store.close()


def test_rst_cannot_include_files_or_raw_html():
    parsed = parse_rst("Title\n=====\n\n.. include:: /etc/passwd\n\n.. raw:: html\n\n   <b>raw secret</b>\n\nBody.\n")
    text = " ".join(block.text for block in parsed.blocks)
    assert "root" not in text and "raw secret" not in text and "Body." in text


# --- text without an extension, gzip, encodings ------------------------------------------------


async def test_a_gzipped_readme_is_read_as_text_by_its_content(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    readme = gzipped_readme(folder)
    db = tmp_path / "c.db"
    assert ingest(db, [folder]).added == [str(readme)]
    store = SQLiteCorpus(db)
    document = await store.get_document(doc_id(readme))
    assert document.title == "README"
    assert document.meta == {"format": "text", "file_name": "README", "encoding": "utf-8", "compression": "gzip"}
    [hit] = await store.search("high water north mole", limit=1, filter=None)
    assert hit.content.split("\n\n") == README_TEXT.strip().split("\n\n")
    await store.close()


async def test_D1_a_gzipped_pdf_is_read_per_physical_page_with_its_page_images(tmp_path, manual):
    packed = tmp_path / "manual.pdf.gz"
    packed.write_bytes(gzip.compress(manual.read_bytes()))
    db = tmp_path / "c.db"
    assert ingest(db, [packed]).added == [str(packed)]
    store = SQLiteCorpus(db)
    document = await store.get_document(doc_id(packed))
    assert document.title == "Harbour Lamp Manual" and document.page_count == 4
    assert document.meta == {"format": "pdf", "file_name": "manual.pdf", "compression": "gzip"}
    for number, page in enumerate(MANUAL_PAGES, start=1):
        text = " ".join(c.content for c in await store.read(document.id, page=number, section=None, filter=None))
        assert all(paragraph in text for paragraph in page.paragraphs)
    [hit] = await store.search("fresnel chamois cloth", limit=1, filter=None)
    assert hit.page_numbers == [2] and hit.headings == ["Cleaning the Lens"]
    image = Image.open(io.BytesIO(await store.get_picture_bytes(document.id, f"{PICTURE_REF_PREFIX}1")))
    assert red_share(image) > 0.1, "page 2's image, drawn from the unpacked PDF"
    await store.close()


async def test_D1_a_gzipped_markdown_file_keeps_its_sections_pages_and_pictures(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "lamp.png").write_bytes(red_square_png())
    packed = folder / "keeper.md.gz"
    packed.write_bytes(gzip.compress(
        "Keeper's Guide\n==============\n\nLight the lamp at sunset ![the lamp](lamp.png).\n\n<!-- page 2 -->\n\n"
        "## Storms\n\nHoist two black cones on the [signal mast](https://mast.example/).\n".encode()))
    db = tmp_path / "c.db"
    assert ingest(db, [folder]).added == [str(packed)]
    store = SQLiteCorpus(db)
    document = await store.get_document(doc_id(packed))
    assert document.title == "Keeper's Guide" and document.page_count == 2
    assert document.meta["format"] == "markdown" and document.meta["compression"] == "gzip"
    assert document.meta["file_name"] == "keeper.md"
    [first] = await store.read(document.id, page=1, section=None, filter=None)
    assert first.content == "Light the lamp at sunset the lamp." and first.headings == ["Keeper's Guide"]
    assert len(first.pictures) == 1
    [storms] = await store.read(document.id, page=2, section=None, filter=None)
    assert storms.content == "Hoist two black cones on the signal mast." and storms.page_numbers == [2]
    assert storms.headings == ["Keeper's Guide", "Storms"]
    await store.close()


def test_an_ingest_version_bump_re_parses_unchanged_files_once(tmp_path, manual, monkeypatch):
    """INGEST_VERSION is part of every content hash: after a parsing change raises it, the next
    ingest rebuilds files whose bytes did not change, and the one after finds them unchanged."""
    ingest_module = importlib.import_module("capabilities.corpus.ingest")  # the package's `ingest` is the function
    folder = tmp_path / "docs"
    folder.mkdir()
    notes = folder / "notes.md"
    notes.write_text("# Notes\n\nThe lamp burns paraffin.\n")
    pdf = folder / "manual.pdf"
    pdf.write_bytes(manual.read_bytes())
    db = tmp_path / "c.db"
    ingest(db, [folder])
    assert sorted(ingest(db, [folder]).unchanged) == [str(pdf), str(notes)]
    monkeypatch.setattr(ingest_module, "INGEST_VERSION", str(int(ingest_module.INGEST_VERSION) + 1))
    calls: list[int] = []
    real = pdf_module.parse_pdf
    monkeypatch.setattr(pdf_module, "parse_pdf", lambda data, **options: calls.append(1) or real(data, **options))
    bumped = ingest(db, [folder])
    assert sorted(bumped.replaced) == [str(pdf), str(notes)] and bumped.unchanged == [] and calls == [1]
    again = ingest(db, [folder])
    assert sorted(again.unchanged) == [str(pdf), str(notes)] and again.replaced == [] and calls == [1]


def test_extensionless_and_distribution_named_files_are_recognised_by_content(tmp_path, manual):
    folder = tmp_path / "doc"
    folder.mkdir()
    (folder / "NEWS").write_text("Version 2 adds storm cones.\n")
    (folder / "README.Debian").write_text("Packaged for the harbour office.\n")
    (folder / "changelog.Debian.gz").write_bytes(gzip.compress(b"lamp (2.0) stable; urgency=low\n"))
    (folder / "manual").write_bytes(manual.read_bytes())
    (folder / "run").write_text("#!/bin/sh\necho lamp\n")
    (folder / "blob").write_bytes(b"\x7fELF\x00\x00binary")
    (folder / "bundle.tar.gz").write_bytes(b"never decompressed")
    (folder / "broken.txt.gz").write_bytes(b"not gzip at all")
    report = ingest(tmp_path / "c.db", [folder])
    assert sorted(Path(p).name for p in report.added) == ["NEWS", "README.Debian", "changelog.Debian.gz", "manual"]
    assert {Path(p.path).name: p.reason for p in report.skipped} == {
        "run": UNSUPPORTED, "blob": BINARY, "bundle.tar.gz": UNSUPPORTED}
    assert [(Path(p.path).name, p.reason) for p in report.failed] == [("broken.txt.gz", BAD_GZIP)]
    assert detect("manual", manual.read_bytes()).format.name == "pdf"
    assert detect("index", b"<!DOCTYPE html><title>x</title>").format.name == "html"
    with pytest.raises(NotADocument):
        detect("notes.odt", b"PK")


async def test_a_latin1_file_is_decoded_and_its_encoding_recorded(tmp_path):
    source = latin1_file(tmp_path / "phare.txt")
    db = tmp_path / "c.db"
    ingest(db, [source])
    store = SQLiteCorpus(db)
    document = await store.get_document(doc_id(source))
    encoding = document.meta["encoding"]
    assert encoding != "utf-8" and source.read_bytes().decode(encoding) == LATIN1_TEXT
    [hit] = await store.search("tempête lentille", limit=1, filter=None)
    assert hit.content.split("\n\n") == LATIN1_TEXT.strip().split("\n\n")
    await store.close()


def test_text_in_utf16_with_a_bom_is_text_not_binary():
    data = codecs.BOM_UTF16_LE + "Phare de la Vieille".encode("utf-16-le")
    decoded = decode_text(data)
    assert decoded.text == "Phare de la Vieille" and decoded.encoding.startswith("utf-16")


# --- Markdown ------------------------------------------------------------------------------------


def test_markdown_setext_titles_reference_images_and_link_text_without_urls():
    parsed = parse_markdown(
        "Lamp Room\n=========\n\nSee [the tide tables](https://tides.example/north \"tides\") and ![Lens][lens].\n\n"
        "Rules\n-----\n\nKeep it <img src=\"wick.png\" alt=\"the wick\"> trimmed.\n\n"
        "[lens]: img/lens.png \"The lens\"\n"
    )
    assert parsed.title == "Lamp Room"
    first, second = parsed.blocks
    assert first.text == "See the tide tables and Lens." and first.headings == ("Lamp Room",)
    assert "tides.example" not in first.text
    assert [(p.src, p.caption) for p in first.pictures] == [("img/lens.png", "Lens")]
    assert second.headings == ("Lamp Room", "Rules")
    assert [(p.src, p.caption) for p in second.pictures] == [("wick.png", "the wick")]


def test_markdown_fenced_code_stays_whole_even_with_a_page_marker_inside():
    parsed = parse_markdown("# Code\n\n```text\nline one\n<!-- page 9 -->\nline two\n```\n\n<!-- page 2 -->\n\nAfter.\n")
    code, after = parsed.blocks
    assert code.text == "```text\nline one\n<!-- page 9 -->\nline two\n```" and code.page == 1
    assert (after.text, after.page) == ("After.", 2)
    assert parsed.page_count == 2


def test_markdown_lists_and_tables_are_one_block_each_and_front_matter_is_not_text():
    parsed = parse_markdown(
        "---\ntitle: Keeper's Checklist\nlayout: page\n---\n\n- trim the wick\n- polish the lens\n  1. inside\n\n"
        "| part | interval |\n|---|---|\n| wick | weekly |\n"
    )
    assert parsed.title == "Keeper's Checklist"
    assert [b.text for b in parsed.blocks] == [
        "- trim the wick\n- polish the lens\n  1. inside",
        "part | interval\nwick | weekly",
    ]


# --- HTML ----------------------------------------------------------------------------------------


def test_html_site_chrome_is_left_out_but_an_articles_own_header_stays():
    parsed = parse_html(
        "<html><body><header><a href='/'>Harbour Office</a> Home About</header>"
        "<nav><ul><li>Menu entry</li></ul></nav><div role='navigation'>Breadcrumbs</div>"
        "<main><article><header><h1>Lamp Log</h1><p>By the keeper</p></header>"
        "<p>The lamp was lit at 18:02.</p><footer>Filed under lamps</footer></article>"
        "<aside>Related posts</aside></main><footer>Copyright harbour office</footer></body></html>"
    )
    assert [b.text for b in parsed.blocks] == ["By the keeper", "The lamp was lit at 18:02.", "Filed under lamps"]
    assert parsed.title == "Lamp Log"


async def test_D7_an_expanded_pdf_result_carries_its_own_pages_image_only(tmp_path):
    pages = [PdfPage(f"Part {n}", [f"Paragraph about lamp number {n}, lit at dusk every day."]) for n in range(1, 6)]
    source = text_pdf(tmp_path / "parts.pdf", pages)
    db = tmp_path / "c.db"
    ingest(db, [source])
    store = SQLiteCorpus(db)
    [hit] = await store.search("lamp number 3", limit=1, filter=None)
    assert hit.page_numbers == [3] and hit.chunk_meta == {"page_image": "#/pictures/2"}
    [expanded] = await store.expand_context([hit])
    assert expanded.page_numbers == [2, 3, 4] and len(expanded.chunk_ids) == 3
    assert [ref for ref in expanded.doc_item_refs if ref.startswith(PICTURE_REF_PREFIX)] == ["#/pictures/2"]
    assert list(expanded.pictures) == ["#/pictures/2"]
    await store.close()


async def test_D7_a_page_without_text_is_no_neighbour_of_an_expanded_result(tmp_path, manual):
    db = tmp_path / "c.db"
    ingest(db, [manual])
    store = SQLiteCorpus(db)
    [hit] = await store.search("black cones gale", limit=1, filter=None)
    [expanded] = await store.expand_context([hit])
    assert hit.page_numbers == [4] and expanded.page_numbers == [4]
    assert list(expanded.pictures) == ["#/pictures/3"]
    await store.close()
