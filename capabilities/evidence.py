"""How the optional capabilities see evidence: by discovering the run's evidence capabilities (E17).

Reading the run registry lets the policy and the compactor work with whatever evidence
capabilities a host registered, without being configured with them or holding references to them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_ai import RunContext

from .base import EvidenceCapability
from .ledger import CapabilityEvidenceRecord
from .store import Citation

DISAGREEING_QUESTIONS = "evidence capabilities disagree on the question in progress"


@dataclass(frozen=True)
class DiscoveredEvidence:
    """A read-only view of one evidence capability (E17), rebuilt on every call and never
    persisted; mutating it has no effect on the capability."""

    capability: str
    record: CapabilityEvidenceRecord
    citations: Mapping[str, Citation]
    tool_names: frozenset[str]
    cite_tool: str
    cite_available: bool
    state_carried: bool
    vision: bool


def _run_evidence_capabilities(ctx: RunContext[Any]) -> list[EvidenceCapability]:
    """F13. The registry holds run instances and framework-internal capabilities under synthetic
    keys, so evidence capabilities are selected by type, never by key."""
    found = [c for c in ctx.capabilities.values() if isinstance(c, EvidenceCapability)]
    return sorted(found, key=lambda c: c.namespace)


M = TypeVar("M", bound=BaseModel)


def detached(model: M) -> M:
    """A copy that shares nothing with the original. Records are JSON-shaped
    (docs/design/rules/README.md, "Persisted state"), so a dump and validate round trip is exact,
    and it costs a quarter of `model_copy(deep=True)`: discovery runs on every model request, and
    deep copies were its largest cost (bench/overhead_capabilities.py)."""
    return type(model).model_validate(model.model_dump())


class _CitationsSnapshot(Mapping[str, Citation]):
    """E17. A capability's citation index as it stood at discovery, each citation detached when
    first read. The index only grows and an entry is never changed once registered (E11,
    `register_citations`), so a copy taken on reading equals one taken at discovery; the policy,
    which reads no citation, copies none, and the compactor copies only the ones its capsule shows."""

    def __init__(self, index: Mapping[str, Citation]) -> None:
        self._index = dict(index)
        self._detached: dict[str, Citation] = {}

    def __getitem__(self, chunk_id: str) -> Citation:
        if chunk_id not in self._detached:
            self._detached[chunk_id] = detached(self._index[chunk_id])
        return self._detached[chunk_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def discover_evidence(ctx: RunContext[Any]) -> list[DiscoveredEvidence]:
    """E17. Views of the run's evidence capabilities, sorted by namespace. Writes nothing."""
    return [
        DiscoveredEvidence(
            capability=cap.namespace,
            record=detached(cap.evidence_record()),
            citations=_CitationsSnapshot(cap.citation_index()),
            tool_names=cap.evidence_tool_names(),
            cite_tool=cap.cite_tool_name,
            cite_available=cap.cite_available,
            state_carried=cap.state_carried,
            vision=cap.vision,
        )
        for cap in _run_evidence_capabilities(ctx)
    ]


def question_in_progress(found: Sequence[DiscoveredEvidence]) -> int:
    """L2/E17. The common question, or 0 with no evidence capability. A capability silently
    stuck on another identity would have its declarations judged against the wrong question."""
    questions = {f.capability: f.record.question for f in found}
    distinct = set(questions.values())
    if len(distinct) > 1:
        detail = ", ".join(f"{ns}={q}" for ns, q in sorted(questions.items()))
        raise RuntimeError(f"{DISAGREEING_QUESTIONS}: {detail}")
    question = next(iter(distinct), 0)
    assert question is not None, "for_run establishes every evidence record's question"
    return question


def evidence_owner(ctx: RunContext[Any], namespace: str) -> EvidenceCapability:
    """The run instance that owns a namespace, for what a view cannot do (fetching a cited
    picture through the owner's store connection, E16)."""
    for cap in _run_evidence_capabilities(ctx):
        if cap.namespace == namespace:
            return cap
    raise RuntimeError(f"no evidence capability with namespace {namespace!r} is registered in this run")
