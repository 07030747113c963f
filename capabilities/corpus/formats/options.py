"""What an ingest may choose about how documents are read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReadOptions:
    page_images: bool = True
    """Render every PDF page and keep it as the page's picture (see formats/pdf.py)."""

    def key(self) -> str:
        """Part of the content hash of a format that reads options: the same file read with
        other options is another version."""
        return f"page_images={int(self.page_images)}"
