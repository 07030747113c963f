"""Evidence capabilities, citation policy and evidence compaction for pydantic-ai agents.

Nothing in this package knows about jobs, queues or Redis, so any host (the Celery worker, a
chat app, a notebook) can register the same capabilities. The names below are the stable
surface (docs/design/rules/README.md, "Public surface of capabilities"): what a host registers,
plus what a host reads back from results (the ledger's status and declared refs, the policy's
namespace and redirect count, the tool output's markers).
"""

from .base import EvidenceCapability, EvidenceState
from .budgets import GRACE_REQUESTS
from .capsule import CAPSULE_HEADER
from .compaction import (
    RECEIPT,
    Capsule,
    EvidenceCompactionCapability,
    RetainedPicture,
    build_capsule,
    compact_history,
    create_compactor,
)
from .deps import Deps
from .evidence import DiscoveredEvidence, discover_evidence, question_in_progress
from .formatting import NO_RESULTS, RESULT_SEPARATOR
from .ledger import (
    CapabilityEvidenceRecord,
    CitationDeclaration,
    CitationStatus,
    EvidenceOccurrence,
    EvidenceRef,
    citation_status,
    declared_refs,
)
from .passages import PassageSearchCapability, PassagesState, create_passages
from .policy import POLICY_NAMESPACE, CitationPolicyCapability, CitationPolicyState, create_policy, redirects_delivered
from .reader import DocumentReaderCapability, ReaderState, create_reader
from .store import Chunk, Document, RetrievedChunk
from .tags import TagSigner, has_machine_tag

__all__ = [
    "CAPSULE_HEADER",
    "GRACE_REQUESTS",
    "NO_RESULTS",
    "POLICY_NAMESPACE",
    "RECEIPT",
    "RESULT_SEPARATOR",
    "build_capsule",
    "CapabilityEvidenceRecord",
    "Capsule",
    "Chunk",
    "citation_status",
    "CitationDeclaration",
    "CitationPolicyCapability",
    "CitationPolicyState",
    "CitationStatus",
    "compact_history",
    "create_compactor",
    "create_passages",
    "create_policy",
    "create_reader",
    "declared_refs",
    "Deps",
    "discover_evidence",
    "Document",
    "DiscoveredEvidence",
    "DocumentReaderCapability",
    "EvidenceCapability",
    "EvidenceCompactionCapability",
    "EvidenceOccurrence",
    "EvidenceRef",
    "EvidenceState",
    "has_machine_tag",
    "PassageSearchCapability",
    "PassagesState",
    "question_in_progress",
    "ReaderState",
    "redirects_delivered",
    "RetainedPicture",
    "RetrievedChunk",
    "TagSigner",
]
