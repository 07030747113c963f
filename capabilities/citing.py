"""How a cite call's chunk ids become citations (E10, E11), as pure functions.

The cite tool in `base` gathers the working set and the store lookups and applies what these
return; everything that decides which id means which chunk lives here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence

from .store import Citation, RetrievedChunk

CHUNK_ID_MATCH_CUTOFF = 0.75
"""E10.3. Random UUIDs resemble each other at about 0.5, while transcription damage (a lost or
repeated character or hyphen group) stays well above 0.75."""

CITE_NONE_ACK = "Noted: no knowledge-base evidence is declared for this answer."


def cite_ack(n: int, skipped: Sequence[str] = ()) -> str:
    """E10.6. The partial form must not invite another call: a model that cannot copy ids would
    otherwise loop until its retries run out (R23)."""
    head = f"Citations recorded: {n}."
    if not skipped:
        return head
    return f"{head} Skipped {len(skipped)} id(s) that match no retrieved chunk: [{', '.join(skipped)}]"


def no_citation_message(chunk_ids: Sequence[str]) -> str:
    """E10.5. Nothing resolved, so nothing is declared and the model is asked to copy exactly."""
    return (
        f"No citation recorded: none of [{', '.join(chunk_ids)}] matches a chunk_id from the tool "
        "results. Copy the ids exactly as shown."
    )


def normalise_chunk_id(raw: str) -> str:
    """E10.2. Models often copy the brackets the result blocks show around ids."""
    return raw.strip().strip("[]").strip()


def results_by_chunk_id(working_set: Mapping[str, Sequence[RetrievedChunk]]) -> dict[str, RetrievedChunk]:
    """E10.3/E11. Every id this question retrieved, each mapped to the result that showed it: a
    result's own id wins over the same id seen only as a constituent of an expanded result."""
    found: dict[str, RetrievedChunk] = {}
    results = [r for entries in working_set.values() for r in entries]
    for result in results:
        found.setdefault(result.chunk_id, result)
    for result in results:
        for constituent in result.chunk_ids:
            found.setdefault(constituent, result)
    return found


def repair_chunk_id(chunk_id: str, known: Iterable[str]) -> str:
    """E10.3. An unknown id becomes its single closest retrieved id when similar enough; a wrong
    repair would need a near-identical id retrieved in the same question (R24)."""
    candidates = list(known)
    if chunk_id in candidates:
        return chunk_id
    best = difflib.get_close_matches(chunk_id, candidates, n=1, cutoff=CHUNK_ID_MATCH_CUTOFF)
    return best[0] if best else chunk_id


def citation_for(result: RetrievedChunk, chunk_id: str) -> Citation:
    """E11. The citation copies what the model saw (the expanded text), under the id it cited."""
    citation = Citation.from_result(result)
    if citation.chunk_id != chunk_id:
        citation = citation.model_copy(update={"chunk_id": chunk_id})
    return citation


def register_citations(
    citation_index: dict[str, Citation], question_citations: list[str], citations: Iterable[Citation]
) -> None:
    """E11. Numbering runs across the conversation: an id new to the index takes the next number,
    and one already there keeps its entry. The per-question list keeps display order."""
    for citation in citations:
        if citation.chunk_id not in citation_index:
            citation_index[citation.chunk_id] = citation.model_copy(update={"index": len(citation_index) + 1})
        if citation.chunk_id not in question_citations:
            question_citations.append(citation.chunk_id)
