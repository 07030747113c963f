"""PDF through pypdfium2: text per physical page, the outline as headings, pages as pictures.

Pages are the file's physical pages, numbered from 1, so a citation's page is the one a viewer
opens (a printed "page iv" label is not used). A PDF keeps no paragraphs, only positioned lines:
a line much shorter than the page's usual line ends a paragraph (a heading, a paragraph's last
line), and the rest are joined with spaces. The outline (bookmarks), when there is one, gives
every page the heading path in force where the page starts.

With page images on, each page is rendered and stored as that page's picture, referred to by
every chunk of the page (and alone for a page without text), so with `vision: true` a result
carries the page it came from, by the same rules as any picture. pdfium is not thread-safe:
every call into it holds `PDFIUM_LOCK`.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Iterator

import pypdfium2 as pdfium

from ..parsed import Block, EmbeddedPicture, ParsedText, PictureSource
from ..problems import BAD_PDF, NO_TEXT_LAYER, PASSWORD_PROTECTED, SourceError
from .options import ReadOptions

PDFIUM_LOCK = threading.Lock()
"""One per process: pdfium's global state must never be entered from two threads at once."""

PAGE_IMAGE_MAX_SIDE = 1024
"""Pixels on a rendered page's longer side: about 90 dpi for A4 or Letter, enough for a vision
model to read body text and see figures, at roughly 150 KB a page as JPEG."""
PAGE_IMAGE_MAX_SCALE = 2.0
"""Small pages (slides, A6) are rendered at 144 dpi at most rather than blown up to the limit."""
PAGE_IMAGE_QUALITY = 75
PAGE_IMAGE_PREFIX = "pdf-page:"
SHORT_LINE = 0.7
"""A line shorter than this share of the page's usual (90th percentile) line ends a paragraph."""
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def page_image_src(page: int) -> str:
    return f"{PAGE_IMAGE_PREFIX}{page}"


def paragraphs(page_text: str) -> list[str]:
    """A page's lines as paragraphs (see the module's docstring); a word hyphenated across a line
    break is joined again."""
    lines = [_CONTROL.sub("", line).strip() for line in page_text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    lengths = sorted(len(line) for line in lines if line)
    if not lengths:
        return []
    usual = lengths[min(len(lengths) - 1, int(len(lengths) * 0.9))]
    found: list[str] = []
    current = ""
    for line in lines:
        if line:
            if not current:
                current = line
            elif current.endswith("-") and current[-2:-1].isalpha() and line[:1].islower():
                current = current[:-1] + line
            else:
                current = f"{current} {line}"
        if current and (not line or len(line) < SHORT_LINE * usual):
            found.append(current)
            current = ""
    if current:
        found.append(current)
    return found


def _outline(document: pdfium.PdfDocument) -> list[tuple[int, tuple[str, ...]]]:
    """(first page index, heading path) for each outline entry that points at a page."""
    entries: list[tuple[int, tuple[str, ...]]] = []
    stack: list[str] = []
    for bookmark in document.get_toc():
        title = " ".join(bookmark.get_title().split())
        del stack[bookmark.level:]
        stack.append(title)
        destination = bookmark.get_dest()
        index = destination.get_index() if destination is not None else None
        if index is not None and title:
            entries.append((index, tuple(stack)))
    return sorted(entries, key=lambda entry: entry[0])


def _headings_by_page(entries: list[tuple[int, tuple[str, ...]]], pages: int) -> Iterator[tuple[str, ...]]:
    current: tuple[str, ...] = ()
    position = 0
    for index in range(pages):
        while position < len(entries) and entries[position][0] <= index:
            current = entries[position][1]
            position += 1
        yield current


def _page_paragraphs(document: pdfium.PdfDocument, index: int) -> list[str]:
    page = document[index]
    try:
        textpage = page.get_textpage()
        try:
            return paragraphs(textpage.get_text_range())
        finally:
            textpage.close()
    finally:
        page.close()


def _render(document: pdfium.PdfDocument, index: int) -> bytes:
    """The page as a JPEG, its longer side PAGE_IMAGE_MAX_SIDE pixels (see there)."""
    page = document[index]
    try:
        width, height = page.get_size()
        scale = min(PAGE_IMAGE_MAX_SIDE / max(width, height, 1.0), PAGE_IMAGE_MAX_SCALE)
        bitmap = page.render(scale=scale, rev_byteorder=True)
        try:
            buffer = io.BytesIO()
            image = bitmap.to_pil()
            (image if image.mode == "RGB" else image.convert("RGB")).save(buffer, "JPEG", quality=PAGE_IMAGE_QUALITY)
            return buffer.getvalue()
        finally:
            bitmap.close()
    finally:
        page.close()


def _title(document: pdfium.PdfDocument) -> str | None:
    title = " ".join(str(document.get_metadata_dict().get("Title") or "").split())
    return title if title and title.lower() != "untitled" else None


def _open(data: bytes) -> pdfium.PdfDocument:
    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        if "password" in str(exc).lower():
            raise SourceError(PASSWORD_PROTECTED, str(exc)) from exc
        raise SourceError(BAD_PDF, str(exc)) from exc


def parse_pdf(data: bytes, *, page_images: bool = True) -> ParsedText:
    """Raises SourceError: BAD_PDF, PASSWORD_PROTECTED, or (D4) NO_TEXT_LAYER when no page has
    text: a scan, which is not OCRed here, and which stored empty would only ever find nothing."""
    with PDFIUM_LOCK:
        document = _open(data)
        try:
            pages = len(document)
            texts = [_page_paragraphs(document, index) for index in range(pages)]
            if not any(texts):
                raise SourceError(NO_TEXT_LAYER, f"{pages} page{'s' * (pages != 1)}, none with text; no OCR is done")
            title = _title(document)
            embedded = {page_image_src(n): EmbeddedPicture(_render(document, n - 1), "image/jpeg")
                        for n in range(1, pages + 1)} if page_images else {}
            headings = list(_headings_by_page(_outline(document), pages))
        except pdfium.PdfiumError as exc:
            raise SourceError(BAD_PDF, str(exc)) from exc
        finally:
            document.close()
    blocks: list[Block] = []
    for number, (page_texts, page_headings) in enumerate(zip(texts, headings, strict=True), start=1):
        src = page_image_src(number)
        pictures = (PictureSource(src=src, caption="", whole_page=True),) if src in embedded else ()
        blocks += [Block(text, page_headings, number, pictures) for text in page_texts]
        if not page_texts and pictures:
            blocks.append(Block("", page_headings, number, pictures))
    return ParsedText(title=title, blocks=blocks, pages=pages, embedded=embedded)


def read(data: bytes, options: ReadOptions) -> ParsedText:
    return parse_pdf(data, page_images=options.page_images)
