"""Why a file did not go in, or what was left out of one that did.

Each reason is a fixed phrase, so the ingest summary can count files per reason; what differs
from file to file (the offset, the picture, the library's message) is the detail.
"""

from __future__ import annotations

from dataclasses import dataclass

# skipped: not a document (found while walking a folder)
UNSUPPORTED = "unsupported format"
NO_TEXT = "no text to index"
BINARY = "binary content, not text"

# failed: a document that could not be read or stored
NO_SUCH_PATH = "no such file or folder"
UNREADABLE = "cannot read"
NOT_TEXT = "not text in any known encoding"
NO_TEXT_LAYER = "PDF has no text layer"
PASSWORD_PROTECTED = "password-protected PDF"
BAD_PDF = "not a readable PDF"
BAD_DOCX = "not a readable DOCX"
BAD_GZIP = "not a readable gzip file"
TOO_LARGE = "too large"
DATABASE_ERROR = "not stored, database error"

# warnings: a picture left out of a document whose text went in
PICTURE_NOT_FOUND = "file not found"
PICTURE_NOT_DECODABLE = "not a picture Pillow can read"
PICTURE_NOT_LOCAL = "remote, never fetched"
PICTURE_UNREADABLE = "cannot read"


@dataclass(frozen=True)
class Problem:
    """One file's problem: `reason` is one of the phrases above, `detail` the specifics."""

    path: str
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


class SourceError(ValueError):
    """A file that should have become a document but cannot: reported as failed."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason + (f" ({detail})" if detail else ""))
        self.reason, self.detail = reason, detail


class NotADocument(SourceError):
    """A file that is not a document of any format read here (an unsupported extension, a binary
    file without one, an empty file): skipped when found in a folder, failed when named."""
