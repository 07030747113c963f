"""Evidence capabilities, citation policy and evidence compaction for pydantic-ai agents.

Nothing in this package knows about jobs, queues or Redis, so any host (the Celery worker, a
chat app, a notebook) can register the same capabilities. The names below are the stable
surface of CAPABILITIES.md §2.2.
"""

from .base import EvidenceCapability, EvidenceState
from .compaction import (
    Capsule,
    EvidenceCompactionCapability,
    RetainedPicture,
    build_capsule,
    compact_history,
    create_compactor,
)
from .deps import Deps
from .evidence import DiscoveredEvidence, discover_evidence, question_in_progress
from .ledger import (
    CapabilityEvidenceRecord,
    CitationDeclaration,
    CitationStatus,
    EvidenceOccurrence,
    EvidenceRef,
    citation_status,
)
from .passages import PassageSearchCapability, PassagesState, create_passages
from .policy import CitationPolicyCapability, CitationPolicyState, create_policy
from .reader import DocumentReaderCapability, ReaderState, create_reader
from .tags import TagSigner

__all__ = [
    "CapabilityEvidenceRecord",
    "Capsule",
    "CitationDeclaration",
    "CitationPolicyCapability",
    "CitationPolicyState",
    "CitationStatus",
    "Deps",
    "DiscoveredEvidence",
    "DocumentReaderCapability",
    "EvidenceCapability",
    "EvidenceCompactionCapability",
    "EvidenceOccurrence",
    "EvidenceRef",
    "EvidenceState",
    "PassageSearchCapability",
    "PassagesState",
    "ReaderState",
    "RetainedPicture",
    "TagSigner",
    "build_capsule",
    "citation_status",
    "compact_history",
    "create_compactor",
    "create_passages",
    "create_policy",
    "create_reader",
    "discover_evidence",
    "question_in_progress",
]
