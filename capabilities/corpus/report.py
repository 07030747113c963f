"""What one ingest did, file by file, and the one-line summary a person reads first.

D2. Every file found ends in exactly one list: added, replaced, unchanged, skipped (not a
document: an unsupported format met while walking a folder, a file with no text) or failed (a
document that could not be read or stored, or any file named on the command line that is not
one). `outcome` is "complete" when nothing failed, "partial" when some failed, and "nothing"
when no document went in or was already there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .problems import Problem

if TYPE_CHECKING:
    from .embedded_ingest import EmbeddingSummary

Outcome = Literal["complete", "partial", "nothing"]


def counted(problems: Sequence[Problem]) -> str:
    """`3 unsupported format, 1 no text to index`: most frequent reason first."""
    counts = Counter(problem.reason for problem in problems)
    return ", ".join(f"{n:,} {reason}" for reason, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


@dataclass
class IngestReport:
    """Paths as found (given, or found under a given folder). `warnings` are what was left out of
    documents that went in (pictures), given once: when the version they belong to is stored."""

    corpus: str = ""
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: list[Problem] = field(default_factory=list)
    failed: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    journal_mode: str = "delete"
    """How ingest left the file: "delete" unless a reader had it open when ingest finished (D5)."""
    corpus_removed: bool = False
    """True when ingest created the file, stored nothing in it, and removed it again."""
    embedding: EmbeddingSummary | None = None
    """Set when the corpus has vectors (embedded_ingest.py)."""

    @property
    def documents(self) -> int:
        """Files whose document is now in the corpus, as this run read them."""
        return len(self.added) + len(self.replaced) + len(self.unchanged)

    @property
    def outcome(self) -> Outcome:
        if not self.documents:
            return "nothing"
        return "partial" if self.failed else "complete"

    def summary(self) -> str:
        parts = [f"{len(self.added):,} added", f"{len(self.replaced):,} replaced", f"{len(self.unchanged):,} unchanged"]
        if self.pruned:
            parts.append(f"{len(self.pruned):,} pruned")
        if self.skipped:
            parts.append(f"{len(self.skipped):,} skipped ({counted(self.skipped)})")
        if self.failed:
            parts.append(f"{len(self.failed):,} failed ({counted(self.failed)})")
        line = f"{self.corpus}: " + ", ".join(parts)
        if self.warnings:
            noun = "picture" if len(self.warnings) == 1 else "pictures"
            line += f"; {len(self.warnings):,} {noun} left out ({counted(self.warnings)})"
        return line

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": self.outcome, "summary": self.summary()}
