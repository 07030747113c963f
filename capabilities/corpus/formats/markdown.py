"""Markdown into blocks, by walking markdown-it-py's CommonMark tokens.

Headings (ATX `#` and setext `Title\\n=====`) give each block its heading path; the first
level-1 heading is the title (else a front-matter `title:`). Text is what a reader sees: a
link's text, never its URL; an image's alt text, with the image kept as a picture (inline,
reference-style or `<img>`). Fenced code stays one block, page markers included: only a
`<!-- page N -->` outside code starts a page. A list or a table is one block, a paragraph
another, so the chunker packs them without cutting one in two.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from markdown_it import MarkdownIt
from markdown_it.token import Token

from ..parsed import PAGE_MARKER, Block, ParsedText, PictureSource
from .encoding import read_decoded
from .html import parse_html, pictures_in
from .options import ReadOptions

_MARKDOWN = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(?P<body>.*?\n)(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)
_FRONT_TITLE = re.compile(r"^title:[ \t]*(?P<title>.+?)[ \t]*$", re.MULTILINE)
_LINE_BREAK_TAG = re.compile(r"<br\s*/?>", re.IGNORECASE)


def inline_text(children: Sequence[Token] | None) -> tuple[str, list[PictureSource]]:
    """The text a reader sees, and the pictures met on the way."""
    parts: list[str] = []
    pictures: list[PictureSource] = []
    for child in children or ():
        kind = child.type
        if kind in ("text", "code_inline"):
            parts.append(child.content)
        elif kind == "softbreak":
            parts.append(" ")
        elif kind == "hardbreak":
            parts.append("\n")
        elif kind == "image":
            alt, _ = inline_text(child.children)
            caption = (alt or str(child.attrs.get("title") or "")).strip()
            src = str(child.attrs.get("src") or "").strip()
            if src:
                pictures.append(PictureSource(src=src, caption=caption))
            parts.append(caption)
        elif kind == "html_inline":
            found = pictures_in(child.content)
            pictures.extend(found)
            parts.extend(f" {p.caption} " for p in found if p.caption)
            if _LINE_BREAK_TAG.fullmatch(child.content.strip()):
                parts.append("\n")
    return "".join(parts), pictures


class _Walker:
    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.title: str | None = None
        self.html_title: str | None = None
        self._stack: list[tuple[int, str]] = []
        self._page = 1
        self._lines: list[str] = []
        self._pictures: list[PictureSource] = []
        self._lists: list[list[str]] = []
        """For each open list, the marker of its current item (`-`, `3.`), innermost last."""
        self._item_started = False
        self._row: list[str] | None = None
        self._in_table = False

    def headings(self) -> tuple[str, ...]:
        return tuple(text for _, text in self._stack)

    def flush(self) -> None:
        text = "\n".join(self._lines).strip("\n")
        if text.strip() or self._pictures:
            self.blocks.append(Block(text, self.headings(), self._page, tuple(self._pictures)))
        self._lines, self._pictures = [], []

    def _grouping(self) -> bool:
        """Inside a list or a table, content joins the one block the whole list or table makes."""
        return bool(self._lists) or self._in_table

    def _add(self, text: str, pictures: list[PictureSource]) -> None:
        if self._lists:
            indent = "  " * (len(self._lists) - 1)
            marker = self._lists[-1][0] if not self._item_started else " " * len(self._lists[-1][0])
            self._item_started = True
            lines = text.split("\n")
            text = "\n".join([f"{indent}{marker} {lines[0]}", *(f"{indent}{' ' * len(marker)} {x}" for x in lines[1:])])
        self._lines.append(text)
        self._pictures.extend(pictures)
        if not self._grouping():
            self.flush()

    def walk(self, tokens: Sequence[Token]) -> None:
        index = 0
        while index < len(tokens):
            token = tokens[index]
            kind = token.type
            if kind == "heading_open":
                self.flush()
                text, _ = inline_text(tokens[index + 1].children)
                self._heading(int(token.tag[1]), text.strip())
                index += 3
                continue
            if kind == "inline":
                text, pictures = inline_text(token.children)
                if self._row is not None:
                    self._row.append(text.strip())
                    self._pictures.extend(pictures)
                elif text.strip() or pictures:
                    self._add(text, pictures)
            elif kind in ("fence", "code_block"):
                fence = f"{token.markup}{token.info}\n{token.content}{token.markup}" if kind == "fence" else token.content
                self._add(fence.rstrip("\n"), [])
            elif kind == "html_block":
                self._html(token.content)
            elif kind in ("bullet_list_open", "ordered_list_open"):
                if not self._grouping():
                    self.flush()
                self._lists.append([""])
            elif kind == "list_item_open":
                self._lists[-1] = [f"{token.info}{token.markup}" if token.info else token.markup or "-"]
                self._item_started = False
            elif kind in ("bullet_list_close", "ordered_list_close"):
                self._lists.pop()
                self._item_started = True
                if not self._grouping():
                    self.flush()
            elif kind == "table_open":
                self.flush()
                self._in_table = True
            elif kind == "tr_open":
                self._row = []
            elif kind == "tr_close" and self._row is not None:
                self._lines.append(" | ".join(self._row))
                self._row = None
            elif kind == "table_close":
                self._in_table = False
                self.flush()
            elif kind == "hr" and not self._grouping():
                self.flush()
            index += 1
        self.flush()

    def _heading(self, level: int, text: str) -> None:
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        self._stack.append((level, text))
        if level == 1 and self.title is None and text:
            self.title = text

    def _html(self, html: str) -> None:
        marker = PAGE_MARKER.match(html.strip())
        if marker:
            self.flush()
            self._page = max(int(marker.group(1)), 1)
            return
        parsed = parse_html(html)
        self.html_title = self.html_title or parsed.title
        for block in parsed.blocks:
            self._add(block.text, list(block.pictures))


def parse_markdown(text: str) -> ParsedText:
    """The title is the first level-1 heading, else front matter's `title:`, else an HTML `h1`."""
    front_title = None
    front = _FRONT_MATTER.match(text)
    if front:
        found = _FRONT_TITLE.search(front.group("body"))
        front_title = found.group("title").strip("'\"") if found else None
        text = text[front.end():]
    walker = _Walker()
    walker.walk(_MARKDOWN.parse(text))
    return ParsedText(title=walker.title or front_title or walker.html_title, blocks=walker.blocks)


def read(data: bytes, options: ReadOptions) -> ParsedText:
    return read_decoded(parse_markdown, data)
