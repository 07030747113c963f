"""JobConfig -> pydantic-ai Agent, through `Agent.from_spec` with allowlisted capability types.

The spec registry also holds pydantic-ai's built-in capabilities (MCP, web fetch, local workspace,
...), so the config is read through `composition` first and anything not allowlisted is refused
before `from_spec` sees it. Our capabilities take a store and a signer, which a spec cannot carry;
the registry entries below build them from the worker's own corpora and keys instead.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability

from capabilities import (
    GRACE_REQUESTS,
    Deps,
    TagSigner,
    create_compactor,
    create_passages,
    create_policy,
    create_reader,
)
from capabilities.corpus import VectorIndexCache
from worker.jobs.composition import (
    COMPACTOR,
    EVIDENCE_OPTIONS,
    PASSAGES,
    POLICY,
    READER,
    Composition,
    CompositionError,
    check_corpora,
    corpora_for,
    corpus_path,
    known_corpora,
)
from worker.jobs.models import JobConfig, JobKind

from .corpora import CorpusPool
from .embedders import EmbedderCache


def evidence_request_limit(run_request_limit: int) -> int:
    """E12. An evidence capability stops offering its tools early enough that the grace requests for
    citing, the answer and one redirect still fit under the run's usage limit; otherwise the limit
    would abort the run before the model could record what it found."""
    return max(1, run_request_limit - GRACE_REQUESTS - 2)


@dataclass
class _Builder:
    """What spec entries need but a spec cannot say: the worker's signer, corpora and run limits."""

    signer: TagSigner
    corpora_dir: Path
    run_request_limit: int
    corpora: CorpusPool
    built: list[AbstractCapability[Any]] = field(default_factory=list)

    def build(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> AbstractCapability[Any]:
        capability = self._build(name, args, kwargs)
        self.built.append(capability)
        return capability

    def _build(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> AbstractCapability[Any]:
        if name == POLICY:
            return create_policy(self.signer)
        if name == COMPACTOR:
            return create_compactor(self.signer)
        options = EVIDENCE_OPTIONS[name].model_validate({"corpus": args[0]} if args else kwargs)
        # E3: a read-only connection for each run, leased from the process's pool (corpora.py). A
        # hybrid corpus's query embedder comes from the name it records and this worker's settings
        # (embedders.py), never from the job; its loaded graph is shared by the process's runs.
        store = partial(self.corpora.lease, corpus_path(self.corpora_dir, options.corpus))
        request_limit = options.request_limit or evidence_request_limit(self.run_request_limit)

        factory: Callable[..., AbstractCapability[Any]] = create_passages if name == PASSAGES else create_reader
        return factory(store, self.signer, request_limit=request_limit, **options.capability_options())


_builder: ContextVar[_Builder | None] = ContextVar("grounded_capability_builder", default=None)


@dataclass
class _SpecEntry(AbstractCapability[Any]):
    """A registry entry standing for one allowlisted capability; `from_spec` builds the real one."""

    spec_name: ClassVar[str]

    @classmethod
    def get_serialization_name(cls) -> str:
        return cls.spec_name

    @classmethod
    def from_spec(cls, *args: Any, **kwargs: Any) -> AbstractCapability[Any]:
        builder = _builder.get()
        assert builder is not None, "spec entries are built only inside build_agent"
        return builder.build(cls.spec_name, args, kwargs)


@dataclass
class _Passages(_SpecEntry):
    spec_name: ClassVar[str] = PASSAGES


@dataclass
class _Reader(_SpecEntry):
    spec_name: ClassVar[str] = READER


@dataclass
class _Policy(_SpecEntry):
    spec_name: ClassVar[str] = POLICY


@dataclass
class _Compactor(_SpecEntry):
    spec_name: ClassVar[str] = COMPACTOR


CAPABILITY_TYPES: tuple[type[_SpecEntry], ...] = (_Passages, _Reader, _Policy, _Compactor)


@dataclass(frozen=True)
class BuiltAgent:
    """An agent and what it registered, which the result records (H1, H2)."""

    agent: Agent[Deps, Any]
    composition: Composition
    namespaces: tuple[str, ...]  # evidence namespaces, in registration order
    policy_registered: bool
    compactor_registered: bool


def registers_compactor(composition: Composition, kind: JobKind) -> bool:
    """H1. A one-shot question has nothing earlier to compact, so a question job never registers
    the compactor, even when its config lists it."""
    return composition.compactor_listed and kind != "question"


def build_agent(
    config: JobConfig,
    kind: JobKind,
    *,
    signer: TagSigner,
    corpora_dir: Path,
    embedders: EmbedderCache | None = None,
    graphs: VectorIndexCache | None = None,
    corpora: CorpusPool | None = None,
) -> BuiltAgent:
    """Raises CompositionError for a config this worker will not run (a permanent job error)."""
    composition = config.composition
    for entry in composition.evidence:
        corpus_path(corpora_dir, entry.options.corpus)
    spec = {key: value for key, value in config.agent.items() if key != "model"}
    entries: Sequence[Any] = spec.get("capabilities") or []
    if not registers_compactor(composition, kind):
        entries = [e for e in entries if COMPACTOR not in ((e,) if isinstance(e, str) else tuple(e))]
    spec["capabilities"] = list(entries)
    if corpora is None:
        corpora = CorpusPool(embedders or EmbedderCache(), graphs or VectorIndexCache())
    builder = _Builder(signer=signer, corpora_dir=corpora_dir, run_request_limit=config.run.request_limit,
                       corpora=corpora)
    token = _builder.set(builder)
    try:
        agent = Agent.from_spec(
            spec, deps_type=Deps, custom_capability_types=CAPABILITY_TYPES, defer_model_check=True
        )
    except CompositionError:
        raise
    except ValueError as exc:
        raise CompositionError(str(exc)) from exc
    finally:
        _builder.reset(token)
    return BuiltAgent(
        agent=agent,
        composition=composition,
        namespaces=tuple(c.namespace for c in builder.built if hasattr(c, "namespace")),
        policy_registered=composition.policy_listed,
        compactor_registered=registers_compactor(composition, kind),
    )


class AgentCache:
    """Agents per process, keyed by config digest and whether the compactor applies. An agent holds
    no run state (E2) and leases a corpus connection per run, so one instance serves concurrent jobs."""

    def __init__(
        self, *, signer: TagSigner, corpora_dir: Path, max_size: int = 64, embedders: EmbedderCache | None = None,
        tenant_corpora: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.signer, self.corpora_dir, self.max_size = signer, corpora_dir, max_size
        self.embedders = embedders or EmbedderCache()
        self.graphs = VectorIndexCache()
        self.corpora = CorpusPool(self.embedders, self.graphs)
        self.tenant_corpora = dict(tenant_corpora or {})  # GROUNDED_TENANT_CORPORA (H13)
        self._agents: OrderedDict[tuple[str, bool], BuiltAgent] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, config: JobConfig, kind: JobKind, *, tenant: str | None = None) -> BuiltAgent:
        """The agent for a job of `tenant`, whose corpora are checked on every job (H13): a cached
        agent is shared by every tenant whose config is the same, and must serve only those allowed."""
        if tenant is not None and self.tenant_corpora:
            available = corpora_for(tenant, self.tenant_corpora, known_corpora(self.corpora_dir))
            assert available is not None, "a worker sees what it serves"
            check_corpora(config.composition, available)
        key = (config.digest(), kind == "question")
        with self._lock:
            if key in self._agents:
                self._agents.move_to_end(key)
                return self._agents[key]
        built = build_agent(config, kind, signer=self.signer, corpora_dir=self.corpora_dir,
                            corpora=self.corpora)
        with self._lock:
            self._agents[key] = built
            while len(self._agents) > self.max_size:
                self._agents.popitem(last=False)
        return built
