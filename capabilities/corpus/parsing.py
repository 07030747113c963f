"""Markdown and plain text into blocks: paragraphs with their heading path, page and pictures.

Pure: parsers get text and return blocks; reading files and picture bytes is the ingest
shell's job. Pages: a form feed, or a line `<!-- page N -->`, starts a new page (the marker
sets the number); a file without either is page 1 throughout.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PictureSource:
    """A picture as the source names it: `src` is resolved against the source file's folder."""

    src: str
    caption: str


@dataclass(frozen=True)
class Block:
    """One paragraph (or list, code block, table cell run) and where it sits in the document."""

    text: str
    headings: tuple[str, ...]
    page: int
    pictures: tuple[PictureSource, ...] = ()


@dataclass(frozen=True)
class ParsedText:
    """A parsed source; `title` is None when the source names none (the shell picks one)."""

    title: str | None
    blocks: list[Block] = field(default_factory=list)

    @property
    def page_count(self) -> int:
        return max((block.page for block in self.blocks), default=1)


PAGE_MARKER = re.compile(r"^\s*<!--\s*page\s+(\d+)\s*-->\s*$", re.IGNORECASE)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_IMAGE = re.compile(
    r"""!\[(?P<alt>[^\]]*)\]\(\s*<?(?P<src>[^)\s>]+)>?(?:\s+["'(](?P<title>[^"')]*)["')])?\s*\)"""
)

PAGE_BREAK = None
"""What `paged_lines` yields between pages: a paragraph never continues across a page."""


def paged_lines(text: str) -> Iterator[tuple[int, str | None]]:
    """(page, line) for every line, with `PAGE_BREAK` lines where a page ends.

    Lines are split on newlines only: `str.splitlines` would also split on form feeds, which
    here mean "new page".
    """
    page = 1
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        marker = PAGE_MARKER.match(line)
        if marker:
            page = max(int(marker.group(1)), 1)
            yield page, PAGE_BREAK
            continue
        parts = line.split("\f")
        for number, part in enumerate(parts):
            if number:
                page += 1
                yield page, PAGE_BREAK
            if part or len(parts) == 1:
                yield page, part


class _Paragraphs:
    """Collects lines into blocks, flushing at blank lines, headings and page breaks."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self._lines: list[str] = []
        self._pictures: list[PictureSource] = []
        self._page = 1

    def add(self, page: int, line: str, pictures: list[PictureSource]) -> None:
        if not self._lines and not self._pictures:
            self._page = page
        self._lines.append(line)
        self._pictures.extend(pictures)

    def flush(self, headings: tuple[str, ...]) -> None:
        text = "\n".join(self._lines).strip()
        if text or self._pictures:
            self.blocks.append(Block(text, headings, self._page, tuple(self._pictures)))
        self._lines, self._pictures = [], []


def replace_images(line: str) -> tuple[str, list[PictureSource]]:
    """The line with each `![caption](src)` replaced by its caption, and the pictures found.

    The caption stays in the text so a reader of the chunk (and lexical search) sees what the
    picture shows; the alt text is the caption, else the image title.
    """
    pictures: list[PictureSource] = []

    def caption_of(match: re.Match[str]) -> str:
        caption = (match.group("alt") or match.group("title") or "").strip()
        pictures.append(PictureSource(src=match.group("src"), caption=caption))
        return caption

    return _IMAGE.sub(caption_of, line), pictures


def parse_markdown(text: str) -> ParsedText:
    """ATX headings (`#` to `######`) give each paragraph its heading path; the first level-1
    heading is the title. Fenced code is kept whole. Setext headings and reference-style images
    are read as plain text."""
    paragraphs = _Paragraphs()
    stack: list[tuple[int, str]] = []
    title: str | None = None
    fence: str | None = None
    for page, line in paged_lines(text):
        headings = tuple(heading for _, heading in stack)
        if line is PAGE_BREAK:
            paragraphs.flush(headings)
            continue
        opener = _FENCE.match(line)
        if fence is not None:
            paragraphs.add(page, line, [])
            if opener and opener.group(1).startswith(fence):
                fence = None
                paragraphs.flush(headings)
            continue
        if opener:
            paragraphs.flush(headings)
            fence = opener.group(1)
            paragraphs.add(page, line, [])
            continue
        heading = _HEADING.match(line)
        if heading:
            paragraphs.flush(headings)
            level, heading_text = len(heading.group(1)), replace_images(heading.group(2))[0].strip()
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, heading_text))
            if level == 1 and title is None and heading_text:
                title = heading_text
            continue
        if not line.strip():
            paragraphs.flush(headings)
            continue
        replaced, pictures = replace_images(line)
        paragraphs.add(page, replaced, pictures)
    paragraphs.flush(tuple(heading for _, heading in stack))
    return ParsedText(title=title, blocks=paragraphs.blocks)


def parse_text(text: str) -> ParsedText:
    """Paragraphs separated by blank lines, without headings or pictures."""
    paragraphs = _Paragraphs()
    for page, line in paged_lines(text):
        if line is PAGE_BREAK or not line.strip():
            paragraphs.flush(())
        else:
            paragraphs.add(page, line.rstrip(), [])
    paragraphs.flush(())
    return ParsedText(title=None, blocks=paragraphs.blocks)
