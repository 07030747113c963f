"""The formats ingest reads, one reader module each, and how a file's format is found.

Every reader module has `read(data, options) -> ParsedText`: pure, the file's bytes in, blocks
out, or a `SourceError` naming why not. Text formats decode first, in whatever encoding they
use (`encoding.py`). `detect.py` picks the format from the file name, or from the content when
the name has no extension. A reader module is imported the first time a file of its format is
read, so serving a corpus never loads pdfium, docutils or mammoth.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

from ..parsed import ParsedText
from .options import ReadOptions


@dataclass(frozen=True)
class Format:
    name: str
    suffixes: tuple[str, ...]
    module: str
    """The reader module under `formats/`."""
    reads_options: bool = False
    """What is stored depends on `ReadOptions`, so they are part of the content hash."""

    def read(self, data: bytes, options: ReadOptions) -> ParsedText:
        parsed: ParsedText = import_module(f"{__name__}.{self.module}").read(data, options)
        return parsed


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("markdown", (".md", ".markdown", ".mdown", ".mkd"), "markdown"),
        Format("text", (".txt", ".text"), "text"),
        Format("html", (".html", ".htm", ".xhtml"), "html"),
        Format("rst", (".rst", ".rest"), "rst"),
        Format("pdf", (".pdf",), "pdf", reads_options=True),
        Format("docx", (".docx",), "docx"),
    )
}
BY_SUFFIX = {suffix: f for f in FORMATS.values() for suffix in f.suffixes}

__all__ = ["BY_SUFFIX", "FORMATS", "Format", "ReadOptions"]
