"""The capsule: everything earlier answers cited, rendered once (C5, C6, C10).

Pure: it reads discovery views and returns text plus the pictures to re-attach, with no I/O and
no messages, so every grouping and ordering rule is testable without an agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .store import Citation
from .tags import TagSigner, picture_label

if TYPE_CHECKING:
    from .evidence import DiscoveredEvidence

CAPSULE_HEADER = (
    "[Material that earlier answers in this conversation cited, reproduced in full. "
    "To rely on any of it now, cite its chunk_id as shown.]"
)


def group_label(k: int) -> str:
    """C5. Groups state only an order (1 = newest): identities are message positions and would
    read like turn numbers."""
    return f"[Earlier citations, set {k}]"


@dataclass(frozen=True)
class RetainedPicture:
    """C10. A cited figure to re-attach, fetched later through the capability that retrieved it
    (state never holds bytes)."""

    capability: str
    chunk_id: str
    document_id: str
    self_ref: str

    def label(self, signer: TagSigner, image: bytes) -> str:
        """C11. Built only once the bytes are in hand: the signed tag binds the image digest (T2)."""
        return picture_label(
            signer,
            capability=self.capability,
            document_id=self.document_id,
            self_ref=self.self_ref,
            chunk_id=self.chunk_id,
            image=image,
            cited=True,
        )


@dataclass(frozen=True)
class Capsule:
    """C5. `text == ""` and no pictures when nothing earlier was cited."""

    text: str
    pictures: tuple[RetainedPicture, ...] = ()


@dataclass(frozen=True)
class _Entry:
    group: int
    capability: str
    citation: Citation
    vision: bool


def _entries(found: Sequence[DiscoveredEvidence], boundary: int) -> list[_Entry]:
    """C5/C6. Each cited occurrence joins the newest earlier question that cited it; one cited
    without its Citation is an invariant break (E11 writes both together), never skipped."""
    entries: list[_Entry] = []
    for view in found:
        for chunk_id, occurrence in view.record.occurrences.items():
            earlier = [q for q in occurrence.cited_in_questions if q < boundary]
            if not earlier:
                continue
            citation = view.citations.get(chunk_id)
            if citation is None:
                raise ValueError(
                    f"capsule invariant: {view.capability!r} records chunk {chunk_id!r} as cited in "
                    f"question {max(earlier)} but its citation_index has no Citation for it"
                )
            entries.append(_Entry(max(earlier), view.capability, citation, view.vision))
    entries.sort(key=lambda e: (-e.group, e.capability, e.citation.chunk_id))
    return entries


def _source(citation: Citation) -> str:
    """C5. The uri is printed only when it adds something to the title (R38)."""
    title, uri = citation.document_title, citation.document_uri
    if not title:
        return f'Source: "{uri}"'
    if not uri or uri == title:
        return f'Source: "{title}"'
    return f'Source: "{title}" ({uri})'


def _render(entries: Sequence[_Entry]) -> str:
    blocks = [CAPSULE_HEADER]
    current_group: int | None = None
    k = 0
    for entry in entries:
        if entry.group != current_group:
            current_group = entry.group
            k += 1
            blocks.append(group_label(k))
        citation = entry.citation
        blocks.append(f"[{citation.chunk_id}] {_source(citation)}\n{citation.content}")
    return "\n\n".join(blocks)


def _retained(entries: Sequence[_Entry]) -> tuple[RetainedPicture, ...]:
    """C10. Refs are unique only within one owner's document, and two chunks of one page often
    point at the same figure; a non-vision owner's model must never receive images (R36)."""
    seen: set[tuple[str, str, str]] = set()
    pictures: list[RetainedPicture] = []
    for entry in entries:
        if not entry.vision:
            continue
        citation = entry.citation
        for self_ref in citation.picture_refs:
            key = (entry.capability, citation.document_id, self_ref)
            if key in seen:
                continue
            seen.add(key)
            pictures.append(RetainedPicture(entry.capability, citation.chunk_id, citation.document_id, self_ref))
    return tuple(pictures)


def build_capsule(found: Sequence[DiscoveredEvidence], *, boundary: int) -> Capsule:
    """C5. Follow-ups need the material earlier answers rested on, under the same ids, while
    uncited retrieval output is dead weight. The current question's own citations are left out:
    they are live above the boundary, and leaving them out keeps the capsule stable within a
    question (prompt caching). Cited evidence is kept whole: there is no size budget."""
    entries = _entries(found, boundary)
    if not entries:
        return Capsule(text="")
    return Capsule(text=_render(entries), pictures=_retained(entries))
