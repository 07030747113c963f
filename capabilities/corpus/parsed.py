"""What every format reader returns: blocks with their heading path, page and pictures.

A reader is pure (bytes in, `ParsedText` out); reading files, local pictures and the database is
the ingest shell's job. D1: pages are physical and 1-based, so a citation's page is the one to
open: a PDF's pages as a viewer numbers them, elsewhere a form feed (plain text) or a line
`<!-- page N -->` starts a new page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

PAGE_MARKER = re.compile(r"^\s*<!--\s*page\s+(\d+)\s*-->\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class PictureSource:
    """A picture as the source names it: `src` is a key of `ParsedText.embedded` when the bytes
    came with the source (DOCX images, PDF page images), else a path resolved against the source
    file's folder."""

    src: str
    caption: str
    whole_page: bool = False
    """The picture is the page itself (a rendered PDF page), not a figure on it."""


@dataclass(frozen=True)
class EmbeddedPicture:
    """Picture bytes that came inside the source itself."""

    data: bytes
    media_type: str


@dataclass(frozen=True)
class Block:
    """One paragraph (or list, code block, table) and where it sits in the document. A block
    with no text but pictures carries a picture alone (a PDF page without a text layer)."""

    text: str
    headings: tuple[str, ...]
    page: int
    pictures: tuple[PictureSource, ...] = ()


@dataclass(frozen=True)
class ParsedText:
    """A parsed source; `title` is None when the source names none (the shell picks one).

    `pages` is the physical page count when the format has one (a PDF whose last pages hold no
    text still has them); otherwise the last page any block is on. `meta` goes into the
    document's meta (the detected encoding, for instance).
    """

    title: str | None
    blocks: list[Block] = field(default_factory=list)
    pages: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    embedded: dict[str, EmbeddedPicture] = field(default_factory=dict)

    @property
    def page_count(self) -> int:
        if self.pages is not None:
            return self.pages
        return max((block.page for block in self.blocks), default=1)

    @property
    def has_text(self) -> bool:
        return any(block.text for block in self.blocks)
