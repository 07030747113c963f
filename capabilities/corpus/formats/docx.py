"""Word documents (`.docx`) through mammoth into HTML, and from there through the HTML reader.

mammoth maps Word's heading styles to `h1`-`h6` and keeps lists, tables and images; the images
come out of the file itself and are kept as the document's embedded pictures, with their alt
text as caption. A DOCX has no fixed pages (they depend on the printer), so it is page 1.
"""

from __future__ import annotations

import io
from typing import Any

import mammoth

from ..parsed import EmbeddedPicture, ParsedText
from ..problems import BAD_DOCX, SourceError
from .html import parse_html
from .options import ReadOptions
from .rst import GENERATED_CHROME

EMBEDDED_PREFIX = "docx-image:"


def parse_docx(data: bytes) -> ParsedText:
    """Raises SourceError (BAD_DOCX) for a file that is not a Word document mammoth can read."""
    embedded: dict[str, EmbeddedPicture] = {}

    def keep_image(image: Any) -> dict[str, str]:
        with image.open() as stream:
            picture = stream.read()
        src = f"{EMBEDDED_PREFIX}{len(embedded)}"
        embedded[src] = EmbeddedPicture(picture, str(image.content_type or ""))
        return {"src": src}

    try:
        result = mammoth.convert_to_html(io.BytesIO(data), convert_image=mammoth.images.img_element(keep_image))
    except Exception as exc:  # mammoth raises what zipfile, its XML reader or its own checks raise
        raise SourceError(BAD_DOCX, f"{type(exc).__name__}: {exc}") from exc
    parsed = parse_html(str(result.value), chrome=GENERATED_CHROME)
    return ParsedText(title=parsed.title, blocks=parsed.blocks, embedded=embedded)


def read(data: bytes, options: ReadOptions) -> ParsedText:
    return parse_docx(data)
