"""HTML into blocks with the standard library's `html.parser`, so ingest needs no extra package.

`h1`-`h6` give the heading path, block elements (paragraphs, list items, cells, ...) become
blocks, and `<img alt>` becomes a picture whose alt text is its caption. A comment
`<!-- page N -->` starts page N, as in Markdown; otherwise the whole page is page 1.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from .parsing import PAGE_MARKER, Block, ParsedText, PictureSource

_BLOCK_TAGS = frozenset(
    "address article aside blockquote body caption dd div dl dt fieldset figcaption figure footer "
    "form header hr li main nav ol p section table tbody td tfoot th thead tr ul".split()
)
_HEADING_TAGS = {f"h{level}": level for level in range(1, 7)}
_SKIPPED_TAGS = frozenset({"script", "style", "noscript", "template", "head"})
_SPACES = re.compile(r"\s+")


class _BlockCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[Block] = []
        self.title: str | None = None
        self._stack: list[tuple[int, str]] = []
        self._text: list[str] = []
        self._pictures: list[PictureSource] = []
        self._page = 1
        self._skipping = 0
        self._in_title = False
        self._title_text: list[str] = []
        self._pre = 0
        self._heading: tuple[int, list[str]] | None = None
        self.first_h1: str | None = None

    def _headings(self) -> tuple[str, ...]:
        return tuple(text for _, text in self._stack)

    def finish(self) -> None:
        self.close()
        self._flush()

    def _flush(self) -> None:
        raw = "".join(self._text)
        text = raw.strip("\n") if self._pre else _SPACES.sub(" ", raw).strip()
        if text or self._pictures:
            self.blocks.append(Block(text, self._headings(), self._page, tuple(self._pictures)))
        self._text, self._pictures = [], []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _SKIPPED_TAGS:
            self._skipping += 1
            return
        if self._skipping:
            return
        if tag in _HEADING_TAGS:
            self._flush()
            self._heading = (_HEADING_TAGS[tag], [])
        elif tag in _BLOCK_TAGS or tag == "pre":
            self._flush()
            self._pre += tag == "pre"
        elif tag == "br":
            self._text.append("\n")
        elif tag == "img":
            self._image(dict(attrs))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in ("img", "br", "hr"):
            self.handle_endtag(tag)

    def _image(self, attrs: dict[str, str | None]) -> None:
        src = (attrs.get("src") or "").strip()
        if not src:
            return
        caption = _SPACES.sub(" ", attrs.get("alt") or attrs.get("title") or "").strip()
        self._pictures.append(PictureSource(src=src, caption=caption))
        if caption:
            target = self._heading[1] if self._heading is not None else self._text
            target.append(f" {caption} ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
            self.title = _SPACES.sub(" ", "".join(self._title_text)).strip() or None
        if tag in _SKIPPED_TAGS:
            self._skipping = max(self._skipping - 1, 0)
            return
        if self._skipping:
            return
        if tag in _HEADING_TAGS and self._heading is not None:
            level, parts = self._heading
            self._heading = None
            text = _SPACES.sub(" ", "".join(parts)).strip()
            while self._stack and self._stack[-1][0] >= level:
                self._stack.pop()
            self._stack.append((level, text))
            if level == 1 and self.first_h1 is None and text:
                self.first_h1 = text
        elif tag in _BLOCK_TAGS or tag == "pre":
            self._flush()
            self._pre = max(self._pre - (tag == "pre"), 0)

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self._title_text.append(data)
        if self._skipping:
            return
        if self._heading is not None:
            self._heading[1].append(data)
        else:
            self._text.append(data)

    def handle_comment(self, data: str) -> None:
        marker = PAGE_MARKER.match(f"<!--{data}-->")
        if marker:
            self._flush()
            self._page = max(int(marker.group(1)), 1)


def parse_html(text: str) -> ParsedText:
    """The `<title>` is the title, else the first `h1`."""
    collector = _BlockCollector()
    collector.feed(text)
    collector.finish()
    return ParsedText(title=collector.title or collector.first_h1, blocks=collector.blocks)
