"""Which capabilities a job config may register, with what options, over which corpora (H1-H3).

A job config comes from whoever holds an API token, so it may name only the capability types and
options listed here, and a corpus only by a name this worker serves: never a path, never `..`.
Both the producers (at submission) and the worker (at build time) read configs through this module.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_ai.agent.spec import CapabilitySpec

from .problems import problem

PASSAGES = "PassageSearchCapability"
READER = "DocumentReaderCapability"
POLICY = "CitationPolicyCapability"
COMPACTOR = "EvidenceCompactionCapability"

_CORPUS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
CORPUS_SUFFIX = ".sqlite"
ANY = "*"  # GROUNDED_TENANT_CORPORA: as a tenant, every tenant not listed; as a corpus, every corpus served


class CompositionError(ValueError):
    """A config that names a capability, option or corpus this worker does not allow."""


def check_corpus_name(name: str) -> str:
    """A corpus is a name, never a path: a job must not choose which files a worker opens."""
    if not isinstance(name, str) or not _CORPUS_NAME.match(name):
        raise CompositionError(
            f"corpus {name!r} is not a corpus name: use letters, digits, '-' and '_' "
            "(a job names a corpus the worker serves; paths and '..' are never accepted)"
        )
    return name


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    corpus: str
    vision: bool = False  # attach pictures to results; match it to the model's vision support
    request_limit: int | None = Field(default=None, ge=1)  # None: derived from run.request_limit

    @field_validator("corpus")
    @classmethod
    def _corpus(cls, value: str) -> str:
        return check_corpus_name(value)

    def capability_options(self) -> dict[str, Any]:
        """What the capability's factory takes as is; the corpus and the request limit are resolved
        by the worker (a corpus name into the worker's own file, the limit from the run's)."""
        return self.model_dump(exclude={"corpus", "request_limit"})


class PassagesOptions(_Options):
    max_searches: int = Field(default=5, ge=0, le=50)
    search_limit: int = Field(default=5, ge=1, le=50)


class ReaderOptions(_Options):
    max_listings: int = Field(default=3, ge=0, le=50)
    max_reads: int = Field(default=8, ge=0, le=100)


EVIDENCE_OPTIONS: dict[str, type[PassagesOptions] | type[ReaderOptions]] = {PASSAGES: PassagesOptions, READER: ReaderOptions}
ALLOWED = (PASSAGES, READER, POLICY, COMPACTOR)


@dataclass(frozen=True)
class EvidenceEntry:
    name: str
    options: PassagesOptions | ReaderOptions


@dataclass(frozen=True)
class Composition:
    """What a config lists. Registering is the only switch (P1, C1), so this is all a run needs to know."""

    evidence: tuple[EvidenceEntry, ...]
    policy_listed: bool
    compactor_listed: bool

    @property
    def corpora(self) -> frozenset[str]:
        return frozenset(entry.options.corpus for entry in self.evidence)


def _entry(raw: Any) -> CapabilitySpec:
    try:
        return CapabilitySpec.model_validate(raw)
    except ValidationError as exc:
        raise CompositionError(
            f"capability entry {raw!r} is not 'Name', {{Name: {{options}}}} or {{Name: corpus}}: "
            f"{problem(exc.errors()[0])}"
        ) from None


def read_composition(capabilities: Any) -> Composition:
    """The allowlisted reading of an agent spec's `capabilities` list."""
    if capabilities is None:
        capabilities = []
    if not isinstance(capabilities, list):
        raise CompositionError(f"agent.capabilities must be a list, got {type(capabilities).__name__}")
    evidence: list[EvidenceEntry] = []
    seen: set[str] = set()
    for raw in capabilities:
        spec = _entry(raw)
        if spec.name not in ALLOWED:
            raise CompositionError(f"capability {spec.name!r} is not allowed here; allowed: {', '.join(ALLOWED)}")
        if spec.name in seen:
            raise CompositionError(f"capability {spec.name!r} is listed twice; a job registers each type once")
        seen.add(spec.name)
        if spec.name in EVIDENCE_OPTIONS:
            kwargs = {"corpus": spec.args[0]} if spec.args else spec.kwargs
            try:
                options = EVIDENCE_OPTIONS[spec.name].model_validate(kwargs)
            except ValidationError as exc:
                problems = "; ".join(problem(err, whole="options") for err in exc.errors())
                raise CompositionError(f"{spec.name}: {problems}") from None
            except CompositionError as exc:
                raise CompositionError(f"{spec.name}: {exc}") from None
            evidence.append(EvidenceEntry(spec.name, options))
        elif spec.arguments:
            raise CompositionError(f"capability {spec.name!r} takes no options, got {spec.arguments!r}")
    return Composition(tuple(evidence), policy_listed=POLICY in seen, compactor_listed=COMPACTOR in seen)


def known_corpora(corpora_dir: Path) -> list[str]:
    if not corpora_dir.is_dir():
        return []
    return sorted(p.name[: -len(CORPUS_SUFFIX)] for p in corpora_dir.glob(f"*{CORPUS_SUFFIX}") if p.is_file())


def corpora_for(tenant: str, scopes: Mapping[str, Collection[str]], served: Collection[str] | None) -> list[str] | None:
    """H13. The corpus names `tenant` may name: the served corpora its scope lists (every corpus when
    the operator scoped none). None when nothing can be said here: no scopes, and no view of what is
    served (an API on another machine), which leaves the check to the workers."""
    if not scopes:
        return None if served is None else sorted(served)
    allowed = set(scopes.get(tenant, scopes.get(ANY, ())))
    if ANY in allowed:
        return None if served is None else sorted(served)
    return sorted(allowed if served is None else allowed & set(served))


def check_corpora(composition: Composition, available: Collection[str]) -> None:
    """H13. A corpus outside `available` is refused with the names that are: for a scoped tenant
    those are only its own, and a corpus it may not use reads as one not served at all, so a tenant
    learns nothing of another's corpora."""
    for name in sorted(composition.corpora - set(available)):
        raise not_served(name, available)


def not_served(name: str, known: Collection[str]) -> CompositionError:
    """The one wording of an unknown corpus, whoever asks (a job, a search): the names given in
    `known` are all the caller learns, so for a scoped tenant they are only its own (H13)."""
    listing = ", ".join(sorted(known)) or "none"
    return CompositionError(f"corpus {name!r} is not served here; known: {listing}")


def corpus_path(corpora_dir: Path, name: str) -> Path:
    """The worker's file for a corpus name; unknown names are refused with the names that exist."""
    check_corpus_name(name)
    path = corpora_dir / f"{name}{CORPUS_SUFFIX}"
    if not path.is_file():
        raise not_served(name, known_corpora(corpora_dir))
    return path
