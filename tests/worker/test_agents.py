"""JobConfig -> Agent: allowlisted capability types, corpora by name, H1/H2 composition, the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import SIGNER
from worker.jobs.composition import CompositionError, corpus_path, read_composition
from worker.jobs.models import JobConfig
from worker.runtime.agents import AgentCache, build_agent, evidence_request_limit

ALL_LISTED = {"agent": {"model": "extractive", "instructions": "Answer from the knowledge base.", "capabilities": [
    {"PassageSearchCapability": {"corpus": "handbook", "max_searches": 2}},
    "CitationPolicyCapability",
    "EvidenceCompactionCapability",
]}}


@pytest.fixture
def corpora(tmp_path: Path) -> Path:
    """Files named like corpora: building an agent resolves names without opening the files."""
    root = tmp_path / "corpora"
    root.mkdir()
    for name in ("handbook", "manual"):
        (root / f"{name}.sqlite").write_bytes(b"")
    return root


def capability_ids(agent: Any) -> set[str]:
    # pydantic-ai keeps an agent's capabilities on its root CombinedCapability (no public accessor in 2.68)
    return {c.id for c in agent._root_capability.capabilities if getattr(c, "id", None)}


def test_H1_compactor_only_for_multi_turn_jobs(corpora: Path) -> None:
    config = JobConfig.model_validate(ALL_LISTED)
    conversation = build_agent(config, "conversation", signer=SIGNER, corpora_dir=corpora)
    question = build_agent(config, "question", signer=SIGNER, corpora_dir=corpora)
    from capabilities.compaction import COMPACTOR_ID

    assert COMPACTOR_ID in capability_ids(conversation.agent) and conversation.compactor_registered
    assert COMPACTOR_ID not in capability_ids(question.agent) and not question.compactor_registered


def test_H2_policy_registered_iff_listed(corpora: Path) -> None:
    from capabilities.policy import POLICY_ID

    listed = build_agent(JobConfig.model_validate(ALL_LISTED), "question", signer=SIGNER, corpora_dir=corpora)
    unlisted_config = {"agent": {"model": "extractive",
                                 "capabilities": [{"PassageSearchCapability": {"corpus": "handbook"}}]}}
    unlisted = build_agent(JobConfig.model_validate(unlisted_config), "question", signer=SIGNER, corpora_dir=corpora)
    assert POLICY_ID in capability_ids(listed.agent) and listed.policy_registered
    assert POLICY_ID not in capability_ids(unlisted.agent) and not unlisted.policy_registered


def test_evidence_capabilities_get_the_spec_options_and_a_limit_under_the_run_limit(corpora: Path) -> None:
    built = build_agent(JobConfig.model_validate(ALL_LISTED), "question", signer=SIGNER, corpora_dir=corpora)
    [passages] = [c for c in built.agent._root_capability.capabilities if getattr(c, "namespace", None) == "passages"]
    assert built.namespaces == ("passages",)
    assert passages.max_searches == 2
    assert passages.request_limit == evidence_request_limit(12) < 12
    assert passages.state is None  # the registered instance holds no state (E2)


def test_reader_by_positional_corpus_name(corpora: Path) -> None:
    config = JobConfig.model_validate({"agent": {"model": "extractive",
                                                 "capabilities": [{"DocumentReaderCapability": "manual"}]}})
    assert build_agent(config, "question", signer=SIGNER, corpora_dir=corpora).namespaces == ("reader",)


def test_an_unknown_corpus_is_refused_with_the_known_names(corpora: Path) -> None:
    with pytest.raises(CompositionError, match="corpus 'atlas' is not served here; known: handbook, manual"):
        corpus_path(corpora, "atlas")
    config = JobConfig.model_validate({"agent": {"model": "extractive",
                                                 "capabilities": [{"PassageSearchCapability": "atlas"}]}})
    with pytest.raises(CompositionError, match="known: handbook, manual"):
        build_agent(config, "question", signer=SIGNER, corpora_dir=corpora)


def test_a_builtin_capability_type_is_not_accepted_even_though_pydantic_ai_knows_it() -> None:
    for name in ("WebFetch", "LocalWorkspace", "MCP"):
        with pytest.raises(ValueError, match=f"capability '{name}' is not allowed here"):
            JobConfig.model_validate({"agent": {"model": "extractive", "capabilities": [name]}})


def test_a_capability_entry_of_no_known_shape_says_which_part_is_missing() -> None:
    with pytest.raises(CompositionError) as refused:
        read_composition([{"PassageSearchCapability": "handbook", "CitationPolicyCapability": None}])
    assert str(refused.value).endswith("is not 'Name', {Name: {options}} or {Name: corpus}: name: Field required")


def test_agents_are_cached_per_config_digest_and_job_kind(corpora: Path) -> None:
    cache = AgentCache(signer=SIGNER, corpora_dir=corpora)
    config = JobConfig.model_validate(ALL_LISTED)
    same = JobConfig.model_validate(ALL_LISTED)
    assert cache.get(config, "question") is cache.get(same, "question")
    assert cache.get(config, "conversation") is not cache.get(config, "question")
