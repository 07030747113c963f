"""The evidence ledger: question identity, epochs, declarations and citation status (Part L).

Everything here is pure: records are plain pydantic models that survive a JSON round trip, and
`citation_status` is derived, never stored. Identities and epochs are both message counts in the
stored history, so they compare with each other and only ever grow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, Field

CitationStatus = Literal["missing", "grounded", "ungrounded"]

APPEND_ONLY = "append-only"
ALREADY_ANSWERED = "already answered"
NO_IDENTITY = "question identity"


class EvidenceRef(BaseModel):
    """One cited chunk, qualified by the capability that retrieved it (L11)."""

    capability: str
    chunk_id: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.capability, self.chunk_id)


class EvidenceOccurrence(BaseModel):
    """Which questions retrieved and cited one chunk: what a transcript alone cannot rebuild."""

    capability: str
    chunk_id: str
    retrieved_in_questions: list[int] = Field(default_factory=list)
    cited_in_questions: list[int] = Field(default_factory=list)


class CitationDeclaration(BaseModel):
    """A successful cite call; empty `refs` is an explicit "nothing supports this"."""

    question: int
    epoch: int
    refs: list[EvidenceRef] = Field(default_factory=list)


class CapabilityEvidenceRecord(BaseModel):
    """One evidence capability's ledger. Written only by its owner, in its own namespace (L11)."""

    occurrences: dict[str, EvidenceOccurrence] = Field(default_factory=dict)
    question: int | None = None
    in_progress: bool = False
    latest_evidence_epoch: int = 0
    declaration: CitationDeclaration | None = None

    def begin_question(self, identity: int) -> None:
        """L5. Identities only grow: capsule grouping and order come from them, so an equal or
        smaller one would fold two questions together. Epochs and the declaration belong to one
        question, so they are cleared; a kept declaration would ground the next question."""
        if self.question is not None and identity <= self.question:
            raise ValueError(
                f"question {identity} is {ALREADY_ANSWERED}: the record is at question {self.question}, "
                "and identities must increase"
            )
        self.question = identity
        self.in_progress = True
        self.latest_evidence_epoch = 0
        self.declaration = None

    def end_question(self) -> None:
        """L6. Only a run that finished (not one that paused) ends its question."""
        self.in_progress = False

    def _horizon(self) -> int:
        declared = self.declaration.epoch if self.declaration is not None else 0
        return max(self.question or 0, self.latest_evidence_epoch, declared)

    def _check_append_only(self, epoch: int) -> None:
        """L7. Epochs are positions in a history that only grows; a backwards one would make
        every later declaration look stale, or overwrite a newer grounding with an older one."""
        floor = self._horizon()
        if epoch < floor:
            raise ValueError(f"epoch {epoch} is below {floor}: the evidence record is {APPEND_ONLY}")

    def note_evidence(self, epoch: int) -> None:
        """L8. Called for every evidence outcome of this question (E4)."""
        self._check_append_only(epoch)
        self.latest_evidence_epoch = epoch

    def declare(self, refs: Sequence[EvidenceRef], *, epoch: int, retrieved_now: Iterable[str] = ()) -> None:
        """L9. Repeated cite calls with no evidence in between accumulate, so an empty follow-up
        cannot erase a grounding; new evidence resets the declaration, because the next citation
        may reflect what the model has just read."""
        if self.question is None:
            raise ValueError(f"cannot declare without a {NO_IDENTITY}: no run has established the question")
        self._check_append_only(epoch)
        q = self.question
        current = self.declaration
        if current is not None and current.question == q and self.latest_evidence_epoch <= current.epoch:
            seen = {ref.key for ref in current.refs}
            merged = list(current.refs)
            for ref in refs:
                if ref.key not in seen:
                    seen.add(ref.key)
                    merged.append(ref)
            self.declaration = CitationDeclaration(question=q, epoch=max(current.epoch, epoch), refs=merged)
        else:
            self.declaration = CitationDeclaration(question=q, epoch=epoch, refs=_dedupe(refs))
        retrieved = set(retrieved_now)
        for ref in refs:
            occurrence = self.occurrences.setdefault(
                ref.chunk_id, EvidenceOccurrence(capability=ref.capability, chunk_id=ref.chunk_id)
            )
            if q not in occurrence.cited_in_questions:
                occurrence.cited_in_questions.append(q)
            if ref.chunk_id in retrieved and q not in occurrence.retrieved_in_questions:
                occurrence.retrieved_in_questions.append(q)


def _dedupe(refs: Iterable[EvidenceRef]) -> list[EvidenceRef]:
    seen: set[tuple[str, str]] = set()
    out: list[EvidenceRef] = []
    for ref in refs:
        if ref.key not in seen:
            seen.add(ref.key)
            out.append(ref)
    return out


def current_declarations(
    records: Sequence[CapabilityEvidenceRecord], *, question: int
) -> list[CitationDeclaration]:
    """L10's current declarations: for this question, and newer than every record's newest
    evidence outcome. The model can cite only what it has seen, and evidence gathered after
    citing, by any capability, may change what the answer rests on."""
    horizon = max((r.latest_evidence_epoch for r in records), default=0)
    return [
        r.declaration
        for r in records
        if r.declaration is not None and r.declaration.question == question and r.declaration.epoch > horizon
    ]


def citation_status(records: Sequence[CapabilityEvidenceRecord], *, question: int) -> CitationStatus:
    """L10. Derived from the records, never stored."""
    current = current_declarations(records, question=question)
    if not current:
        return "missing"
    if any(d.refs for d in current):
        return "grounded"
    return "ungrounded"


def declared_refs(records: Sequence[CapabilityEvidenceRecord], *, question: int) -> list[EvidenceRef]:
    """The union of the current declarations' refs, in record order (H10 `declared_refs`)."""
    return _dedupe(ref for d in current_declarations(records, question=question) for ref in d.refs)
