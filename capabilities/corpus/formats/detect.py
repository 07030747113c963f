"""Which reader a file gets: by its extension, or by its content when it has none.

Extensionless files are the commonest documentation on a Unix system (README, NEWS, AUTHORS,
COPYING), and so are conventional names with a distribution's suffix (`README.Debian`,
`changelog.Debian.gz`): both are recognised by content, which makes them PDF (`%PDF-`), HTML
(a doctype or `<html>`), or plain text; binary content and scripts (`#!`) are no documents.
`NAME.gz` is NAME compressed, read as NAME's format says.
"""

from __future__ import annotations

import gzip
import io
import zlib
from dataclasses import dataclass
from pathlib import PurePath

from ..problems import BAD_GZIP, BINARY, TOO_LARGE, UNSUPPORTED, NotADocument, SourceError
from . import BY_SUFFIX, FORMATS, Format
from .encoding import looks_binary

CONVENTIONAL_NAMES = frozenset(
    "readme news authors changelog changes copying license licence install thanks todo hacking bugs faq "
    "contributing contributors notice copyright maintainers history credits".split()
)
"""Names whose extension, if any, is a suffix (`README.Debian`, `ChangeLog.old`), not a format."""
GZIP_SUFFIX = ".gz"
MAX_SOURCE_BYTES = 256 * 1024 * 1024
"""A `.gz` that decompresses to more than this is refused rather than read into memory."""
_HTML_STARTS = (b"<!doctype html", b"<html")


@dataclass(frozen=True)
class Source:
    """A file's bytes as its reader gets them (decompressed), and what they are."""

    format: Format
    data: bytes
    compressed: bool


def supported() -> str:
    suffixes = ", ".join(sorted(BY_SUFFIX))
    return f"{suffixes}, each also as {GZIP_SUFFIX}, and text files without an extension"


def by_name(name: str) -> Format | None:
    """The format a name promises, or None when only the content can tell (see the module)."""
    path = PurePath(name)
    suffix = path.suffix.lower()
    if suffix in BY_SUFFIX:
        return BY_SUFFIX[suffix]
    if not suffix or name.split(".", 1)[0].lower() in CONVENTIONAL_NAMES:
        return None
    raise NotADocument(UNSUPPORTED, f"{suffix!r}; supported: {supported()}")


def by_content(data: bytes) -> Format:
    if data.startswith(b"%PDF-"):
        return FORMATS["pdf"]
    head = data[:1024].lstrip().lower()
    if head.startswith(_HTML_STARTS):
        return FORMATS["html"]
    if looks_binary(data):
        raise NotADocument(BINARY, "no extension, and not text")
    if data.startswith(b"#!"):
        raise NotADocument(UNSUPPORTED, "a script (#!), not a document")
    return FORMATS["text"]


def _gunzip(raw: bytes) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
            data = stream.read(MAX_SOURCE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise SourceError(BAD_GZIP, str(exc)) from exc
    if len(data) > MAX_SOURCE_BYTES:
        raise SourceError(TOO_LARGE, f"decompresses to more than {MAX_SOURCE_BYTES // 2**20} MiB")
    return data


def detect(name: str, raw: bytes) -> Source:
    """Raises NotADocument for what no reader reads, SourceError for a broken `.gz`. The name
    is checked before a `.gz` is decompressed, so `x.tar.gz` costs nothing."""
    compressed = name.lower().endswith(GZIP_SUFFIX) and len(name) > len(GZIP_SUFFIX)
    inner = name[: -len(GZIP_SUFFIX)] if compressed else name
    promised = by_name(inner)
    data = _gunzip(raw) if compressed else raw
    return Source(promised or by_content(data), data, compressed)
