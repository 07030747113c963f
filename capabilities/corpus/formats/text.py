"""Plain text (`.txt`, and extensionless files such as README, NEWS, AUTHORS) into paragraphs.

Paragraphs are separated by blank lines; lines within one are kept, since plain text often
means its line breaks (lists, addresses, tables drawn with spaces). A form feed, or a line
`<!-- page N -->`, starts a new page.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..parsed import PAGE_MARKER, Block, ParsedText
from .encoding import read_decoded
from .options import ReadOptions

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


def parse_text(text: str) -> ParsedText:
    """Paragraphs separated by blank lines, without headings or pictures."""
    blocks: list[Block] = []
    lines: list[str] = []
    first_page = 1

    def flush() -> None:
        paragraph = "\n".join(lines).strip()
        if paragraph:
            blocks.append(Block(paragraph, (), first_page))
        lines.clear()

    for page, line in paged_lines(text):
        if line is PAGE_BREAK or not line.strip():
            flush()
            continue
        if not lines:
            first_page = page
        lines.append(line.rstrip())
    flush()
    return ParsedText(title=None, blocks=blocks)


def read(data: bytes, options: ReadOptions) -> ParsedText:
    return read_decoded(parse_text, data)
