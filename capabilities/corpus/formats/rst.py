"""reStructuredText through docutils into HTML, and from there through the HTML reader.

docutils is the reference parser, so section titles (whatever their underline), lists, tables
and images come out as its HTML5 writer says. Nothing in a source may reach outside it:
`include`, `raw` and file insertion are off, and parse messages are not printed (a document with
markup errors still yields the text docutils could read).
"""

from __future__ import annotations

import io
from typing import Any

from docutils.core import publish_parts

from ..parsed import ParsedText
from .encoding import read_decoded
from .html import parse_html
from .options import ReadOptions

GENERATED_CHROME = frozenset({"nav"})
"""docutils writes a `contents` directive as a `nav`; its `aside`s are notes and footnotes."""


def _settings() -> dict[str, Any]:
    return {
        "file_insertion_enabled": False,
        "raw_enabled": False,
        "report_level": 5,
        "halt_level": 5,
        "warning_stream": io.StringIO(),
        "input_encoding": "unicode",
        "syntax_highlight": "none",
    }


def parse_rst(text: str) -> ParsedText:
    """The document title docutils found is the title, else the first section's."""
    parts = publish_parts(text, writer="html5", settings_overrides=_settings())
    parsed = parse_html(str(parts["html_body"]), chrome=GENERATED_CHROME)
    title = str(parts.get("title") or "").strip() or parsed.title
    return ParsedText(title=title or None, blocks=parsed.blocks)


def read(data: bytes, options: ReadOptions) -> ParsedText:
    return read_decoded(parse_rst, data)
