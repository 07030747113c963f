"""Bytes into text in whatever encoding they were written in.

UTF-8 (with or without a BOM) is tried first, since it is both the common case and the one a
strict decode proves; anything else goes to charset-normalizer. The encoding found is recorded
in the document's meta, so a wrong guess can be seen rather than only suspected.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass, replace

from charset_normalizer import from_bytes

from ..parsed import ParsedText
from ..problems import BINARY, NOT_TEXT, SourceError

_UNICODE_BOMS = (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
SNIFF_BYTES = 8192
"""How much of a file decides that NUL bytes make it binary."""


@dataclass(frozen=True)
class DecodedText:
    text: str
    encoding: str
    """Python's canonical codec name (`utf-8`, `cp1252`, `iso8859-1`, ...)."""


def looks_binary(data: bytes) -> bool:
    """NUL bytes near the start and no UTF-16/32 byte-order mark: no text encoding writes those."""
    return b"\x00" in data[:SNIFF_BYTES] and not data.startswith(_UNICODE_BOMS)


def decode_text(data: bytes) -> DecodedText:
    """Raises SourceError (BINARY or NOT_TEXT) when the bytes are no text at all."""
    if looks_binary(data):
        raise SourceError(BINARY, "NUL bytes")
    try:
        return DecodedText(data.decode("utf-8-sig"), "utf-8")
    except UnicodeDecodeError as exc:
        offset = exc.start
    best = from_bytes(data).best()
    if best is None:
        raise SourceError(NOT_TEXT, f"not UTF-8 (invalid byte at offset {offset}), and no other encoding fits")
    text = str(best)
    if "\x00" in text:
        raise SourceError(BINARY, "NUL characters")
    return DecodedText(text, codecs.lookup(best.encoding).name)


def read_decoded(parse: Callable[[str], ParsedText], data: bytes) -> ParsedText:
    """A text format's reader: decode, parse, and record the encoding in the document's meta."""
    decoded = decode_text(data)
    parsed = parse(decoded.text)
    return replace(parsed, meta={**parsed.meta, "encoding": decoded.encoding})
