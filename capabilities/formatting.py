"""How retrieved chunks are shown to the model (E6.3, E8) and kept for citing (E6.4).

Both evidence capabilities show results the same way, so a chunk id reads the same wherever the
model saw it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .store import Document, RetrievedChunk

NO_RESULTS = "No results matched this query."
"""E6.3. Never an empty string: an empty return looks like a tool malfunction to the model (R26)."""

NO_DOCUMENTS = "No documents found."
EMPTY_PAGE = "This page has no text."
RESULT_SEPARATOR = "\n\n-----\n\n"


def format_result(result: RetrievedChunk, rank: int, total: int) -> str:
    """E6.3. One result block; the id comes first and in brackets, so it is easy to copy."""
    source = f'"{result.document_title or result.document_uri}"'
    if result.headings:
        source += " > " + " > ".join(result.headings)
    lines = [
        f"[{result.chunk_id}] [rank {rank} of {total}]",
        f"Source: {source}",
        f"Type: {result.labels[0] if result.labels else 'text'}",
    ]
    lines += [f"Figure caption ({ref}): {caption}" for ref, caption in result.picture_captions.items()]
    lines += ["Content:", result.content]
    return "\n".join(lines)


def format_results(results: Sequence[RetrievedChunk], *, empty: str = NO_RESULTS) -> str:
    """E6.3/E8. Blocks joined by a separator line; `empty` when there is nothing to show."""
    if not results:
        return empty
    total = len(results)
    return RESULT_SEPARATOR.join(format_result(r, i, total) for i, r in enumerate(results, start=1))


def format_documents(documents: Sequence[Document]) -> str:
    """E7. One line per document; listings carry no chunk ids, so they are never cited."""
    if not documents:
        return NO_DOCUMENTS
    return "\n".join(f'[{d.id}] "{d.title or d.uri}" ({d.uri}), pages {d.page_count}' for d in documents)


def merge_results(existing: Sequence[RetrievedChunk], new: Sequence[RetrievedChunk]) -> list[RetrievedChunk]:
    """E6.4. Existing entries stay: the model may still cite anything an earlier, wider call of the
    same key showed it (R25). Picture bytes are dropped, since state never holds them
    (docs/design/rules/README.md, "Persisted state")."""
    merged = list(existing)
    seen = {r.chunk_id for r in merged}
    for result in new:
        if result.chunk_id not in seen:
            seen.add(result.chunk_id)
            merged.append(result.model_copy(update={"pictures": {}}))
    return merged
