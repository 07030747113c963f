"""Pictures validated with Pillow and emitted as labelled pairs (E15, T4).

Some serving stacks expect one decodable image per attachment slot, so a picture that does not
decode is dropped whole: neither its label nor its bytes are sent.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

from PIL import Image, UnidentifiedImageError
from pydantic_ai.messages import BinaryContent

from .store import RetrievedChunk
from .tags import TagSigner, picture_label

_MEDIA_TYPES = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "GIF": "image/gif",
    "WEBP": "image/webp",
    "BMP": "image/bmp",
    "TIFF": "image/tiff",
}


def decode_picture(data: bytes | None) -> BinaryContent | None:
    """The image as model content, with its media type taken from the detected format, or None
    when Pillow cannot open and verify it (or the format is not one a vision model accepts)."""
    if not data:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                image.verify()
                fmt = image.format
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None
    media_type = _MEDIA_TYPES.get(fmt or "")
    if media_type is None:
        return None
    return BinaryContent(data=data, media_type=media_type)


def picture_content_for(
    results: Sequence[RetrievedChunk], *, signer: TagSigner, capability: str
) -> list[str | BinaryContent]:
    """E15. The pictures of one result set in result order, once per (document, ref), each as a
    `[label, image]` pair; `k/n` count only the pictures actually emitted."""
    seen: set[tuple[str, str]] = set()
    decoded: list[tuple[RetrievedChunk, str, BinaryContent]] = []
    for result in results:
        for self_ref, data in result.pictures.items():
            key = (result.document_id, self_ref)
            if key in seen:
                continue
            seen.add(key)
            image = decode_picture(data)
            if image is not None:
                decoded.append((result, self_ref, image))
    content: list[str | BinaryContent] = []
    for k, (result, self_ref, image) in enumerate(decoded, start=1):
        label = picture_label(
            signer,
            capability=capability,
            document_id=result.document_id,
            self_ref=self_ref,
            chunk_id=result.chunk_id,
            image=image.data,
            position=(k, len(decoded)),
        )
        content += [label, image]
    return content
