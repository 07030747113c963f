"""HTML into blocks with the standard library's `html.parser`.

`h1`-`h6` give the heading path, block elements (paragraphs, list items, cells, ...) become
blocks, and `<img alt>` becomes a picture whose alt text is its caption. A comment
`<!-- page N -->` starts page N, as in Markdown; otherwise the whole page is page 1.

Site chrome is not content: a page's `nav`, `aside`, and its `header` and `footer` (those of the
page, not of an `article`) repeat on every page of a site, so indexing them makes every page
match the menu's words. The reST and DOCX readers pass their own, smaller set: docutils writes
admonitions and footnotes as `aside`.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from ..parsed import PAGE_MARKER, Block, ParsedText, PictureSource
from .encoding import read_decoded
from .options import ReadOptions

SITE_CHROME = frozenset({"nav", "aside", "header", "footer"})
_ROLES = {"navigation": "nav", "complementary": "aside", "banner": "header", "contentinfo": "footer"}
"""ARIA landmark roles that mark the same chrome on a plain `div`."""
_ARTICLE_PARTS = frozenset({"header", "footer"})
"""Inside an `article` these hold the article's own title or byline, so they stay."""

_BLOCK_TAGS = frozenset(
    "address article aside blockquote body caption dd div dl dt fieldset figcaption figure footer "
    "form header hr li main nav ol p section table tbody td tfoot th thead tr ul".split()
)
_HEADING_TAGS = {f"h{level}": level for level in range(1, 7)}
_HIDDEN_TAGS = frozenset({"script", "style", "noscript", "template", "head", "svg"})
_SPACES = re.compile(r"\s+")


def _spaced(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


class _BlockCollector(HTMLParser):
    def __init__(self, chrome: frozenset[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.chrome = chrome
        self.blocks: list[Block] = []
        self.title: str | None = None
        self.first_h1: str | None = None
        self._stack: list[tuple[int, str]] = []
        self._text: list[str] = []
        self._pictures: list[PictureSource] = []
        self._page = 1
        self._skip: tuple[str, int] | None = None
        """The element being left out and how deeply elements of its name are nested in it."""
        self._articles = 0
        self._in_title = False
        self._title_text: list[str] = []
        self._pre = 0
        self._heading: tuple[int, list[str]] | None = None

    def _headings(self) -> tuple[str, ...]:
        return tuple(text for _, text in self._stack)

    def finish(self) -> None:
        self.close()
        self._flush()

    def _flush(self) -> None:
        raw = "".join(self._text)
        text = raw.strip("\n") if self._pre else _spaced(raw)
        if text or self._pictures:
            self.blocks.append(Block(text, self._headings(), self._page, tuple(self._pictures)))
        self._text, self._pictures = [], []

    def _left_out(self, tag: str, attrs: dict[str, str | None]) -> bool:
        if tag in _HIDDEN_TAGS:
            return True
        kind = _ROLES.get((attrs.get("role") or "").strip().lower(), tag)
        return kind in self.chrome and not (kind in _ARTICLE_PARTS and self._articles)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if self._skip is not None:
            if tag == self._skip[0]:
                self._skip = (tag, self._skip[1] + 1)
            return
        attributes = dict(attrs)
        if self._left_out(tag, attributes):
            self._flush()
            self._skip = (tag, 1)
            return
        self._articles += tag == "article"
        if tag in _HEADING_TAGS:
            self._flush()
            self._heading = (_HEADING_TAGS[tag], [])
        elif tag in _BLOCK_TAGS or tag == "pre":
            self._flush()
            self._pre += tag == "pre"
        elif tag == "br":
            self._text.append("\n")
        elif tag == "img":
            self._image(attributes)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in ("img", "br", "hr"):
            self.handle_endtag(tag)

    def _image(self, attrs: dict[str, str | None]) -> None:
        picture = picture_of(attrs)
        if picture is None:
            return
        self._pictures.append(picture)
        if picture.caption:
            target = self._heading[1] if self._heading is not None else self._text
            target.append(f" {picture.caption} ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
            self.title = _spaced("".join(self._title_text)) or None
        if self._skip is not None:
            if tag == self._skip[0]:
                depth = self._skip[1] - 1
                self._skip = (tag, depth) if depth else None
            return
        self._articles = max(self._articles - (tag == "article"), 0)
        if tag in _HEADING_TAGS and self._heading is not None:
            level, parts = self._heading
            self._heading = None
            text = _spaced("".join(parts))
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
        if self._skip is not None:
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


def picture_of(attrs: dict[str, str | None]) -> PictureSource | None:
    """An `<img>`'s picture: the alt text is its caption, else the title; no `src`, no picture."""
    src = (attrs.get("src") or "").strip()
    if not src:
        return None
    return PictureSource(src=src, caption=_spaced(attrs.get("alt") or attrs.get("title") or ""))


def parse_html(text: str, *, chrome: frozenset[str] = SITE_CHROME) -> ParsedText:
    """The `<title>` is the title, else the first `h1`. Elements named in `chrome` are left out."""
    collector = _BlockCollector(chrome)
    collector.feed(text)
    collector.finish()
    return ParsedText(title=collector.title or collector.first_h1, blocks=collector.blocks)


class _ImageFinder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pictures: list[PictureSource] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img" and (picture := picture_of(dict(attrs))) is not None:
            self.pictures.append(picture)


def pictures_in(fragment: str) -> list[PictureSource]:
    """The `<img>` pictures of an HTML fragment (inline HTML in Markdown)."""
    finder = _ImageFinder()
    finder.feed(fragment)
    finder.close()
    return finder.pictures


def read(data: bytes, options: ReadOptions) -> ParsedText:
    return read_decoded(parse_html, data)
